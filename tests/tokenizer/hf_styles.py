"""Reference tokenizers built locally with HF `tokenizers` in the styles real models ship, trained on the
../shared/data corpora (no downloads), and >= 2000 varied test lines.

Each builder returns an HF `tokenizers.Tokenizer`; tests compare scratchlm's pipeline against it.
"""

from __future__ import annotations

import json
import random
import re
from collections import Counter
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

# The split regexes, copied as published (never imported from scratchlm, so a wrong pattern cannot sit on both
# sides; test_reference_patterns.py checks them against the installed packages and scratchlm's patterns.py):
# GPT-2: HF tokenizers' ByteLevel(use_regex=True) built-in regex (the one in the compiled tokenizers library);
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
# Llama-3: its tokenizer.json's Split regex, transformers' TikTokenConverter default (convert_slow_tokenizer.py);
LLAMA3_PATTERN = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
                  r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")
# Qwen2/2.5: its tokenizer.json's Split regex, transformers' models/qwen2/tokenization_qwen2.py PRETOKENIZE_REGEX.
QWEN2_PATTERN = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
                 r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")

CORPORA = ("corpus.en", "tinystories_sample.txt", "tinyshakespeare.txt")
QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
LLAMA3_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
SP_SPECIALS = ["<unk>", "<s>", "</s>"]


def corpus_files(shared: Path, tmp: Path) -> list[str]:
    """The training files: corpus.en, tinystories, 200 kB of Shakespeare, and a little non-English text
    (so trained vocabularies hold some multi-byte merges)."""
    shakespeare, ml = tmp / "shakespeare_200k.txt", tmp / "ml.txt"
    if not shakespeare.exists():
        shakespeare.write_text((shared / "tinyshakespeare.txt").read_text(encoding="utf-8")[:200_000], encoding="utf-8")
        ml.write_text("\n".join(BASE_LINES * 20), encoding="utf-8")
    return [str(shared / "corpus.en"), str(shared / "tinystories_sample.txt"), str(shakespeare), str(ml)]


def _train(tok: Tokenizer, files: list[str], vocab_size: int, specials: list[str], **kw) -> Tokenizer:
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, show_progress=False, **kw)
    tok.train(files, trainer)
    return tok


def gpt2(shared: Path) -> Tokenizer:
    """GPT-2 itself: its 50k vocab and merges, ByteLevel pre-tokenizer/decoder/post-processor."""
    tok = Tokenizer(models.BPE.from_file(str(shared / "gpt2_vocab.json"), str(shared / "gpt2_merges.txt")))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.post_processor = processors.ByteLevel(trim_offsets=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|endoftext|>"])
    return tok


def _byte_level_split(pattern: str) -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
                                    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])


def _with_unreachable_tokens(tok: Tokenizer, words: list[str], count: int = 12) -> Tokenizer:
    """Add `count` of the words as tokens that BPE never reaches (their one merge joins a split that the
    merges of the word never produce), as real Llama-3 vocabularies hold; ignore_merges returns them whole."""
    d = json.loads(tok.to_str())
    vocab, merges = d["model"]["vocab"], d["model"]["merges"]
    next_id = max(vocab.values()) + 1
    for w in words:
        if w in vocab or next_id - max(d["model"]["vocab"].values()) > count:
            continue
        cuts, pos = set(), 0
        for t in tok.model.tokenize(w):  # HF's own segmentation of the word
            pos += len(t.value)
            cuts.add(pos)
        k = next((k for k in range(1, len(w)) if k not in cuts and w[:k] in vocab and w[k:] in vocab), None)
        if k is not None:
            merges.append([w[:k], w[k:]])
            vocab[w] = next_id
            next_id += 1
    return Tokenizer.from_str(json.dumps(d))


def llama3(shared: Path, tmp: Path) -> Tokenizer:
    """Llama-3 style: Split(Llama-3 regex) + ByteLevel(use_regex=False), ignore_merges, BOS template."""
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = _byte_level_split(LLAMA3_PATTERN)
    tok.decoder = decoders.ByteLevel()
    _train(tok, corpus_files(shared, tmp), 1500, LLAMA3_SPECIALS,
           initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    words = re.findall(r"[a-z]{6,}", (shared / "corpus.en").read_text(encoding="utf-8"))
    tok = _with_unreachable_tokens(tok, ["Ġ" + w for w, _ in Counter(words).most_common(300)])
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|>:1 $B:1",
                                      special_tokens=[("<|begin_of_text|>", tok.token_to_id("<|begin_of_text|>"))]),
    ])
    return tok


