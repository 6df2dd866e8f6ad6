"""Fixtures for training tests: a small learnable token file and a tiny run config."""

from __future__ import annotations

import numpy as np
import pytest

from scratchlm.data.token_file import write_token_file
from scratchlm.train.train_config import TrainConfig

TINY_MODEL = {"d_model": 32, "n_layers": 2, "n_heads": 2, "n_kv_heads": 1, "max_seq_len": 16}


def make_tokens(path, n: int = 6000, vocab: int = 64, seed: int = 0) -> str:
    """A learnable stream: a repeating 0..49 ramp with 10% random tokens mixed in."""
    rng = np.random.default_rng(seed)
    ids = np.tile(np.arange(50), n // 50 + 1)[:n]
    noise = rng.random(n) < 0.1
    ids[noise] = rng.integers(0, vocab, noise.sum())
    write_token_file(path, [ids], vocab)
    return str(path)


def tiny_config(tmp_path, **overrides) -> TrainConfig:
    base = TrainConfig(
        model=dict(TINY_MODEL), train_data=str(tmp_path / "train.bin"), out_dir=str(tmp_path / "run"),
        batch_size=4, seq_len=16, max_steps=20, warmup_steps=3, lr=1e-2, min_lr=1e-3, eval_interval=10,
        eval_batches=2, ckpt_interval=10, log_interval=1, peak_gflops=1.0, progress=False,
    )
    return base.with_overrides(overrides)


@pytest.fixture
def tokens(tmp_path) -> str:
    return make_tokens(tmp_path / "train.bin")


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread):
    """Every training test runs on one torch thread (see tests/conftest.py)."""
    yield
