"""Evaluation: perplexity, accuracy of generated answers (graded, pass@k), multiple choice by log-likelihood."""
