"""HF `tokenizer.json` <-> the pipeline's parts, with every stage read from and written back to its object.

    {"version": "1.0", "truncation", "padding", "added_tokens": [...], "normalizer", "pre_tokenizer",
     "post_processor", "decoder", "model": {"type": "BPE", ...}}

Reading refuses, naming it, any component or option scratchlm does not implement (a WordPiece or
Unigram model, a UnicodeScripts pre-tokenizer, BPE dropout, ...): a tokenizer either loads exactly or
not at all. `truncation` and `padding` are kept for export but not applied (transformers turns them
off too; pad and cut with the batching code instead). Writing reproduces HF's own serialization.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scratchlm.io_utils import atomic_write_text
from scratchlm.tokenizer import decoders, normalizers, post_processors, pre_tokenizers
from scratchlm.tokenizer.added_tokens import AddedToken, assign_ids
from scratchlm.tokenizer.bpe import BPE
from scratchlm.tokenizer.json_fields import UnsupportedTokenizerFeature

TOP_LEVEL = ("version", "truncation", "padding", "added_tokens", "normalizer", "pre_tokenizer", "post_processor",
             "decoder", "model")


@dataclass
class TokenizerParts:
    """The stages of one tokenizer (None = stage absent), as tokenizer.json lists them. `added_matching`
    picks how added tokens are found (added_tokens.MATCHING): HF's leftmost-longest scan, or llama.cpp's
    longest-first partition (GGUF vocabularies; tokenizer.json cannot say so)."""

    model: Any
    normalizer: Any = None
    pre_tokenizer: Any = None
    post_processor: Any = None
    decoder: Any = None
    added_tokens: list[AddedToken] = field(default_factory=list)
    truncation: Any = None
    padding: Any = None
    added_matching: str = "leftmost_longest"


def _model(d: Any) -> BPE:
    if not isinstance(d, dict):
        raise ValueError(f"tokenizer.json model must be an object, got {d!r}")
    kind = d.get("type", "BPE" if "merges" in d else None)
    if kind != "BPE":
        raise UnsupportedTokenizerFeature(
            f"tokenizer.json model type {kind!r} is not supported; scratchlm implements BPE models only "
            "(WordPiece, WordLevel and Unigram tokenizers cannot be loaded)")
    return BPE.from_json({k: v for k, v in d.items() if k != "type"} | {"type": "BPE"}, "model")


def parts_from_dict(d: Any) -> TokenizerParts:
    """Parse a tokenizer.json dict; ValueError (UnsupportedTokenizerFeature) naming anything unsupported."""
    if not isinstance(d, dict) or "model" not in d:
        raise ValueError("a tokenizer.json must be a JSON object with a 'model' (got "
                         f"{type(d).__name__}{' without model' if isinstance(d, dict) else ''})")
    if d.get("version", "1.0") != "1.0":
        raise UnsupportedTokenizerFeature(f"tokenizer.json version {d['version']!r} is unknown (expected '1.0')")
    norm = normalizers.from_json(d.get("normalizer"))
    model = _model(d["model"])
    added = [AddedToken.from_json(a, f"added_tokens[{n}]") for n, a in enumerate(d.get("added_tokens") or [])]
    return TokenizerParts(
        model=model, normalizer=norm, pre_tokenizer=pre_tokenizers.from_json(d.get("pre_tokenizer")),
        post_processor=post_processors.from_json(d.get("post_processor")), decoder=decoders.from_json(d.get("decoder")),
        added_tokens=assign_ids(added, model.vocab), truncation=d.get("truncation"), padding=d.get("padding"))


def parts_to_dict(p: TokenizerParts) -> dict:
    """The tokenizer.json dict of these parts (HF's field order)."""
    def js(x):
        return None if x is None else x.to_json()

    return {"version": "1.0", "truncation": p.truncation, "padding": p.padding,
            "added_tokens": [t.to_json() for t in sorted(p.added_tokens, key=lambda t: t.id)],
            "normalizer": js(p.normalizer), "pre_tokenizer": js(p.pre_tokenizer),
            "post_processor": js(p.post_processor), "decoder": js(p.decoder), "model": p.model.to_json()}


def read_tokenizer_json(path: str | Path) -> dict:
    """The dict in a tokenizer.json file, with clear errors for a missing or corrupt file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"tokenizer.json {path} does not exist")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path} is not valid JSON ({exc}); is the download complete?") from None


def write_tokenizer_json(d: dict, path: str | Path) -> None:
    """Write a tokenizer.json dict at `path` (atomic)."""
    atomic_write_text(path, json.dumps(d, ensure_ascii=False, indent=2) + "\n")
