"""Interop tests use tiny models: one torch thread is fastest and keeps the 2 shared cores from thrashing."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread):
    """Every interop test runs on one torch thread (the shared fixture in tests/conftest.py)."""
    yield


@pytest.fixture(scope="session")
def hf_tokenizer(shared_data):
    """A tiny Qwen2-style byte-level BPE `tokenizers.Tokenizer` with ChatML specials (gguf_helpers)."""
    from gguf_helpers import train_tiny_bpe

    return train_tiny_bpe(shared_data)