def llama3_tiktoken(shared: Path, tmp: Path) -> Tokenizer:
    """The Llama-3 style vocabulary with merges made the way HF converts tiktoken ranks (Llama-3's own
    tokenizer.json): every split of a token into two tokens is a merge, ranked by the token's id."""
    from transformers.tokenization_utils_base import generate_merges

    d = json.loads(build("llama3", shared, tmp).to_str())
    added = {a["content"] for a in d["added_tokens"]}
    d["model"]["merges"] = [list(m) for m in generate_merges(d["model"]["vocab"], skip_tokens=added)]
    return Tokenizer.from_str(json.dumps(d))


def qwen2(shared: Path, tmp: Path) -> Tokenizer:
    """Qwen2 style: NFC + Split(Qwen2 regex) + ByteLevel(use_regex=False), ByteLevel post-processor."""
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = _byte_level_split(QWEN2_PATTERN)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return _train(tok, corpus_files(shared, tmp), 1200, QWEN_SPECIALS,
                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())


_SP_CACHE: dict[tuple[str, int], dict] = {}


def _sentencepiece_bpe(shared: Path, tmp: Path, vocab_size: int) -> dict:
    """A SentencePiece-converted BPE vocabulary: <unk> <s> </s>, the 256 byte tokens "<0xNN>", then
    pieces learned on "▁"-spaced text with a small alphabet (rare chars need byte fallback)."""
    key = (str(tmp), vocab_size)
    if key not in _SP_CACHE:
        tok = Tokenizer(models.BPE())
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
        _train(tok, corpus_files(shared, tmp), vocab_size, [], limit_alphabet=120)
        _SP_CACHE[key] = json.loads(tok.to_str())["model"]
    learned = _SP_CACHE[key]
    vocab = {s: i for i, s in enumerate(SP_SPECIALS + [f"<0x{b:02X}>" for b in range(256)])}
    for s, _ in sorted(learned["vocab"].items(), key=lambda kv: kv[1]):
        vocab.setdefault(s, len(vocab))
    return {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
            "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
            "vocab": vocab, "merges": learned["merges"]}


def _sp_tokenizer(model: dict, specials: list[str], **stages) -> Tokenizer:
    added = [{"id": model["vocab"][s], "content": s, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for s in specials]
    d = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
         "pre_tokenizer": None, "post_processor": None, "decoder": None, "model": model}
    tok = Tokenizer.from_str(json.dumps(d))
    for name, value in stages.items():
        setattr(tok, name, value)
    return tok


def llama2(shared: Path, tmp: Path) -> Tokenizer:
    """Llama-2 (legacy) style: Prepend("▁") + Replace(" ", "▁") normalizer, no pre-tokenizer (the whole
    text is one word), byte_fallback, BOS/EOS TemplateProcessing, Replace/ByteFallback/Fuse/Strip decoder."""
    model = _sentencepiece_bpe(shared, tmp, 900)
    return _sp_tokenizer(
        model, SP_SPECIALS,
        normalizer=normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")]),
        post_processor=processors.TemplateProcessing(single="<s> $A </s>", pair="<s> $A </s> </s>:1 $B:1 </s>:1",
                                                     special_tokens=[("<s>", 1), ("</s>", 2)]),
        decoder=decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                   decoders.Strip(" ", 1, 0)]))


def mistral(shared: Path, tmp: Path) -> Tokenizer:
    """Mistral / non-legacy Llama style: Metaspace(prepend_scheme="first", split=False), byte_fallback."""
    model = _sentencepiece_bpe(shared, tmp, 900)
    return _sp_tokenizer(
        model, SP_SPECIALS,
        pre_tokenizer=pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False),
        post_processor=processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s>:1 $B:1",
                                                     special_tokens=[("<s>", 1)]),
        decoder=decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                   decoders.Strip(" ", 1, 0)]))


