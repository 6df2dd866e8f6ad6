r"""`tokenizer.ggml.pre` -> the pre-tokenizer regexes llama.cpp applies for it (src/llama-vocab.cpp).

A GGUF names its pre-tokenizer instead of storing it. llama.cpp splits text with a list of regexes, each
applied to every piece the previous one produced, keeping the text between matches as pieces too: exactly
HF's `Split(pattern, behavior="Isolated")` pre-tokenizers in a Sequence, followed by the byte-level
alphabet (`ByteLevel(use_regex=False)`). The regexes below are llama.cpp's (its case-insensitive
contractions spelled out as `'[sS]|...`, equivalent to HF's `(?i:'s|...)`). Some families also encode
each pre-token that is itself a vocabulary entry as that one token (`ignore_merges`, Llama-3), and some
add a BOS when the file has no `tokenizer.ggml.add_bos_token` (`add_bos`, Llama-3 and Tekken).

GPT-4o (Phi-4-mini) and Tekken (Mistral-Nemo) use llama.cpp's rewrite of the upper/lower-case classes
(`\p{Lu}...` as "a letter that is not a-z"), which llama.cpp runs on its category-collapsed text; Python's
`regex` runs the same pattern on the text itself, so every non-ASCII letter counts as both upper and lower
case in both.
"""

from __future__ import annotations

GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
LLAMA3 = _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
QWEN2 = _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
QWEN35 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+"
          r"|\s+(?!\S)|\s+")
