"""Character classes as HF `tokenizers` (Rust) defines them, which differ from Python's str methods.

    whitespace   Unicode White_Space (Rust `char::is_whitespace`; Python's isspace() also takes
                 U+001C..U+001F)
    numeric      general category Nd, Nl or No (Rust `char::is_numeric`; Python's isnumeric() also
                 takes CJK numerals such as "一"), with Rust's own Unicode tables (not Oniguruma's)
    punctuation  ASCII punctuation (which includes symbols like $ + < = > ^ ` | ~) or category P* as
                 the `unicode_categories` crate (Unicode 9-era tables) has it: the 140 chars that
                 became P* since (U+061D, U+2E43.., new scripts) are not punctuation to HF, U+166D and
                 U+111C9 (P* then, So now) are
    word         Rust regex `\\w`: Alphabetic, marks, decimal digits, connector punctuation, Join_Control

Regex engines' Unicode versions differ too: HF's Oniguruma and tiktoken's Rust regex use Unicode 15.1
tables, Python's `regex` module a newer Unicode. The 17,810 chars assigned since (Unicode 16.0 / 17.0:
CJK extension J, new scripts, ...) are unassigned (\\p{Cn}) to them, so a \\p{L}+ run stops there.
`as_regex_engines_see` rewrites those chars to U+0378 (unassigned in every version) before a split
regex runs; pieces are cut from the original text, so only the cut points change.
"""

from __future__ import annotations

import regex

WORD_CLASS = r"[\p{Alphabetic}\p{M}\p{Nd}\p{Pc}\p{Join_Control}]"
# the same classes as single-char regexes (a regex scans a string much faster than a Python loop)
WHITESPACE_CLASS = r"\p{White_Space}"
# Rust's char::is_numeric (HF's Digits) does not yet take these numbers (measured, as below)
NUMERIC_CLASS = r"(?V1)[[\p{Nd}\p{Nl}\p{No}]--[" + r"\U0001246F\U00012475-\U0001247F\U00012550-\U00012686" + "]]"
# P* chars that HF's Punctuation pre-tokenizer does not take, and two it takes (measured over every code point against
# tokenizers 0.23; tests/tokenizer/test_unicode_versions.py checks it)
_NEWER_PUNCTUATION = (
    r"\u061D\u09FD\u0A76\u0C77\u0C84\u1B4E-\u1B4F\u1B7D-\u1B7F\u2E43-\u2E4F\u2E52-\u2E5D"
    r"\U00010D6E\U00010EAD\U00010F55-\U00010F59\U00010F86-\U00010F89\U000113D4-\U000113D5"
    r"\U000113D7-\U000113D8\U0001144B-\U0001144F\U0001145A-\U0001145B\U0001145D\U00011660-\U0001166C"
    r"\U000116B9\U0001183B\U00011944-\U00011946\U000119E2\U00011A3F-\U00011A46\U00011A9A-\U00011A9C"
    r"\U00011A9E-\U00011AA2\U00011B00-\U00011B09\U00011BE1\U00011C41-\U00011C45\U00011C70-\U00011C71"
    r"\U00011EF7-\U00011EF8\U00011F43-\U00011F4F\U00011FFF\U00012FF1-\U00012FF2\U00016D6D-\U00016D6F"
    r"\U00016E97-\U00016E9A\U00016FE2\U0001E5FF\U0001E95E-\U0001E95F"
)
_OLD_PUNCTUATION = r"\u166D\U000111C9"  # P* in those tables, symbols (So) since
PUNCTUATION_CLASS = r"(?V1)[[\p{P}!-/:-@\[-`{-~" + _OLD_PUNCTUATION + "]--[" + _NEWER_PUNCTUATION + "]]"
_WHITE = regex.compile(r"\p{White_Space}")
# chars that HF tokenizers 0.23's Oniguruma matches as \p{Cn} and the `regex` module does not (measured
# over every code point; tests/tokenizer/test_unicode_versions.py checks it against HF)
NEWER_THAN_ONIG = regex.compile("[" + (
    r"\u0558\u058B-\u058C\u05C8-\u05C9\u088F\u0B53-\u0B54\u0C5C\u0CDC\u1ACF-\u1AF0\u208F\u209D-\u209F"
    r"\u20C1-\u20C4\u2B96\u2E60-\u2E63\uA7CE-\uA7CF\uA7D2\uA7D4\uA7DD\uA7E2\uA7F1\uAB6C-\uAB6D"
    r"\uFBC3-\uFBD2\uFD90-\uFD91\uFDC8-\uFDCE\U000107BB-\U000107BF\U00010940-\U00010959"
    r"\U00010EC5-\U00010EC7\U00010EC9-\U00010EEE\U00010EF0-\U00010EFB\U00011B0A\U00011B60-\U00011B67"
    r"\U00011DB0-\U00011DDB\U00011DE0-\U00011DE9\U00011DF0-\U00011DF1\U0001246F\U00012475-\U0001247F"
    r"\U00012550-\U00012686\U00016EA0-\U00016EB8\U00016EBB-\U00016ED3\U00016FF2-\U00016FF6"
    r"\U000187F8-\U000187FF\U00018CD6-\U00018CDA\U00018D09-\U00018D20\U00018D80-\U00018DF2"
    r"\U00018E00-\U00019191\U000191A0-\U000191D2\U0001B123-\U0001B128\U0001B168\U0001CCFA-\U0001CCFC"
    r"\U0001CEBA-\U0001CED0\U0001CED2-\U0001CED4\U0001CEDD-\U0001CEFD\U0001D127-\U0001D128"
    r"\U0001D1EB-\U0001D1FF\U0001D250-\U0001D281\U0001D6A6\U0001DB00-\U0001DB1C\U0001DF1F-\U0001DF24"
    r"\U0001DF2B-\U0001DF81\U0001DF90-\U0001DF96\U0001DFCD-\U0001DFFF\U0001E6C0-\U0001E6DE"
    r"\U0001E6E0-\U0001E6F5\U0001E6FE-\U0001E6FF\U0001F1AE\U0001F6D8-\U0001F6D9\U0001F777-\U0001F77A"
    r"\U0001F7DA-\U0001F7DB\U0001F7F1-\U0001F7FF\U0001F8D0-\U0001F8D8\U0001FA54-\U0001FA57"
    r"\U0001FA8A-\U0001FA8E\U0001FAC8\U0001FACC-\U0001FACD\U0001FADD\U0001FAEA-\U0001FAEB\U0001FAEF"
    r"\U0001FAF9-\U0001FAFA\U0001FBFA\U0002B73A-\U0002B73F\U0002B81E\U0002CEA2-\U0002CEAD"
    r"\U000323B0-\U00033479\U0003D000-\U0003FC3F"
) + "]")