def gemma(shared: Path, tmp: Path) -> Tokenizer:
    """Gemma style: Replace(" ", "▁") normalizer, Split(" ", MergedWithPrevious), digits one by one,
    byte_fallback, <bos> template, Replace/ByteFallback/Fuse decoder; <start_of_turn>/<end_of_turn>."""
    model = _sentencepiece_bpe(shared, tmp, 900)
    for s in ("<start_of_turn>", "<end_of_turn>"):
        model["vocab"][s] = len(model["vocab"])
    return _sp_tokenizer(
        model, SP_SPECIALS + ["<start_of_turn>", "<end_of_turn>"],
        normalizer=normalizers.Replace(" ", "▁"),
        pre_tokenizer=pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                               pre_tokenizers.Split(" ", behavior="merged_with_previous")]),
        post_processor=processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s>:1 $B:1",
                                                     special_tokens=[("<s>", 1)]),
        decoder=decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]))


def metaspace_split(shared: Path, tmp: Path) -> Tokenizer:
    """Metaspace(prepend_scheme="always", split=True) with the Metaspace decoder and an NFKC normalizer."""
    tok = Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=False))
    tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    return _train(tok, corpus_files(shared, tmp), 700, SP_SPECIALS, limit_alphabet=90)


def kitchen_sink(shared: Path, tmp: Path) -> Tokenizer:
    """Every remaining stage and option: NFKD + Lowercase + Strip + Replace(regex) normalizers;
    Whitespace-free splits (Punctuation, Digits contiguous, Split invert / MergedWithNext / Contiguous /
    Removed, CharDelimiterSplit, WhitespaceSplit); BPE with continuing_subword_prefix, end_of_word_suffix
    and a non-fused unk; Roberta/Bert-style post-processing; added tokens with every flag."""
    tok = Tokenizer(models.BPE(unk_token="[UNK]", continuing_subword_prefix="##", end_of_word_suffix="</w>"))
    tok.normalizer = normalizers.Sequence([normalizers.NFKD(), normalizers.Lowercase(), normalizers.Strip(),
                                           normalizers.Replace(Regex(r"\s{2,}"), " ")])
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation(behavior="isolated"),
        pre_tokenizers.Digits(individual_digits=False),
        pre_tokenizers.Split(Regex(r"[aeiou]"), behavior="merged_with_next"),
        pre_tokenizers.Split(Regex(r"q+"), behavior="contiguous", invert=True),
        pre_tokenizers.CharDelimiterSplit("x")])
    tok.decoder = decoders.Sequence([decoders.Replace("##", ""), decoders.Replace("</w>", " "), decoders.Strip(" ", 0, 1)])
    _train(tok, corpus_files(shared, tmp), 900, ["[UNK]", "[CLS]", "[SEP]"], limit_alphabet=60,
           continuing_subword_prefix="##", end_of_word_suffix="</w>")
    tok.post_processor = processors.BertProcessing(("[SEP]", tok.token_to_id("[SEP]")), ("[CLS]", tok.token_to_id("[CLS]")))
    return tok


FLAG_TOKENS = [  # (content, options) — every added-token flag
    ("<lstrip>", dict(lstrip=True, special=True, normalized=False)),
    ("<rstrip>", dict(rstrip=True, special=True, normalized=False)),
    ("<both>", dict(lstrip=True, rstrip=True, special=False, normalized=False)),
    ("word", dict(single_word=True, special=False, normalized=False)),
    ("<NORM>", dict(normalized=True, special=False)),
    ("ÉTÉ", dict(normalized=True, special=True)),
    ("<plain>", dict(special=False, normalized=False)),
]


def with_flag_tokens(tok: Tokenizer) -> Tokenizer:
    """`tok` plus added tokens using every flag (lstrip, rstrip, single_word, normalized, special)."""
    tok = Tokenizer.from_str(tok.to_str())
    for content, opts in FLAG_TOKENS:
        tok.add_tokens([AddedToken(content, **opts)])
    return tok


STYLES = {"gpt2": lambda s, t: gpt2(s), "llama3": llama3, "llama3_tiktoken": llama3_tiktoken, "qwen2": qwen2, "llama2": llama2, "mistral": mistral,
          "gemma": gemma, "metaspace": metaspace_split, "kitchen_sink": kitchen_sink,
          "qwen2_flags": lambda s, t: with_flag_tokens(build("qwen2", s, t)),
          "kitchen_flags": lambda s, t: with_flag_tokens(build("kitchen_sink", s, t))}
_BUILT: dict[str, str] = {}


def build(name: str, shared: Path, tmp: Path) -> Tokenizer:
    """A fresh copy of style `name`, trained once per process (tests in several modules share it)."""
    if name not in _BUILT:
        _BUILT[name] = STYLES[name](shared, tmp).to_str()
    return Tokenizer.from_str(_BUILT[name])