_UPPER, _LOWER = r"((?=[\p{L}])([^a-z]))", r"((?=[\p{L}])([^A-Z]))"  # llama.cpp's spelling of [\p{Lu}...], [\p{Ll}...]
GPT4O = (rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+{_CONTRACTIONS}?|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*"
         rf"{_CONTRACTIONS}?|\p{{N}}{{1,3}}| ?[^\s\p{{L}}\p{{N}}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
TEKKEN = (rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*|\p{{N}}"
          r"| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")


class PreTokenizer:
    """llama.cpp's pre-tokenizer for one `tokenizer.ggml.pre` family: regexes in order, ignore_merges, and
    add_bos (whether a BOS is added when the file has no add_bos_token key)."""

    def __init__(self, regexes: tuple[str, ...], ignore_merges: bool = False, add_bos: bool = False) -> None:
        self.regexes = regexes
        self.ignore_merges = ignore_merges
        self.add_bos = add_bos


_FAMILIES = {
    "default": PreTokenizer((r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", r"[0-9][0-9][0-9]")),
    "gpt2": PreTokenizer((GPT2,)),
    "llama3": PreTokenizer((LLAMA3,), ignore_merges=True, add_bos=True),
    "dbrx": PreTokenizer((LLAMA3,)),
    "qwen2": PreTokenizer((QWEN2,)),
    "qwen35": PreTokenizer((QWEN35,)),
    "digits_gpt2": PreTokenizer((r"\p{N}", GPT2)),
    "falcon": PreTokenizer((r"[\p{P}\$\+<=>\^~\|`]+", GPT2, r"[0-9][0-9][0-9]")),
    "gpt4o": PreTokenizer((GPT4O,)),
    "tekken": PreTokenizer((TEKKEN,), ignore_merges=True, add_bos=True),
}
# tokenizer.ggml.pre value -> family (llama.cpp's llama_vocab::impl::load)
PRE_NAMES = {
    "default": "default", "gpt-2": "gpt2", "phi-2": "gpt2", "mpt": "gpt2", "olmo": "gpt2", "jais": "gpt2",
    "trillion": "gpt2", "gigachat": "gpt2", "mellum": "gpt2", "llama3": "llama3", "llama-v3": "llama3",
    "llama-bpe": "llama3", "falcon3": "llama3", "falcon-h1": "llama3", "pixtral": "llama3", "midm-2.0": "llama3",
    "lfm2": "llama3", "dbrx": "dbrx", "smaug-bpe": "dbrx", "qwen2": "qwen2", "deepseek-r1-qwen": "qwen2",
    "stablelm2": "qwen2", "kormo": "qwen2", "qwen35": "qwen35", "smollm": "digits_gpt2", "starcoder": "digits_gpt2",
    "refact": "digits_gpt2", "command-r": "digits_gpt2", "codeshell": "digits_gpt2", "exaone": "digits_gpt2",
    "minerva-7b": "digits_gpt2", "falcon": "falcon", "gpt-4o": "gpt4o", "llama4": "gpt4o", "kanana2": "gpt4o",
    "talkie": "gpt4o", "tekken": "tekken", "jina-v5-nano": "llama3", "mellum2": "digits_gpt2", "f2llmv2": "qwen2",
    "megrez": "qwen2", "hunyuan": "qwen2", "solar-open": "qwen2", "grok-2": "qwen2", "granite-docling": "gpt2",
    "exaone4": "gpt2", "a.x-4.0": "gpt2", "jina-es": "gpt2", "jina-de": "gpt2",
}


def gguf_pre_tokenizer(pre: str | None) -> PreTokenizer:
    """The PreTokenizer for a `tokenizer.ggml.pre` value (missing -> llama.cpp's "default")."""
    name = pre or "default"
    if name not in PRE_NAMES:
        raise ValueError(f"GGUF tokenizer.ggml.pre={name!r} is not supported by scratchlm; supported: "
                         f"{', '.join(sorted(PRE_NAMES))}")
    return _FAMILIES[PRE_NAMES[name]]


# the same pre-tokenizers as real models' tokenizer.json files spell them (HF regex syntax)
_HF_QWEN2 = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_HF_LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
              r"|\s*[\r\n]+|\s+(?!\S)|\s+")
# family -> the tokenizer.ggml.pre name written on export
CANONICAL_NAMES = {"default": "default", "gpt2": "gpt-2", "llama3": "llama-bpe", "dbrx": "dbrx", "qwen2": "qwen2",
                   "qwen35": "qwen35", "digits_gpt2": "smollm", "falcon": "falcon", "gpt4o": "gpt-4o",
                   "tekken": "tekken"}


def _split_regexes(steps: list[dict]) -> tuple[str, ...] | None:
    """The regexes of [Split(Isolated)..., ByteLevel(use_regex=false)], or None for another shape."""
    *splits, last = steps
    if last.get("type") != "ByteLevel" or last.get("use_regex", True) or last.get("add_prefix_space"):
        return None
    if not all(s.get("type") == "Split" and s.get("behavior") == "Isolated" and not s.get("invert")
               and "Regex" in (s.get("pattern") or {}) for s in splits):
        return None
    return tuple(s["pattern"]["Regex"] for s in splits)


def gguf_pre_name(pre_tokenizer: dict | None) -> str:
    """The `tokenizer.ggml.pre` name of a tokenizer.json pre-tokenizer (llama.cpp's regexes or the HF spelling
    of GPT-2, Llama-3, Qwen2 and SmolLM2); ValueError for one llama.cpp has no name for."""
    pre = pre_tokenizer or {}
    steps = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else [pre]
    if len(steps) == 1 and steps[0].get("type") == "ByteLevel" and steps[0].get("use_regex", True) \
            and not steps[0].get("add_prefix_space"):
        return "gpt-2"
    if (len(steps) == 2 and steps[0] == {"type": "Digits", "individual_digits": True}
            and steps[1].get("type") == "ByteLevel" and steps[1].get("use_regex", True)):
        return "smollm"
    regexes = _split_regexes(steps) if steps else None
    spelled = {(_HF_QWEN2,): "qwen2", (_HF_LLAMA3,): "llama-bpe"}
    if regexes in spelled:
        return spelled[regexes]
    for family, p in _FAMILIES.items():
        if regexes == p.regexes:
            return CANONICAL_NAMES[family]
    raise ValueError(f"the tokenizer's pre-tokenizer {pre} has no llama.cpp name (tokenizer.ggml.pre); GGUF export "
                     "supports GPT-2, Llama-3, Qwen2 and SmolLM2-style byte-level tokenizers")
