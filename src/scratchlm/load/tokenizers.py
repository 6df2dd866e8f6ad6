"""The tokenizer of a model path: a directory's tokenizer files, or a GGUF file's metadata.

Either way the result is scratchlm's own Tokenizer with the model's chat template and special tokens
attached (`tokenizer.chat_template`, `tokenizer.special_tokens_map`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from scratchlm.interop.gguf.tokenizer_metadata import pretrained_from_gguf
from scratchlm.tokenizer import Tokenizer
from scratchlm.tokenizer.hf_files import load_pretrained_tokenizer
from scratchlm.tokenizer.pipeline import TOKENIZER_JSON
from scratchlm.tokenizer.vocab_files import META_FILE


def _no_tokenizer(directory: Path) -> FileNotFoundError:
    return FileNotFoundError(
        f"{directory} holds no tokenizer (neither {TOKENIZER_JSON} nor scratchlm's {META_FILE}); copy the "
        "model's tokenizer.json (+ tokenizer_config.json) into it, pass --tokenizer DIR, or for a model you "
        f"trained yourself, train one with `scratchlm tokenizer train --out {directory}`")


def load_tokenizer_dir(directory: str | Path, prefer_hf: bool = True) -> Tokenizer:
    """The tokenizer in a model directory: tokenizer.json (HF) or scratchlm's files, whichever is there,
    with the directory's chat template and special tokens attached (tokenizer.chat_template)."""
    directory = Path(directory)
    if not (directory / TOKENIZER_JSON).is_file() and not (directory / META_FILE).is_file():
        raise _no_tokenizer(directory)
    return load_pretrained_tokenizer(directory, prefer_hf=prefer_hf).tokenizer


def gguf_tokenizer(metadata: dict[str, Any]) -> Tokenizer:
    """The tokenizer a GGUF file describes (byte-level BPE or llama.cpp's SentencePiece), with its chat
    template and special tokens attached."""
    return pretrained_from_gguf(metadata).tokenizer


def template_source(tokenizer: Any) -> str | None:
    """The Jinja source of the chat template the tokenizer loaders attached (None: scratchlm's ChatML)."""
    template = getattr(tokenizer, "chat_template", None)
    return template.source if template is not None else None


def special_token_id(tokenizer: Any, text: str) -> int | None:
    """The id of special token `text` in the tokenizer, or None."""
    return (getattr(tokenizer, "special_token_ids", None) or {}).get(text)