BASE_LINES = [
    "Hello, world! It's 2026; we've got 3.14 apples & 42 pears.",
    "Grüße aus Köln — naïve café, façade, jalapeño, Æsir, smørrebrød.",
    "Привет, мир! Как дела? Съешь же ещё этих мягких французских булок.",
    "日本語のテキスト、漢字とひらがなとカタカナ。中文：你好，世界！한국어 문장입니다.",
    "العربية: مرحبا بالعالم. עברית: שלום עולם. हिन्दी: नमस्ते दुनिया। ไทย: สวัสดีชาวโลก",
    "emoji 🎉🔥👍🏽 👨‍👩‍👧‍👦 🇺🇳 flags, ZWJ and skin tones; math ∑∫√∞ ≠ ≤; arrows ←→",
    "  leading spaces\n\n\ttabs\r\n  trailing   \n\n\n   \u00a0nbsp\u2028line sep\u3000ideo space ",
    "contractions: I'm, you're, they've, she'll, he'd, it's, don't, 'S 'RE '' 're, I'M YOU'RE",
    "numbers 1234567890 ٣٤٥ ① Ⅻ ½ 1,000,000.50 0x1F 3e-7, symbols \\ / | ~ ` ^ _ { } [ ] < > <| |>",
    "\x00\x01\x7f control chars \x1b[31m and the replacement char \ufffd, \x85 next-line",
    "combining: e\u0301 a\u0308 n\u0303 (decomposed) vs é ä ñ; Hangul jamo \u1100\u1161\u11a8; ﬁ ﬂ ㎏ Ⅸ ｆｕｌｌ",
    "def f(x):\n    return {'a': [1, 2, 3], \"b\": x ** 2}  # code\n\tif x != None: pass\n",
    "Σίσυφος ΣΟΦΟΣ, İstanbul ıi, ß ẞ, Ǆ ǅ ǆ, ＡＢＣ full-width, ℌ𝔢𝔩𝔩𝔬 math letters",
    "spaces    between     words and\u2003em\u2009thin\u200bzero-width joiner\u200d here",
    "<|endoftext|> <|im_start|>user\nhi<|im_end|>\n<s> </s> <unk> <|begin_of_text|><|eot_id|>",
    "word words sword <lstrip>  x  <rstrip>  y <both>  z wordy word. <NORM> <norm> ÉTÉ été <plain>",
    "...!!!???---___***   ///   \\\\ \"quoted\" 'single' (paren) [bracket] {brace}",
    "\U0001F600\U0001F680\U00040000\U0010FFFF private-use \ue000 and plane-1 𝒜𝒷𝒸 𓀀 𐍈",
]
PIECES = ["the", " The", "king", "'s", " don't", "  ", "\n", "\n\n", "\t", " \n ", "1", "12", "123", "4567", "3.5",
          "é", "e\u0301", "日本", "🎉", "👍🏽", "مرحبا", "Ω", "ß", "ﬁ", "<|endoftext|>", "<|im_start|>", "<|im_end|>",
          "<s>", "</s>", "<unk>", "<lstrip>", "<rstrip>", "<both>", "word", "<NORM>", "ÉTÉ", "<plain>", "[UNK]",
          "(", ")", "{", "}", ";", ":", "->", "==", "\u00a0", "\u3000", "\u200d", "x", "q", "qq", "Σ", "İ", " "]


def sample_lines(shared: Path, n_corpus: int = 1200, n_random: int = 1200, seed: int = 0) -> list[str]:
    """Deterministic varied lines: base lines, corpus lines (all three corpora), random mixtures."""
    rng = random.Random(seed)
    lines = list(BASE_LINES)
    for name in CORPORA:
        text = [t for t in (shared / name).read_text(encoding="utf-8").splitlines() if t.strip()]
        lines += rng.sample(text, min(len(text), n_corpus // len(CORPORA)))
    for _ in range(n_random):
        k = rng.randint(1, 14)
        lines.append("".join(rng.choice(PIECES + [rng.choice(BASE_LINES)[:rng.randint(0, 30)]]) for _ in range(k)))
    lines += ["", " ", "  ", "\n", "x", "  hello", "hello  ", "<s>", "<s> ", " <s>"]
    return lines
