"""scratchlm's own tokenizers as a pipeline: byte-level BPE with GPT-2's pre-tokenization.

`train_bpe` produces `vocab` (id -> bytes) and `merges` ((bytes, bytes) in rank order); with special
tokens they become the HF pipeline
    pre-tokenizer ByteLevel(add_prefix_space=False, use_regex=True)   (the GPT-2 regex)
    model         BPE over the vocab written in GPT-2's byte alphabet
    added tokens  the specials (special=True, never normalized or stripped)
    decoder       ByteLevel
A special already in `vocab` (same bytes) keeps its id; otherwise it gets the next free id.
"""

from __future__ import annotations

from scratchlm.tokenizer.added_tokens import AddedToken
from scratchlm.tokenizer.bpe import BPE
from scratchlm.tokenizer.byte_level import ByteLevel, token_to_unicode
from scratchlm.tokenizer.hf_json import TokenizerParts


def _check_vocab(vocab: dict[int, bytes]) -> None:
    for i, t in vocab.items():
        if not isinstance(i, int) or i < 0:
            raise ValueError(f"vocab id {i!r} must be a non-negative int")
        if not isinstance(t, bytes) or not t:
            raise ValueError(f"vocab[{i}] = {t!r} must be non-empty bytes")


def _specials(vocab: dict[int, bytes], special_tokens: list[str]) -> dict[str, int]:
    """special -> id: its id in `vocab` when there (the highest such id), else the next free id."""
    by_bytes = {t: i for i, t in sorted(vocab.items(), reverse=True)}
    out: dict[str, int] = {}
    top = max(vocab, default=-1)
    for s in special_tokens:
        if not isinstance(s, str) or not s:
            raise ValueError(f"special token {s!r} must be a non-empty string (e.g. '<|endoftext|>')")
        if s in out:
            continue
        i = by_bytes.get(s.encode("utf-8"))
        if i is None:
            top += 1
            i = top
        out[s] = i
    return out


def gpt2_style_parts(vocab: dict[int, bytes], merges: list[tuple[bytes, bytes]],
                     special_tokens: list[str] | None = None) -> TokenizerParts:
    """The pipeline of a byte-level BPE (see module docstring); ValueError for a malformed vocab."""
    _check_vocab(vocab)
    specials = _specials(vocab, list(special_tokens or []))
    special_ids = set(specials.values())
    ids: dict[bytes, int] = {}
    for i, t in sorted(vocab.items()):
        if i not in special_ids and ids.setdefault(t, i) != i:
            raise ValueError(f"vocab ids {ids[t]} and {i} both hold {t!r}; ordinary tokens must be unique")
    missing = [b for b in range(256) if bytes([b]) not in ids]
    if missing:
        raise ValueError(f"vocab lacks single-byte tokens {missing[:8]}...; byte-level BPE needs all 256 bytes")
    model_vocab = {token_to_unicode(t): i for t, i in ids.items()}
    for s, i in specials.items():
        if i in vocab:
            model_vocab.setdefault(token_to_unicode(vocab[i]), i)
    str_merges = [(token_to_unicode(bytes(a)), token_to_unicode(bytes(b))) for a, b in merges]
    added = [AddedToken(s, i, special=True) for s, i in specials.items()]
    return TokenizerParts(model=BPE(model_vocab, str_merges), pre_tokenizer=ByteLevel(False, True, True),
                          decoder=ByteLevel(False, True, True), added_tokens=added)
