"""HF `tokenizer.json` import/export for byte-level BPE (the GPT-2 layout of HF `tokenizers`).

Export: model BPE (vocab and merges in GPT-2's byte->unicode alphabet, no unk, no dropout), pre-tokenizer
ByteLevel(add_prefix_space=False, use_regex=True) (the GPT-2 regex), ByteLevel decoder, and each
special token as an added token (special=True, never normalized or stripped).
Import accepts the same layout (merges as "a b" strings or [a, b] pairs); anything that would change
the ids (a normalizer, a prefix space, byte fallback, other pre-tokenizers) is refused with a clear error.
"""

from __future__ import annotations

import json
from pathlib import Path

from scratchlm.io_utils import atomic_write_text
from scratchlm.tokenizer.bpe import Tokenizer
from scratchlm.tokenizer.pretokenize import token_to_unicode, unicode_to_token

_BYTE_LEVEL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}


def to_hf_dict(tok: Tokenizer) -> dict:
    """The tokenizer.json content as a dict."""
    vocab: dict[str, int] = {}
    for i, t in sorted(tok.vocab.items()):
        key = token_to_unicode(t)
        if vocab.setdefault(key, i) != i:
            raise ValueError(f"ids {vocab[key]} and {i} both hold {t!r}; tokenizer.json needs unique tokens")
    added = [
        {"id": i, "content": s, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False, "special": True}
        for s, i in sorted(tok.special_token_ids.items(), key=lambda kv: kv[1])
    ]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": dict(_BYTE_LEVEL),
        "post_processor": None,
        "decoder": dict(_BYTE_LEVEL),
        "model": {
            "type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
            "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
            "vocab": vocab,
            "merges": [[token_to_unicode(a), token_to_unicode(b)] for a, b in tok.merges],
        },
    }


def save_hf_tokenizer_json(tok: Tokenizer, path: str | Path) -> None:
    """Write `tok` as an HF tokenizer.json at `path` (atomic)."""
    atomic_write_text(path, json.dumps(to_hf_dict(tok), ensure_ascii=False, indent=1) + "\n")


def _check_layout(cfg: dict, path: Path) -> None:
    model = cfg.get("model") or {}
    if model.get("type") != "BPE":
        raise ValueError(f"{path}: model type {model.get('type')!r} is not BPE; only byte-level BPE can be imported")
    for key in ("byte_fallback", "ignore_merges"):
        if model.get(key):
            raise ValueError(f"{path}: model.{key}=true changes encoding; only plain byte-level BPE is supported")
    for key in ("continuing_subword_prefix", "end_of_word_suffix"):
        if model.get(key):
            raise ValueError(f"{path}: model.{key}={model[key]!r} is not byte-level BPE (expected none)")
    if cfg.get("normalizer") is not None:
        raise ValueError(f"{path}: a normalizer ({cfg['normalizer'].get('type')}) is not supported; expected null")
    pre = cfg.get("pre_tokenizer") or {}
    if pre.get("type") == "Sequence" and len(pre.get("pretokenizers", [])) == 1:
        pre = pre["pretokenizers"][0]
    if pre.get("type") != "ByteLevel" or pre.get("add_prefix_space") or not pre.get("use_regex", True):
        raise ValueError(
            f"{path}: pre_tokenizer {json.dumps(pre)} is not ByteLevel(add_prefix_space=false, use_regex=true) "
            "(GPT-2's); other pre-tokenizers are not supported"
        )


def load_hf_tokenizer_json(path: str | Path, *, impl: str = "reference") -> Tokenizer:
    """Read an HF byte-level BPE tokenizer.json; every added token becomes a special token."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"tokenizer.json {path} does not exist")
    cfg = json.loads(path.read_text(encoding="utf-8"))
    _check_layout(cfg, path)
    added = {a["content"]: int(a["id"]) for a in cfg.get("added_tokens", [])}
    vocab: dict[int, bytes] = {}
    for s, i in cfg["model"]["vocab"].items():
        if int(i) not in added.values():
            vocab[int(i)] = unicode_to_token(s, "vocab entry")
    for s, i in added.items():
        vocab[i] = s.encode("utf-8")
    merges = []
    for n, m in enumerate(cfg["model"]["merges"]):
        parts = m.split(" ") if isinstance(m, str) else m
        if len(parts) != 2:
            raise ValueError(f"{path}: merge #{n} {m!r} is not a pair")
        merges.append((unicode_to_token(parts[0], "merge part"), unicode_to_token(parts[1], "merge part")))
    return Tokenizer(vocab, merges, list(added), impl=impl)
