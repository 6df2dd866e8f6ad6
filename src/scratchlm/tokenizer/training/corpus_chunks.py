"""Streaming, parallel pre-token counting for BPE training.

The corpus files are cut into chunks of about `chunk_bytes` at positions where cutting cannot change
the pre-tokens: the start of a special token (preferred) or, in a stretch without specials, right
after a newline between two chars that are surely not whitespace (letters, numbers, visible ASCII:
``x\\nY``), since the GPT-2 regex always ends a pre-token before and after such a newline. Only byte
offsets are computed here, reading a small window at a time; each worker process reads, decodes and
counts its own chunk, so memory stays
bounded by (workers x chunk) plus the table of distinct pre-tokens, whatever the corpus size
(a chunk only grows past `chunk_bytes` while no exact cut exists, e.g. a file on a single line).
"""

from __future__ import annotations

import multiprocessing
import os
from collections import Counter
from functools import lru_cache
from pathlib import Path
from typing import Iterator

import regex
from tqdm import tqdm

from scratchlm.tokenizer.training.special_split import pretokenize, special_regex, split_on_specials
from scratchlm.tokenizer.text_io import decode_utf8

WINDOW_BYTES = 1 << 16


def _solid(ch: str) -> bool:
    """A char that is surely not whitespace for the GPT-2 regex: a letter, a number or visible ASCII."""
    return len(ch) == 1 and (ch.isalnum() or "!" <= ch <= "~")


def _safe_newline_at(buf: bytes, i: int) -> bool:
    """True if buf[i] is a newline between two `_solid` chars, so a cut at i + 1 is exact."""
    if i < 1 or i + 1 >= len(buf):
        return False
    start = i - 1
    while start > max(0, i - 4) and buf[start] & 0xC0 == 0x80:  # back to the lead byte of the previous char
        start -= 1
    lead = buf[i + 1]
    width = 1 if lead < 0x80 else 2 if lead < 0xE0 else 3 if lead < 0xF0 else 4
    prev = buf[start:i].decode("utf-8", errors="replace")
    nxt = buf[i + 1:i + 1 + width].decode("utf-8", errors="replace")
    return _solid(prev) and _solid(nxt) and "\ufffd" not in prev + nxt


@lru_cache(maxsize=8)
def _specials_re(special_tokens: tuple[str, ...]) -> regex.Pattern | None:
    return special_regex(special_tokens)


def _crossed(buf: bytes, p: int, specials: list[bytes]) -> bool:
    """True if an occurrence of some special starts before offset p and ends after it."""
    for s in specials:
        q = buf.find(s, max(0, p - len(s) + 1), p + len(s) - 1)
        if q != -1 and q < p:
            return True
    return False


def _cut_in(buf: bytes, start: int, stop: int, specials: list[bytes]) -> int | None:
    """The first exact cut in buf[start:stop]: a special token start, else a safe newline."""
    best = None
    for s in specials:
        q = buf.find(s, start, stop + len(s) - 1)
        while q != -1 and q < stop and _crossed(buf, q, specials):
            q = buf.find(s, q + 1, stop + len(s) - 1)
        if q != -1 and q < stop and (best is None or q < best):
            best = q
    if best is not None:
        return best
    i = buf.find(b"\n", max(0, start - 1), stop - 1)
    while i != -1:
        if _safe_newline_at(buf, i) and not _crossed(buf, i + 1, specials):
            return i + 1
        i = buf.find(b"\n", i + 1, stop - 1)
    return None


def _next_cut(f, target: int, size: int, specials: list[bytes]) -> int:
    """Smallest exact cut >= target, reading WINDOW_BYTES (+ context) at a time; `size` if none."""
    ctx = max((len(s) for s in specials), default=1) + 4  # room for a 4-byte char around a newline
    pos = target
    while pos < size:
        lo = max(0, pos - ctx)
        f.seek(lo)
        buf = f.read(pos - lo + WINDOW_BYTES + ctx)
        cut = _cut_in(buf, pos - lo, pos - lo + WINDOW_BYTES, specials)
        if cut is not None:
            return lo + cut
        pos += WINDOW_BYTES
    return size


def chunk_bounds(path: Path, special_tokens: tuple[str, ...], chunk_bytes: int) -> Iterator[tuple[int, int]]:
    """Yield (start, end) byte ranges covering `path`, each about `chunk_bytes`, cut exactly."""
    specials = [s.encode("utf-8") for s in special_tokens]
    size = path.stat().st_size
    with open(path, "rb") as f:
        start = 0
        while start < size:
            end = _next_cut(f, start + chunk_bytes, size, specials)
            yield start, end
            start = end


def count_chunk(task: tuple[str, int, int, tuple[str, ...], str]) -> tuple[dict[bytes, int], int]:
    """Worker: pre-token counts of one chunk, keys as UTF-8 bytes; returns (counts, chunk bytes)."""
    path, start, end, special_tokens, errors = task
    with open(path, "rb") as f:
        f.seek(start)
        data = f.read(end - start)
    text = decode_utf8(data, path, start, errors, "pass errors='replace' (CLI: --errors replace)")
    counts: Counter[str] = Counter()
    for piece, is_special in split_on_specials(text, _specials_re(special_tokens)):
        if not is_special:
            counts.update(pretokenize(piece))
    return {k.encode("utf-8"): v for k, v in counts.items()}, end - start


def count_pretokens(
    paths: list[Path],
    special_tokens: tuple[str, ...],
    *,
    num_workers: int | None = None,
    chunk_bytes: int | None = None,
    errors: str = "strict",
    progress: bool = False,
) -> dict[bytes, int]:
    """Count GPT-2 pre-tokens over all files (specials excluded), in parallel over exact chunks."""
    total = sum(p.stat().st_size for p in paths)
    workers = max(1, num_workers if num_workers is not None else (os.cpu_count() or 1))
    if chunk_bytes is None:
        chunk_bytes = min(max(total // (4 * workers), 1 << 18), 1 << 24)
    if chunk_bytes <= 0:
        raise ValueError(f"chunk_bytes must be positive, got {chunk_bytes}")
    tasks = ((str(p), s, e, special_tokens, errors) for p in paths for s, e in chunk_bounds(p, special_tokens, chunk_bytes))
    counts: Counter[bytes] = Counter()
    with tqdm(total=total, unit="B", unit_scale=True, desc="pre-tokenize", disable=not progress) as bar:
        if workers == 1 or total <= chunk_bytes:
            results = map(count_chunk, tasks)
            for part, n in results:
                counts.update(part)
                bar.update(n)
        else:
            with multiprocessing.get_context().Pool(workers) as pool:
                for part, n in pool.imap_unordered(count_chunk, tasks):
                    counts.update(part)
                    bar.update(n)
    return dict(counts)
