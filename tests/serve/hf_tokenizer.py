"""A transformers tokenizer built from a scratchlm tokenizer's files on disk (no scratchlm code involved), to
render chat templates with transformers' own `apply_chat_template` as the reference for the server's prompts.

The files (documented in scratchlm/tokenizer/vocab_files.py) are read here by hand: `scratchlm_vocab.txt`
("<id>\\t<escaped token>"), `scratchlm_merges.txt` ("<escaped left>\\t<escaped right>", rank order) and
`scratchlm_tokenizer.json` (special tokens). The HF side is GPT-2's byte-level BPE: tokens spelled in
GPT-2's byte->unicode alphabet, the ByteLevel pre-tokenizer with its built-in GPT-2 regex, specials added whole.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast
from transformers.convert_slow_tokenizer import bytes_to_unicode

_ESCAPES = re.compile(r"\\(\\|n|t|r|x[0-9a-f]{2})")
_NAMED = {"\\": b"\\", "n": b"\n", "t": b"\t", "r": b"\r"}
_BYTE_TO_CHAR = bytes_to_unicode()


def _token_bytes(escaped: str) -> bytes:
    out, pos = b"", 0
    for m in _ESCAPES.finditer(escaped):
        code = m.group(1)
        out += escaped[pos:m.start()].encode("utf-8") + (bytes([int(code[1:], 16)]) if code[0] == "x" else _NAMED[code])
        pos = m.end()
    return out + escaped[pos:].encode("utf-8")


def _spelled(token: bytes) -> str:
    return "".join(_BYTE_TO_CHAR[b] for b in token)


def hf_tokenizer(directory: Path, chat_template: str | None = None) -> PreTrainedTokenizerFast:
    """transformers' fast tokenizer for the scratchlm tokenizer saved in `directory`."""
    specials = json.loads((directory / "scratchlm_tokenizer.json").read_text(encoding="utf-8"))["special_tokens"]
    vocab = {}
    for line in (directory / "scratchlm_vocab.txt").read_text(encoding="utf-8").split("\n")[:-1]:
        i, token = line.split("\t", 1)
        vocab[_spelled(_token_bytes(token))] = int(i)
    merges = [tuple(_spelled(_token_bytes(part)) for part in line.split("\t"))
              for line in (directory / "scratchlm_merges.txt").read_text(encoding="utf-8").split("\n")[:-1]]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    assert all(tok.token_to_id(s) == i for s, i in specials.items()), specials
    return PreTrainedTokenizerFast(tokenizer_object=tok, chat_template=chat_template)
