"""Plots that explain the model: RoPE long-term decay, attention maps, loss curves, sampling filters."""