# Rust's to_lowercase (HF's Lowercase) knows these case pairs, Python 3.11's str.lower (Unicode 14) not
NEWER_LOWERCASE = str.maketrans(
    {0x1C89: 0x1C8A, 0xA7CB: 0x264, 0xA7CC: 0xA7CD, 0xA7CE: 0xA7CF, 0xA7D2: 0xA7D3, 0xA7D4: 0xA7D5, 0xA7DA: 0xA7DB,
     0xA7DC: 0x19B} | {c: c + 0x20 for c in range(0x10D50, 0x10D66)} | {c: c + 0x1B for c in range(0x16EA0, 0x16EB9)})
NEWER_UPPERCASE = regex.compile(r"[\u1C89\uA7CB\uA7CC\uA7CE\uA7D2\uA7D4\uA7DA\uA7DC\U00010D50-\U00010D65\U00016EA0-\U00016EB8]")
# chars HF's normalization tables (unicode-normalization-alignments) predate: NFC/NFD/NFKC/NFKD leave
# them as they are, and no composition produces them (measured per code point against tokenizers 0.23)
HF_UNNORMALIZED = regex.compile(
    r"[\u32FF\uA7F2-\uA7F4\uAB69\U00010781-\U00010785\U00010787-\U000107B0\U000107B2-\U000107BA\U00011938"
    r"\U0001F16C\U0001FBF0-\U0001FBF9]")

# combining marks those tables predate: combining class 0 to HF (never reordered, they block composition)
HF_UNKNOWN_MARKS = regex.compile("[" + (
    r"\u07FD\u0898-\u089F\u08CA-\u08D3\u09FE\u0C3C\u0D3B-\u0D3C\u0EBA\u1715\u1ABF-\u1ACE\u1DF6-\u1DFA"
    r"\uA82C\U00010D24-\U00010D27\U00010EAB-\U00010EAC\U00010F46-\U00010F50\U00010F82-\U00010F85"
    r"\U00011070\U0001133B\U0001145E\U00011839-\U0001183A\U0001193D-\U0001193E\U00011943\U000119E0"
    r"\U00011A34\U00011A47\U00011A99\U00011D42\U00011D44-\U00011D45\U00011D97\U00016FF0-\U00016FF1"
    r"\U0001E130-\U0001E136\U0001E2AE\U0001E2EC-\U0001E2EF"
) + "]")


def as_regex_engines_see(text: str) -> str:
    """`text` with every char unknown to Oniguruma / tiktoken (NEWER_THAN_ONIG) replaced by an
    unassigned char, same length, so split regexes cut where HF and tiktoken cut."""
    return text if NEWER_THAN_ONIG.search(text) is None else NEWER_THAN_ONIG.sub("\u0378", text)


def is_whitespace(ch: str) -> bool:
    return _WHITE.match(ch) is not None


def count_leading(text, pred) -> int:
    """How many chars at the start of `text` (any iterable of chars) satisfy `pred`."""
    n = 0
    for ch in text:
        if not pred(ch):
            break
        n += 1
    return n
