"""The tokenizer: HF tokenizer.json's pipeline, run from scratch.

    encode:  added tokens cut out of the raw text  ->  normalizer  ->  added tokens (normalized form)
             ->  pre-tokenizer  ->  BPE model per pre-token  ->  post-processor (add_special_tokens)
    decode:  ids -> token strings -> decoder -> text
Each stage is one module (normalizers.py, pre_tokenizers.py, byte_level.py, metaspace.py, bpe.py,
byte_fallback.py, added_tokens.py, post_processors.py, decoders.py); tokenizer.json <-> stages in
hf_json.py. GGUF SentencePiece vocabularies run llama.cpp's stages in the same pipeline: the
SentencePiece-BPE model by scores (sentencepiece_bpe.py), llama.cpp's longest-first added-token matching
(added_tokens.LongestFirstVocabulary) and its token pieces as decoder (token_pieces.py); their
tokenizer.json (to_hf_dict) is the HF form, `hf_form_risks` says where that form can differ. scratchlm's own byte-level BPE is the same pipeline (gpt2_style.py); `impl="tiktoken"`
runs eligible byte-level tokenizers through tiktoken with the same ids (tiktoken_path.py).

`encode(text)` does not add the post-processor's special tokens (add_special_tokens=False: BOS/EOS
only when asked), so ids are exactly the text; HF's `tokenizer.encode(text)` default is True.
Text with unpaired surrogates (not encodable as UTF-8): surrogates="error" refuses it as HF does
(tokenizers loaded from tokenizer.json); "replace" turns them into U+FFFD as tiktoken does (scratchlm's
own tokenizers, kept for compatibility).
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Iterable, Iterator

from scratchlm.tokenizer import stream_encode, tiktoken_path, vocab_files
from scratchlm.tokenizer.added_tokens import MATCHING
from scratchlm.tokenizer.bpe import BPE
from scratchlm.tokenizer.byte_level import ByteLevel
from scratchlm.tokenizer.decoders import decode_tokens, token_bytes
from scratchlm.tokenizer.encoding import Encoding
from scratchlm.tokenizer.gpt2_style import gpt2_style_parts
from scratchlm.tokenizer.hf_json import TokenizerParts, parts_from_dict, parts_to_dict, read_tokenizer_json, write_tokenizer_json
from scratchlm.tokenizer.normalized import NormalizedText, text_of
from scratchlm.tokenizer.post_processors import post_process
from scratchlm.tokenizer.pre_tokenizers import needs_positions
from scratchlm.tokenizer.token_pieces import TokenPieces

IMPLS = ("reference", "tiktoken")
SURROGATES = ("error", "replace")
TOKENIZER_JSON = "tokenizer.json"


class Tokenizer:
    """A BPE tokenizer pipeline (module docstring). `Tokenizer(vocab, merges, special_tokens)` builds
    scratchlm's byte-level BPE (vocab id -> bytes, merges (bytes, bytes) in rank order); `from_hf_dict` /
    `from_hf_json` / `load` build any supported tokenizer.json."""

    def __init__(self, vocab: dict[int, bytes], merges: list[tuple[bytes, bytes]], special_tokens: list[str] | None = None,
                 *, impl: str = "reference") -> None:
        self._setup(gpt2_style_parts(vocab, merges, special_tokens), impl, "replace")
        self.native = True

    @classmethod
    def from_parts(cls, parts: TokenizerParts, *, impl: str = "reference", surrogates: str = "error") -> "Tokenizer":
        tok = cls.__new__(cls)
        tok._setup(parts, impl, surrogates)
        return tok

    @classmethod
    def from_hf_dict(cls, d: dict, *, impl: str = "reference") -> "Tokenizer":
        """From a tokenizer.json-shaped dict; a clear ValueError naming any unsupported component."""
        return cls.from_parts(parts_from_dict(d), impl=impl)

    @classmethod
    def from_hf_json(cls, path: str | Path, *, impl: str = "reference") -> "Tokenizer":
        return cls.from_hf_dict(read_tokenizer_json(path), impl=impl)

    def _setup(self, parts: TokenizerParts, impl: str, surrogates: str) -> None:
        if impl not in IMPLS:
            raise ValueError(f"impl={impl!r} is not one of {IMPLS}")
        if surrogates not in SURROGATES:
            raise ValueError(f"surrogates={surrogates!r} is not one of {SURROGATES}")
        self.parts = parts
        self.model = parts.model
        self.normalizer, self.pre_tokenizer = parts.normalizer, parts.pre_tokenizer
        self.post_processor, self.decoder = parts.post_processor, parts.decoder
        if parts.added_matching not in MATCHING:
            raise ValueError(f"added_matching={parts.added_matching!r} is not one of {sorted(MATCHING)}")
        self.added = MATCHING[parts.added_matching](parts.added_tokens, parts.normalizer)
        self.special_token_ids = {t.content: t.id for t in self.added.tokens if t.special}
        self.special_tokens = list(self.special_token_ids)
        self.surrogates = surrogates
        self.chat_template = None  # a jinja_template.ChatTemplate when the model ships one (set by the loaders)
        self.special_tokens_map: dict[str, str] = {}  # bos_token / eos_token / ... -> text (HF's names)
        self._vocab: dict[int, bytes] | None = None
        self._needs_positions = needs_positions(parts.pre_tokenizer)
        self.impl = impl
        self.native = False  # True: scratchlm's own byte-level BPE, saved in scratchlm's files
        self._fast = tiktoken_path.tiktoken_encoder(self) if impl == "tiktoken" else None

    @property
    def vocab_size(self) -> int:
        """Largest id + 1 (the embedding rows a model needs)."""
        return max(max(self.model.vocab_r, default=-1), max(self.added.by_id, default=-1)) + 1

    @property
    def vocab(self) -> dict[int, bytes]:
        """id -> the bytes the token adds to a decoded text in mid-sequence (see decoders.token_bytes)."""
        if self._vocab is None:
            table = {i: token_bytes(self.decoder, s) for i, s in self.model.vocab_r.items()}
            table.update({i: token_bytes(self.decoder, self.added.pattern_of[i]) for i in self.added.by_id})
            self._vocab = table
        return self._vocab

    @property
    def merges(self) -> list[tuple[bytes, bytes]]:
        """The merges as token bytes (see `vocab`), in rank order."""
        return [(token_bytes(self.decoder, a), token_bytes(self.decoder, b)) for a, b in self.model.merges]

    @property
    def byte_level(self) -> bool:
        """True for a byte-level BPE (ByteLevel decoder): decode_bytes is then exact."""
        return isinstance(self.decoder, ByteLevel)

    def __repr__(self) -> str:
        model = f"merges={len(self.model.merges)}" if isinstance(self.model, BPE) else type(self.model).__name__
        return (f"Tokenizer(vocab_size={self.vocab_size}, {model}, "
                f"specials={self.special_tokens[:8]}, impl={self.impl!r})")

    def hf_form_risks(self) -> dict[str, list[str]]:
        """Why this tokenizer's tokenizer.json (to_hf_dict) may encode ("encode") or decode ("decode") some
        input differently when HF `tokenizers` runs it; empty lists for stages that are HF's own."""
        out: dict[str, list[str]] = {"encode": [], "decode": []}
        for key, stage in (("encode", self.model), ("encode", self.added), ("decode", self.decoder)):
            if hasattr(stage, "hf_form_risks"):
                out[key] += stage.hf_form_risks()
        return out

    # -- encoding -----------------------------------------------------------------------------
    def _check_text(self, text: object) -> str:
        if not isinstance(text, str):
            raise ValueError(f"encode expects str, got {type(text).__name__}; decode bytes with .decode('utf-8') first")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            if self.surrogates == "replace":
                return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
            raise ValueError(f"text has an unpaired surrogate {text[exc.start]!r} at index {exc.start}, which is not "
                             "Unicode text (HF tokenizers refuse it too); replace it, e.g. with "
                             "text.encode('utf-8', 'replace').decode()") from None
        return text

    def _segments(self, text: str, skip_special: bool) -> list[tuple[NormalizedText, int | None]]:
        """Added tokens cut out (raw, then normalized) and the rest normalized."""
        out = []
        for nt, tid in self.added.split(NormalizedText(text), False, skip_special):
            if tid is not None:
                out.append((nt, tid))
                continue
            if self.normalizer is not None:
                nt = self.normalizer.normalize(nt)
            out.extend(self.added.split(nt, True, skip_special))
        return out

    def _words(self, nt: str | NormalizedText) -> list:
        if self.pre_tokenizer is None:
            return [nt] if text_of(nt) else []
        return self.pre_tokenizer.pre_tokenize([nt])

    def encode_words(self, text: str | NormalizedText) -> list[int]:
        """Ids of normalized text without added tokens: pre-tokenize, then BPE each pre-token (reference).
        Pieces are plain strings unless the pre-tokenizer must know positions (Metaspace "first")."""
        if isinstance(text, NormalizedText) and not self._needs_positions:
            text = text.text
        elif isinstance(text, str) and self._needs_positions:
            text = NormalizedText(text)
        out: list[int] = []
        tokenize = self.model.tokenize
        for word in self._words(text):
            out.extend(tokenize(text_of(word))[0])
        return out

    def _encode_one(self, text: str, skip_special: bool, track: bool) -> Encoding:
        enc = Encoding([], [] if track else None, [] if track else None)
        for nt, tid in self._segments(self._check_text(text), skip_special):
            if tid is not None:
                enc.ids.append(tid)
                if track:
                    enc.offsets.append(nt.span(0, len(nt.text)))
                    enc.tokens.append(nt.text)
                continue
            if not track:
                enc.ids.extend(self._fast.encode(nt.text) if self._fast is not None else self.encode_words(nt))
                continue
            for word in self._words(nt):
                ids, spans = self.model.tokenize(word.text)
                enc.ids.extend(ids)
                enc.offsets.extend(word.span(s, e) for s, e in spans)
                enc.tokens.extend(self.model.id_to_token(i) for i in ids)
        if track:
            enc.type_ids = [0] * len(enc.ids)
        return enc

    def encode_with_offsets(self, text: str, pair: str | None = None, *, add_special_tokens: bool = False) -> Encoding:
        """Ids, char offsets into the input, token strings and type ids (HF's Encoding)."""
        encs = [self._encode_one(t, False, True) for t in ([text] if pair is None else [text, pair])]
        return post_process(self.post_processor, encs, add_special_tokens)

    def encode(self, text: str, pair: str | None = None, *, add_special_tokens: bool = False) -> list[int]:
        """Text (and an optional second text) -> ids; added/special tokens in the text map to their ids.
        add_special_tokens=True applies the post-processor (e.g. BOS), like HF's default."""
        encs = [self._encode_one(t, False, False) for t in ([text] if pair is None else [text, pair])]
        if pair is None and (self.post_processor is None or not add_special_tokens):
            return encs[0].ids  # without special tokens a post-processor leaves a single text's ids as they are
        return post_process(self.post_processor, encs, add_special_tokens).ids

    def prompt_ids(self, text: str) -> list[int]:
        """Ids of a text to continue: the post-processor's leading tokens (e.g. BOS), then the text; never
        trailing ones such as EOS. Just the text for scratchlm's own tokenizers."""
        if self.post_processor is None:
            return self.encode(text)
        plain = self.encode(text)
        full = self.encode(text, add_special_tokens=True)
        lead = next((k for k in range(len(full) - len(plain) + 1) if full[k:k + len(plain)] == plain), 0)
        return full[:lead] + plain

    def encode_ordinary(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
        """Encode with special tokens' strings treated as plain text (HF's encode_special_tokens=True);
        non-special added tokens still match. add_special_tokens=True applies the post-processor (BOS...)."""
        enc = self._encode_one(text, True, False)
        if self.post_processor is None or not add_special_tokens:
            return enc.ids
        return post_process(self.post_processor, [enc], True).ids

    def encode_iterable(self, iterable: Iterable[str]) -> Iterator[int]:
        """Lazily encode a stream of strings (e.g. a file's lines) as one text (see stream_encode.py)."""
        return stream_encode.encode_stream(self, iterable)

    # -- decoding -----------------------------------------------------------------------------
    def id_to_token(self, i: int) -> str | None:
        """The token string of an id (an added token's normalized form), None if unknown."""
        t = self.added.pattern_of.get(i)
        return t if t is not None else self.model.id_to_token(i)

    def token_to_id(self, token: str) -> int | None:
        t = self.added.by_content.get(token)
        return t.id if t is not None else self.model.token_to_id(token)

    def _tokens(self, ids: Iterable[int], skip_special: bool) -> list[str]:
        out = []
        for i in ids:
            i = int(i)
            t = self.id_to_token(i)
            if t is None:
                raise ValueError(f"token id {i} is not in the vocabulary (vocab_size {self.vocab_size}); "
                                 "were these ids made by another tokenizer?")
            if not (skip_special and t in self.special_token_ids):  # by string, as HF (a normalized special
                out.append(t)                                     # token's normalized form is not skipped)
        return out

    def decode(self, ids: Iterable[int], *, skip_special_tokens: bool = False) -> str:
        """Ids -> text through the decoder; invalid UTF-8 (e.g. a cut multi-byte char) becomes U+FFFD."""
        if isinstance(self.decoder, TokenPieces) or (self.byte_level and not skip_special_tokens):
            return self.decode_bytes(ids, skip_special_tokens=skip_special_tokens).decode("utf-8", errors="replace")
        return decode_tokens(self.decoder, self._tokens(ids, skip_special_tokens))

    def decode_bytes(self, ids: Iterable[int], *, skip_special_tokens: bool = False) -> bytes:
        """The decoded bytes: exact for byte-level BPE and llama.cpp's token pieces; otherwise the UTF-8 of
        `decode`. skip_special_tokens: llama.cpp renders special tokens as nothing; byte-level drops them."""
        if isinstance(self.decoder, TokenPieces):
            return self.decoder.render(self._tokens(ids, False), skip_special_tokens)
        if skip_special_tokens:
            return self.decode(ids, skip_special_tokens=True).encode("utf-8")
        if self.byte_level:
            table = self.vocab
            ids = [int(i) for i in ids]
            try:
                return b"".join([table[i] for i in ids])
            except KeyError:
                self._tokens(ids, False)  # raises naming the unknown id
        return self.decode(ids).encode("utf-8")

    # -- persistence --------------------------------------------------------------------------
    def to_hf_dict(self) -> dict:
        """This tokenizer as a tokenizer.json dict."""
        return parts_to_dict(self.parts)

    def save_hf_json(self, path: str | Path) -> None:
        """Write `to_hf_dict()`; a warning names the texts HF may then tokenize differently (hf_form_risks)."""
        risks = self.hf_form_risks()["encode"]
        if risks:
            warnings.warn(f"{path} holds the HF form of this tokenizer, which can tokenize some texts differently: "
                          + "; ".join(risks), stacklevel=2)
        write_tokenizer_json(self.to_hf_dict(), path)

    def save(self, directory: str | Path) -> None:
        """scratchlm's readable files for its own byte-level BPEs (vocab_files.py); a tokenizer loaded from
        tokenizer.json is written back as DIR/tokenizer.json."""
        if self.native:
            vocab_files.save_tokenizer(self, directory)
        else:
            Path(directory).mkdir(parents=True, exist_ok=True)
            self.save_hf_json(Path(directory) / TOKENIZER_JSON)

    @classmethod
    def load(cls, directory: str | Path, *, impl: str = "reference") -> "Tokenizer":
        """scratchlm's files in `directory` if present, else its tokenizer.json (an HF model directory)."""
        d = Path(directory)
        if not (d / vocab_files.META_FILE).is_file() and (d / TOKENIZER_JSON).is_file():
            return cls.from_hf_json(d / TOKENIZER_JSON, impl=impl)
        vocab, merges, specials = vocab_files.load_tokenizer(d)
        return cls(vocab, merges, specials, impl=impl)
