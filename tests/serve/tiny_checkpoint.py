"""A tiny servable checkpoint for the serve tests (and the test server's settings): a BPE tokenizer trained here + a small random model.

The weights are random with a wide init (init_std 0.5), so next-token logits are well separated and
greedy decoding does not hinge on float rounding (batched and alone give the same argmax).
"""

from __future__ import annotations

from pathlib import Path

import torch

from scratchlm.model_files import save_model
from scratchlm.config import get_preset
from scratchlm.model import TransformerLM
from scratchlm.tokenizer import DEFAULT_SPECIAL_TOKENS, Tokenizer, train_bpe

CONTEXT = 384
# settings of the test server (tests/serve/conftest.py starts it with these)
API_KEY = "test-key-123"
MODEL = "tiny"
MAX_BODY = 16384


def build_tiny_checkpoint(directory: Path, corpus: Path, corpus_bytes: int = 40_000, vocab_size: int = 320,
                          **model: object) -> Path:
    """Train a `vocab_size` BPE on the head of `corpus`, build a random model (default: 2 layers, D 64;
    `model` overrides llama-tiny fields), save both to `directory` (benchmarks/serve_load.py reuses it)."""
    directory.mkdir(parents=True, exist_ok=True)
    text_path = directory.parent / "tiny_corpus.txt"
    text_path.write_bytes(corpus.read_bytes()[:corpus_bytes])
    vocab, merges = train_bpe(text_path, vocab_size, DEFAULT_SPECIAL_TOKENS, num_workers=1)
    tok = Tokenizer(vocab, merges, DEFAULT_SPECIAL_TOKENS)
    tok.save(directory)
    torch.manual_seed(1234)
    shape = {"d_model": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "max_seq_len": CONTEXT, "init_std": 0.5,
             **model}
    config = get_preset("llama-tiny", vocab_size=tok.vocab_size, **shape)
    save_model(TransformerLM(config).eval(), directory)
    return directory
