"""SentencePiece ("llama") vocabulary GGUFs for tests, and the two references they are checked against.

Independent of scratchlm's code: files are written with gguf-py's GGUFWriter as llama.cpp's converter writes
them (`_create_vocab_sentencepiece`: types from the sentencepiece model, user-defined symbols re-typed from
the added tokens), and the references are llama.cpp itself (llama-cpp-python: `Llama.tokenize`, the C
`llama_detokenize`) and HF `tokenizers` loading a tokenizer.json.
"""

from __future__ import annotations

import ctypes
import io
import random
from pathlib import Path

import gguf
import llama_cpp

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
BYTE_TOKENS = [f"<0x{b:02X}>" for b in range(256)]

# texts every comparison runs: scripts, code, whitespace runs, digits, special-token texts
CORPUS = [
    "", " ", "  ", "   ", "\n", "\t", " Hello", "  Hello", "Hello world", "Hello  world", "hello   world  ",
    " " * 17 + "x", " " * 40, "\n\n\n", "\t\t  \n \n\t", "a\r\nb", "trailing space ", "  leading\tand\ninner  ",
    "The quick brown fox jumps over the lazy dog. It's 2024-11-23; they'll see 3.14159 and 1,000,000 units.",
    "I'M SURE you're right — THEY'LL see, won't they?",
    "def main():\n    return {'a': [1, 2, 3], \"b\": None}\n\n\nif __name__ == '__main__':\n\tmain()\n",
    "for (int i = 0; i < n; ++i) { x[i] += y[i] * 2; }  // C++", "SELECT * FROM t WHERE id = 42;",
    "中文字符和标点：你好，世界！", "日本語のテキスト、カタカナとひらがな。", "한국어 텍스트입니다",
    "مرحبا بالعالم، كيف حالك؟", "नमस्ते दुनिया", "Привет, мир! Ёжик", "Ελληνικά γράμματα", "ทดสอบภาษาไทย",
    "emoji 🦙🤗🚀 and 👨‍👩‍👧‍👦 family and flags 🇫🇷", "e\u0301 combining and precomposed é", "zero\u200bwidth",
    "nbsp\u00a0and ideographic\u3000space", "▁already▁escaped ▁", "12345678901234567890", "٣٤٥ and ٠١٢",
    "<s>", "</s>", "<unk>", "a<s>b", " <s> b", "</s></s>x", "hi</s> there", "<0x0A>", "<0x41> literal",
    "[INST] What is 2+2? [/INST] 4</s>", "<tool>call</tool>", "xabc", "abc abcabc", "aaaa bbbb",
    "Ĳ ﬁ ligatures and ＡＢＣ fullwidth", "mixed中文and English 混合 text 123",
]


def write_spm_gguf(path: Path, tokens: list[str], scores: list[float], types: list[int], *, name: str = "tiny-spm",
                   add_space_prefix: bool | None = None, add_bos: bool | None = None, add_eos: bool | None = None,
                   bos: int | None = 1, eos: int | None = 2, unk: int | None = 0, extra: dict | None = None) -> Path:
    """A vocab-only GGUF (tokenizer.ggml.model "llama"); None leaves a key out (llama.cpp's default then)."""
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name(name)
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores([float(s) for s in scores])
    w.add_token_types([int(t) for t in types])
    for value, add in ((bos, w.add_bos_token_id), (eos, w.add_eos_token_id), (unk, w.add_unk_token_id),
                       (add_space_prefix, w.add_add_space_prefix), (add_bos, w.add_add_bos_token),
                       (add_eos, w.add_add_eos_token)):
        if value is not None:
            add(value)
    for key, value in (extra or {}).items():
        w.add_key_value(key, value, gguf.GGUFValueType.UINT32 if isinstance(value, int) else gguf.GGUFValueType.STRING)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def write_metadata_gguf(path: Path, metadata: dict) -> Path:
    """A vocab-only GGUF of `tokenizer.*` metadata with llama.cpp's value types (ids UINT32, flags BOOL)."""
    G = gguf.GGUFValueType
    w = gguf.GGUFWriter(str(path), "llama")
    for key, value in metadata.items():
        if isinstance(value, list):
            sub = G.STRING if isinstance(value[0], str) else G.FLOAT32 if isinstance(value[0], float) else G.INT32
            w.add_key_value(key, value, G.ARRAY, sub_type=sub)
        else:
            kind = {bool: G.BOOL, int: G.UINT32, float: G.FLOAT32, str: G.STRING}[type(value)]
            w.add_key_value(key, value, kind)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def base_vocab(with_bytes: bool = True) -> tuple[list[str], list[float], list[int]]:
    """<unk> <s> </s> and the 256 byte tokens, as a Llama-2 vocabulary starts."""
    tokens, scores, types = ["<unk>", "<s>", "</s>"], [0.0, 0.0, 0.0], [UNKNOWN, CONTROL, CONTROL]
    if with_bytes:
        tokens += BYTE_TOKENS
        scores += [0.0] * 256
        types += [BYTE] * 256
    return tokens, scores, types


