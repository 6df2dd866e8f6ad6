"""Byte-level BPE tokenizer: training (`train_bpe`), encoding/decoding (`Tokenizer`), file formats
(ours, GPT-2's, HF tokenizer.json), a tiktoken fast path and the ChatML chat template."""

from scratchlm.tokenizer.bpe import Tokenizer
from scratchlm.tokenizer.bpe_train import train_bpe
from scratchlm.tokenizer.chat_template import DEFAULT_SPECIAL_TOKENS, render_chat

__all__ = ["Tokenizer", "train_bpe", "render_chat", "DEFAULT_SPECIAL_TOKENS"]
