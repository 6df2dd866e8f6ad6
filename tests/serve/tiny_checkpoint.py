"""A tiny servable checkpoint for the serve tests: a BPE tokenizer trained here + a small random model.

The weights are random with a wide init (init_std 0.5), so next-token logits are well separated and
greedy decoding does not hinge on float rounding (batched and alone give the same argmax).
"""

from __future__ import annotations

from pathlib import Path

import torch

from scratchlm.checkpoint import save_model
from scratchlm.config import get_preset
from scratchlm.model import TransformerLM
from scratchlm.tokenizer import DEFAULT_SPECIAL_TOKENS, Tokenizer, train_bpe

CONTEXT = 384


def build_tiny_checkpoint(directory: Path, corpus: Path, corpus_bytes: int = 40_000) -> Path:
    """Train a ~320-token BPE on the head of `corpus`, build a 2-layer model, save both to `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    text_path = directory.parent / "tiny_corpus.txt"
    text_path.write_bytes(corpus.read_bytes()[:corpus_bytes])
    vocab, merges = train_bpe(text_path, 320, DEFAULT_SPECIAL_TOKENS, num_workers=1)
    tok = Tokenizer(vocab, merges, DEFAULT_SPECIAL_TOKENS)
    tok.save(directory)
    torch.manual_seed(1234)
    config = get_preset("llama-tiny", vocab_size=tok.vocab_size, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2,
                        max_seq_len=CONTEXT, init_std=0.5)
    save_model(TransformerLM(config).eval(), directory)
    return directory