def train_sentencepiece(lines: list[str], vocab_size: int, user_defined: list[str], control: list[str]):
    """A byte-fallback sentencepiece BPE trained on `lines` (Llama-2's trainer settings, identity normalization)."""
    import sentencepiece as spm

    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=buf, model_type="bpe", vocab_size=vocab_size, byte_fallback=True,
        character_coverage=0.9995, split_digits=True, allow_whitespace_only_pieces=True, remove_extra_whitespaces=False,
        normalization_rule_name="identity", user_defined_symbols=user_defined, control_symbols=control, unk_id=0,
        bos_id=1, eos_id=2, pad_id=-1, minloglevel=2, num_threads=1)
    return spm.SentencePieceProcessor(model_proto=buf.getvalue())


def sentencepiece_vocab(sp, user_defined: list[str]) -> tuple[list[str], list[float], list[int]]:
    """tokens / scores / types as llama.cpp's converter writes them: unknown / control / unused / byte from the
    model, everything else normal, then the added (non-special) tokens user-defined with real spaces."""
    tokens, scores, types = [], [], []
    for i in range(sp.vocab_size()):
        tokens.append(sp.id_to_piece(i))
        scores.append(sp.get_score(i))
        types.append(UNKNOWN if sp.is_unknown(i) else CONTROL if sp.is_control(i) else UNUSED if sp.is_unused(i)
                     else BYTE if sp.is_byte(i) else NORMAL)
    for i, t in enumerate(tokens):
        if t in user_defined:
            tokens[i], types[i] = t.replace("▁", " "), USER_DEFINED
    return tokens, scores, types


def random_texts(alphabet: str, n: int, seed: int, max_len: int = 30) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, max_len))) for _ in range(n)]


class LlamaCpp:
    """llama.cpp's tokenizer for a vocab-only GGUF."""

    def __init__(self, path: Path) -> None:
        self.llm = llama_cpp.Llama(str(path), vocab_only=True, verbose=False)

    def tokenize(self, text: str, add_bos: bool, special: bool) -> list[int]:
        return self.llm.tokenize(text.encode("utf-8"), add_bos=add_bos, special=special)

    def detokenize(self, ids: list[int], special: bool) -> bytes:
        """llama_detokenize(remove_special=False, unparse_special=special) (common_detokenize)."""
        arr = (llama_cpp.llama_token * len(ids))(*ids)
        cap = 1 << 16
        buf = ctypes.create_string_buffer(cap)
        n = llama_cpp.llama_detokenize(self.llm._model.vocab, arr, len(ids), buf, cap, False, special)
        assert 0 <= n <= cap
        return buf.raw[:n]

    def close(self) -> None:
        self.llm.close()


def ours(tok, text: str, add_bos: bool, special: bool) -> list[int]:
    """scratchlm's ids with llama.cpp's flags: special -> encode, not special -> encode_ordinary."""
    if special:
        return tok.encode(text, add_special_tokens=add_bos)
    return tok.encode_ordinary(text, add_special_tokens=add_bos)


def mismatches(tok, ref: LlamaCpp, texts: list[str]) -> list[tuple]:
    """Every (text, flags, theirs, ours) where ids or decoded bytes differ, over add_bos x special x skip."""
    bad = []
    for text in texts:
        for add_bos in (False, True):
            for special in (False, True):
                want = ref.tokenize(text, add_bos, special)
                got = ours(tok, text, add_bos, special)
                if got != want:
                    bad.append((text, add_bos, special, want, got))
                    continue
                for render in (False, True):
                    want_b = ref.detokenize(want, render)
                    got_b = tok.decode_bytes(want, skip_special_tokens=not render)
                    if got_b != want_b:
                        bad.append((text, add_bos, special, render, want_b, got_b))
    return bad
