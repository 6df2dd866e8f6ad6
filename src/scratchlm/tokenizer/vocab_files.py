"""Tokenizer files: our readable format, and GPT-2's original vocab.json + merges.txt.

Our format, three files in a directory (names chosen not to clash with a model checkpoint's
config.json / model.safetensors or HF's tokenizer.json, vocab.json, merges.txt):

    scratchlm_tokenizer.json   {"format": "scratchlm-bpe", "version": 1, "pattern": ..., "special_tokens": {...}}
    scratchlm_vocab.txt        one token per line: "<id>\\t<escaped token>"
    scratchlm_merges.txt       one merge per line, in rank order: "<escaped left>\\t<escaped right>"

Escaping keeps tokens readable and exact: valid UTF-8 printable text (space included) is written as
is; a backslash is "\\\\"; newline/tab/CR are "\\n", "\\t", "\\r"; every other byte (control chars,
partial UTF-8 sequences) is "\\xNN".
"""

from __future__ import annotations

import json
from pathlib import Path

import regex

from scratchlm.io_utils import atomic_write_text, read_json_object
from scratchlm.tokenizer.byte_level import GPT2_PATTERN, unicode_to_token

META_FILE, VOCAB_FILE, MERGES_FILE = "scratchlm_tokenizer.json", "scratchlm_vocab.txt", "scratchlm_merges.txt"
FORMAT_NAME, FORMAT_VERSION = "scratchlm-bpe", 1
_NAMED = {"\\": "\\\\", "\n": "\\n", "\t": "\\t", "\r": "\\r"}
_UNNAMED = {"\\": b"\\", "n": b"\n", "t": b"\t", "r": b"\r"}
_ESCAPE = regex.compile(r"\\(\\|n|t|r|x[0-9a-f]{2})")


def escape_token(token: bytes) -> str:
    """Readable, reversible text for token bytes (see module docstring)."""
    out = []
    for ch in token.decode("utf-8", errors="surrogateescape"):
        if ch in _NAMED:
            out.append(_NAMED[ch])
        elif 0xDC80 <= ord(ch) <= 0xDCFF:  # a byte that is not valid UTF-8 here
            out.append(f"\\x{ord(ch) - 0xDC00:02x}")
        elif ch.isprintable():
            out.append(ch)
        else:
            out.append("".join(f"\\x{b:02x}" for b in ch.encode("utf-8")))
    return "".join(out)


def unescape_token(text: str) -> bytes:
    """Inverse of `escape_token`."""
    parts, pos = [], 0
    for m in _ESCAPE.finditer(text):
        parts.append(text[pos:m.start()].encode("utf-8"))
        code = m.group(1)
        parts.append(bytes([int(code[1:], 16)]) if code[0] == "x" else _UNNAMED[code])
        pos = m.end()
    parts.append(text[pos:].encode("utf-8"))
    return b"".join(parts)


Parts = tuple[dict[int, bytes], list[tuple[bytes, bytes]], list[str]]  # vocab, merges, special tokens


def save_tokenizer(tok, directory: str | Path) -> None:
    """Write the three files of our format for `tok` (a scratchlm byte-level `Tokenizer`) into
    `directory` (created if needed), atomically each."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    meta = {"format": FORMAT_NAME, "version": FORMAT_VERSION, "pattern": GPT2_PATTERN,
            "vocab_size": tok.vocab_size, "special_tokens": tok.special_token_ids}
    atomic_write_text(d / META_FILE, json.dumps(meta, indent=2, ensure_ascii=False) + "\n")
    atomic_write_text(d / VOCAB_FILE, "".join(f"{i}\t{escape_token(t)}\n" for i, t in sorted(tok.vocab.items())))
    atomic_write_text(d / MERGES_FILE, "".join(f"{escape_token(a)}\t{escape_token(b)}\n" for a, b in tok.merges))


def _read_lines(path: Path) -> list[str]:
    if not path.is_file():
        raise FileNotFoundError(f"tokenizer file {path} is missing; save one with Tokenizer.save or `scratchlm tokenizer train`")
    return path.read_text(encoding="utf-8").split("\n")[:-1]


def load_tokenizer(directory: str | Path) -> Parts:
    """Read our format from `directory` -> (vocab, merges, specials); ValueError naming the file and
    line for malformed content."""
    d = Path(directory)
    meta_path = d / META_FILE
    if not meta_path.is_file():
        raise FileNotFoundError(
            f"no scratchlm tokenizer in {d} (missing {META_FILE}); train one with `scratchlm tokenizer train --out {d}`"
        )
    meta = read_json_object(meta_path, f"no scratchlm tokenizer in {d}")  # corrupt JSON: an error naming the file
    if meta.get("format") != FORMAT_NAME or meta.get("version") != FORMAT_VERSION:
        raise ValueError(f"{meta_path} is format {meta.get('format')!r} v{meta.get('version')}, expected {FORMAT_NAME!r} v{FORMAT_VERSION}")
    if meta.get("pattern") != GPT2_PATTERN:
        raise ValueError(f"{meta_path} uses pre-tokenization pattern {meta.get('pattern')!r}; only GPT-2's is supported")
    vocab: dict[int, bytes] = {}
    for n, line in enumerate(_read_lines(d / VOCAB_FILE), 1):
        i, sep, tok = line.partition("\t")
        if not sep or not i.isdigit():
            raise ValueError(f"{d / VOCAB_FILE} line {n}: expected '<id>\\t<token>', got {line!r}")
        vocab[int(i)] = unescape_token(tok)
    merges = []
    for n, line in enumerate(_read_lines(d / MERGES_FILE), 1):
        parts = line.split("\t")
        if len(parts) != 2:
            raise ValueError(f"{d / MERGES_FILE} line {n}: expected '<left>\\t<right>', got {line!r}")
        merges.append((unescape_token(parts[0]), unescape_token(parts[1])))
    specials = meta.get("special_tokens", {})
    for s, i in specials.items():
        if vocab.get(i) != s.encode("utf-8"):
            raise ValueError(f"{meta_path}: special token {s!r} has id {i} but the vocab holds {vocab.get(i)!r} there")
    return vocab, merges, list(specials)


def read_gpt2_files(vocab_json: str | Path, merges_txt: str | Path) -> Parts:
    """GPT-2's encoder.json (token in the byte->unicode alphabet -> id) and vocab.bpe ("left right" per
    line, an optional "#version" first line) -> (vocab, merges, specials); `<|endoftext|>` is special."""
    raw = json.loads(Path(vocab_json).read_text(encoding="utf-8"))
    vocab = {int(i): unicode_to_token(s, "vocab entry") if s != "<|endoftext|>" else s.encode() for s, i in raw.items()}
    merges = []
    for n, line in enumerate(Path(merges_txt).read_text(encoding="utf-8").split("\n"), 1):
        if not line or (n == 1 and line.startswith("#version")):
            continue
        parts = line.split(" ")
        if len(parts) != 2:
            raise ValueError(f"{merges_txt} line {n}: expected 'left right', got {line!r}")
        merges.append((unicode_to_token(parts[0], "merge part"), unicode_to_token(parts[1], "merge part")))
    specials = ["<|endoftext|>"] if "<|endoftext|>" in raw else []
    return vocab, merges, specials
