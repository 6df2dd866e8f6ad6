"""Fast path: pre-tokenizer + BPE of a byte-level tokenizer run by `tiktoken`, with the same ids.

tiktoken splits text with a regex, looks each piece up whole, and otherwise merges, inside the piece,
the adjacent pair whose concatenation has the lowest rank. With rank = token id this is HF's BPE when
  * the pre-tokenizer is GPT-2's ByteLevel regex, or Split(regex, Isolated) + ByteLevel(use_regex=false)
    with a regex tiktoken splits identically (patterns.NEWLINE_SAFE: GPT-2, Llama-3, Qwen2);
  * the model is plain byte-level BPE (no byte_fallback, unk, prefix or suffix);
  * token ids grow with merge rank, and every token is a byte or a merge result (check_rank_order);
  * merging by concatenation rank changes nothing: either ignore_merges=True (HF does the same whole-piece
    lookup) and every split of a token into two tokens is a merge (check_all_splits_merge: vocabularies
    converted from tiktoken ranks, as Llama-3's, are built so), or ignore_merges=False and every token is
    what the merges make of its own bytes (check_closure: BPE-trained vocabularies, as GPT-2's).
Special/added tokens never reach tiktoken (the pipeline cuts them out first). A vocabulary without
some single bytes (SmolLM2 lacks 21) is fine: text containing a char that needs a missing byte is
encoded by the reference path instead (HF drops such chars; tiktoken would fail).
"""

from __future__ import annotations

from typing import Any, Callable

from scratchlm.tokenizer.byte_level import bytes_to_unicode, is_byte_level_text, unicode_to_token
from scratchlm.tokenizer.patterns import NEWLINE_SAFE
from scratchlm.tokenizer.stream_encode import split_pattern


def _refuse(why: str) -> ValueError:
    return ValueError(f"the tiktoken fast path cannot give this tokenizer's ids: {why}; use impl='reference'")


def check_model(model: Any) -> None:
    """ValueError unless the BPE model is plain byte-level BPE."""
    for name, value in (("byte_fallback", model.byte_fallback), ("unk_token", model.unk_token),
                        ("continuing_subword_prefix", model.prefix), ("end_of_word_suffix", model.suffix)):
        if value:
            raise _refuse(f"model.{name}={value!r}")


def check_rank_order(model: Any, skip: set[int]) -> None:
    """ValueError unless each merge's result id is above the previous merges' (first occurrences), and
    every token outside `skip` (added tokens) is a single byte or some merge's result."""
    last, seen = -1, set()
    for rank, (a, b) in enumerate(model.merges):
        i = model.vocab[a + b]
        if i in seen:
            continue
        if i <= last:
            raise _refuse(f"merge #{rank} {a + b!r} has id {i}, not above the previous merge's id {last} "
                          "(tiktoken needs ids in merge order, as train_bpe, GPT-2 and HF BpeTrainer make them)")
        seen.add(i)
        last = i
    stray = [i for s, i in model.vocab.items() if i not in seen and i not in skip and len(s) > 1]
    if stray:
        raise _refuse(f"tokens {stray[:5]} are neither bytes nor merge results")


def check_closure(model: Any, skip: set[int]) -> None:
    """ValueError unless BPE of every token's own bytes is that token (so tiktoken's whole-piece lookup
    agrees with HF's merges when ignore_merges is off)."""
    for s, i in model.vocab.items():
        if len(s) > 1 and i not in skip and model.merge_symbols(s) != [i]:
            raise _refuse(f"token {i} ({s!r}) is not what the merges make of its own bytes")


def check_all_splits_merge(model: Any, skip: set[int]) -> None:
    """ValueError unless every way to write a token as two tokens is a merge (tiktoken joins any adjacent
    pair whose concatenation is a token; HF only listed merges)."""
    vocab, table = model.vocab, model._merges
    for s, i in vocab.items():
        if i in skip:
            continue
        for k in range(1, len(s)):
            a, b = vocab.get(s[:k]), vocab.get(s[k:])
            if a is not None and b is not None and (a, b) not in table:
                raise _refuse(f"token {i} ({s!r}) is the concatenation of tokens {a} and {b}, which is not a merge")


def present_bytes(model: Any) -> bytes | None:
    """The byte values the vocab has single tokens for, or None when it has all 256."""
    alphabet = bytes_to_unicode()
    present = bytes(b for b in range(256) if alphabet[b] in model.vocab)
    return None if len(present) == 256 else present


class TiktokenEncoder:
    """encode(text) of ordinary text (no added tokens) through tiktoken, or `fallback` when guarded."""

    def __init__(self, encoding: Any, present: bytes | None, fallback: Callable[[str], list[int]]) -> None:
        self.encoding, self.present, self.fallback = encoding, present, fallback

    def encode(self, text: str) -> list[int]:
        if self.present is not None and text.encode("utf-8").translate(None, self.present):
            return self.fallback(text)  # some byte of the text has no token: HF's rule, from scratch
        return self.encoding.encode_ordinary(text)


def tiktoken_encoder(tok: Any) -> TiktokenEncoder:
    """The fast encoder for `tok` (a pipeline Tokenizer), or ValueError saying why it cannot be exact."""
    try:
        import tiktoken
    except ImportError:
        raise ValueError("impl='tiktoken' needs the tiktoken package: pip install -e '.[fast]' (tiktoken==0.14.0)") from None
    pattern = split_pattern(tok)
    if pattern not in NEWLINE_SAFE:
        raise _refuse(f"pre-tokenizer {tok.pre_tokenizer and tok.pre_tokenizer.to_json()} is not a tested "
                      "GPT-2 / Llama-3 / Qwen2 regex split with ByteLevel")
    model = tok.model
    check_model(model)
    added = set(tok.added.by_id)
    check_rank_order(model, added)
    if model.ignore_merges:
        check_all_splits_merge(model, added)
    else:
        check_closure(model, added)
    ranks = {unicode_to_token(s): i for s, i in model.vocab.items() if i not in added and is_byte_level_text(s)}
    enc = tiktoken.Encoding(f"scratchlm-{len(ranks)}", pat_str=pattern, mergeable_ranks=ranks, special_tokens={})
    return TiktokenEncoder(enc, present_bytes(model), tok.encode_words)
