"""Pre-tokenization regexes of the byte-level BPE families (as their tokenizer.json files write them).

    GPT2_PATTERN    GPT-2 (HF ByteLevel(use_regex=True), tiktoken "gpt2"; SmolLM2 too)
    LLAMA3_PATTERN  Llama-3 (tiktoken "cl100k_base" style): case-insensitive contractions, a letter
                    run with one leading non-letter, numbers in groups of up to 3, newline runs apart
    QWEN2_PATTERN   Qwen2/2.5/3: Llama-3's with single digits
"""

GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
LLAMA3_PATTERN = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
                  r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")
QWEN2_PATTERN = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
                 r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")

# Patterns for which a cut right after "x\nY" (x, Y letters, digits or visible ASCII) never changes the
# pre-tokens: no alternative crosses such a newline, and none looks behind (used by streaming.py).
NEWLINE_SAFE = frozenset({GPT2_PATTERN, LLAMA3_PATTERN, QWEN2_PATTERN})
