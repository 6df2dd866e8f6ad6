"""Unicode normalization forms (NFC, NFD, NFKC, NFKD) that keep each output char's input span, aligned
the way HF `tokenizers` aligns them.

HF runs the normalization as a stream of (char, change) pairs (the unicode-normalization-alignments
crate) and maps the pairs back onto the input by position:

    decompose    each input char -> its full decomposition: the first char replaces it (change 0),
                 the others are inserted (change +1)
    reorder      each run of combining marks sorted (stably) by canonical combining class; the changes
                 travel with their chars
    compose      (NFC / NFKC) a char that composes with the last starter is dropped and the starter
                 takes the composite: change(starter) += change(dropped) - 1
    align        walking the input with a cursor i: change <= 0 -> span of input char i, then
                 i += 1 - change (the chars it swallowed); change > 0 (inserted) -> span of input char i-1

So "é" decomposed gives "e" + U+0301, both pointing at "é"; "e" + U+0301 composed gives "é" pointing at
"e"; a composition-excluded "שּׁ" (U+FB2C) decomposes under NFC into three chars that all point at it.
The text itself is `unicodedata.normalize(form, text)`, except around the chars newer than HF's tables:
73 that HF leaves as they are (unicode_props.HF_UNNORMALIZED) and 98 marks it gives combining class 0
(HF_UNKNOWN_MARKS).
"""

from __future__ import annotations

import unicodedata

from scratchlm.tokenizer.unicode_props import HF_UNKNOWN_MARKS, HF_UNNORMALIZED

Span = tuple[int, int]


def _ccc(ch: str) -> int:
    """The canonical combining class in HF's tables (0 for marks they predate)."""
    cc = unicodedata.combining(ch)
    return 0 if cc and HF_UNKNOWN_MARKS.match(ch) else cc


def _decomposed(text: str, form: str) -> list[list]:
    """[char, change] for the full (canonical or compatibility) decomposition, canonically reordered."""
    dform = "NFD" if form in ("NFC", "NFD") else "NFKD"
    out: list[list] = []
    for ch in text:
        d = ch if HF_UNNORMALIZED.match(ch) else unicodedata.normalize(dform, ch)
        out.append([d[0], 0])
        out.extend([c, 1] for c in d[1:])
    i = 0
    while i < len(out):
        if _ccc(out[i][0]) == 0:
            i += 1
            continue
        j = i
        while j < len(out) and _ccc(out[j][0]) != 0:
            j += 1
        out[i:j] = sorted(out[i:j], key=lambda p: _ccc(p[0]))
        i = j
    return out


def _composed(seq: list[list]) -> list[list]:
    """Canonical composition of a decomposed [char, change] sequence: a char composes with the last
    starter unless a char between them has a combining class >= its own (or is a starter)."""
    out: list[list] = []
    starter, last_cc = None, 0
    for ch, change in seq:
        cc = _ccc(ch)
        adjacent = starter is not None and starter == len(out) - 1
        if starter is not None and (last_cc < cc or (cc == 0 and adjacent)):
            composite = unicodedata.normalize("NFC", out[starter][0] + ch)
            if len(composite) == 1 and not HF_UNNORMALIZED.match(composite):
                out[starter] = [composite, out[starter][1] + change - 1]
                continue
        if cc == 0:
            starter = len(out)
        last_cc = cc
        out.append([ch, change])
    return out


def normalize_aligned(text: str, form: str, spans: list[Span]) -> tuple[str, list[Span]]:
    """(normalized text, the input span of each of its chars); `spans` holds the spans of text's chars."""
    seq = _decomposed(text, form)
    if form in ("NFC", "NFKC"):
        seq = _composed(seq)
    out = "".join(c for c, _ in seq)
    expected = unicodedata.normalize(form, text)
    newer = HF_UNNORMALIZED.search(text + expected) or HF_UNKNOWN_MARKS.search(text)
    if out != expected and not newer:  # never another text than unicodedata's, but where HF's tables differ
        out = expected
        return out, [spans[min(j, len(spans) - 1)] for j in range(len(out))]
    new: list[Span] = []
    i = 0
    for _, change in seq:
        if change > 0:
            new.append(spans[max(i - 1, 0)])
        else:
            new.append(spans[min(i, len(spans) - 1)])
            i += 1 - change
    return out, new
