"""Pretraining: losses, AdamW, LR schedules, gradient clipping, checkpoints, the training loop, DDP."""
