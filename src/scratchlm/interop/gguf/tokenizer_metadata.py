"""GGUF tokenizer metadata (`tokenizer.ggml.*`, `tokenizer.chat_template`) -> scratchlm tokenizers.

A GGUF stores its tokenizer as arrays:
    model        "gpt2" (byte-level BPE) or "llama" (SentencePiece: Llama-2, TinyLlama, Mistral-7B, Phi-3, Gemma)
    tokens       id -> text (byte-level: GPT-2's byte->unicode alphabet; SentencePiece: "▁" for spaces)
    merges       "left right" in rank order (byte-level only; llama.cpp ignores them for "llama")
    scores       SentencePiece: one score per token, the higher merged first
    token_type   1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte ("<0xNN>")
    pre          the byte-level pre-tokenizer's name (see pre_tokenizer_names)
    bos/eos/eot/eom/unknown/padding_token_id, add_bos_token, add_eos_token, add_space_prefix
Byte-level BPE becomes the tokenizer.json HF `tokenizers` would hold for the same model: model BPE (vocab,
merges, ignore_merges), control tokens as special added tokens and user-defined ones as plain added
tokens (both matched whole in text, as llama.cpp does), llama.cpp's regexes as Split pre-tokenizers +
ByteLevel, a ByteLevel decoder, and a BOS/EOS TemplateProcessing post-processor when the file asks for
BOS/EOS.

SentencePiece vocabularies run llama.cpp's own algorithm (`spm_tokenizer_parts`): token attributes from the
types plus llama.cpp's overrides by text (end-of-generation texts become control tokens, ...; Phi-3's
rstrip by general.name), its longest-first special-token partition, "▁" prefix + space escaping per text
fragment, the SentencePiece-BPE model by scores and its token pieces as decoder: the same ids and bytes as
llama.cpp on every text. Their tokenizer.json (`tokenizer_json_from_gguf`) is the HF form (a BPE with merges
derived from the scores, spec'd in tokenizer/score_merges.py); `Tokenizer.hf_form_risks()` says when that
form can differ. tokenizer_config carries the chat template and the special tokens by text.
"""

from __future__ import annotations

from typing import Any

from scratchlm.interop.gguf.pre_tokenizer_names import gguf_pre_tokenizer
from scratchlm.tokenizer.added_tokens import AddedToken
from scratchlm.tokenizer.byte_fallback import parse_byte_token
from scratchlm.tokenizer.hf_files import PretrainedTokenizer, pretrained_from_json, pretrained_from_parts
from scratchlm.tokenizer.hf_json import TokenizerParts, parts_to_dict
from scratchlm.tokenizer.normalizers import Prepend, Replace, Sequence
from scratchlm.tokenizer.post_processors import TemplateProcessing
from scratchlm.tokenizer.sentencepiece_bpe import SentencePieceBPE
from scratchlm.tokenizer.token_attributes import (AUTO_IDS, FIM_ALIASES, HIDDEN, MATCHED, eog_ids, piece, strip_ids,
                                                  token_attributes)
from scratchlm.tokenizer.token_pieces import TokenPieces

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6  # tokenizer.ggml.token_type
_BYTE_LEVEL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}
# tokenizer_config.json name -> GGUF id key
SPECIAL_KEYS = {"bos_token": "bos_token_id", "eos_token": "eos_token_id", "unk_token": "unknown_token_id",
                "pad_token": "padding_token_id"}
# ids that end a reply: eos, end-of-turn, end-of-message
STOP_KEYS = ("eos_token_id", "eot_token_id", "eom_token_id")
SPM_DEFAULT_IDS = {"bos_token_id": 1, "eos_token_id": 2, "unknown_token_id": 0}  # llama.cpp's, for "llama"


def _model(metadata: dict[str, Any]) -> str:
    model = metadata.get("tokenizer.ggml.model")
    if model not in ("gpt2", "llama"):
        raise ValueError(f"GGUF tokenizer.ggml.model={model!r} is not supported by scratchlm: only 'gpt2' "
                         "(byte-level BPE) and 'llama' (SentencePiece) tokenizers can be loaded from GGUF metadata")
    return model


def _tokens(metadata: dict[str, Any]) -> list[str]:
    """The token texts; llama.cpp names an empty one "[EMPTY_<id>]" and refuses repeated texts."""
    model = _model(metadata)
    tokens = metadata.get("tokenizer.ggml.tokens")
    if not tokens or (model == "gpt2" and "tokenizer.ggml.merges" not in metadata):
        raise ValueError("GGUF file lacks tokenizer.ggml.tokens or tokenizer.ggml.merges; it carries no tokenizer")
    if model == "gpt2":
        return tokens
    tokens = [t or f"[EMPTY_{i}]" for i, t in enumerate(tokens)]
    seen: dict[str, int] = {}
    for i, t in enumerate(tokens):
        if seen.setdefault(t, i) != i:
            raise ValueError(f"GGUF tokenizer.ggml.tokens[{seen[t]}] and [{i}] are both {t!r}; a vocabulary needs "
                             "unique token texts (llama.cpp aborts on this file)")
    return tokens


def _token_id(metadata: dict[str, Any], key: str, n_tokens: int) -> int | None:
    """The id under tokenizer.ggml.<key>; for SentencePiece files llama.cpp's default when the key is absent."""
    value = metadata.get(f"tokenizer.ggml.{key}")
    if value is None:
        default = SPM_DEFAULT_IDS.get(key) if metadata.get("tokenizer.ggml.model") == "llama" else None
        return default if default is not None and default < n_tokens else None
    if not 0 <= int(value) < n_tokens:
        raise ValueError(f"GGUF tokenizer.ggml.{key}={value} is outside the vocabulary [0, {n_tokens})")
    return int(value)


def _add_flag(metadata: dict[str, Any], which: str) -> bool:
    """add_bos_token / add_eos_token, with llama.cpp's defaults: BOS for SentencePiece and the Llama-3 /
    Tekken pre-tokenizer names, never EOS."""
    value = metadata.get(f"tokenizer.ggml.add_{which}_token")
    if value is not None:
        return bool(value)
    if which == "bos":
        return _model(metadata) == "llama" or gguf_pre_tokenizer(metadata.get("tokenizer.ggml.pre")).add_bos
    return False


def _added_tokens(tokens: list[str], types: list[int]) -> list[dict[str, Any]]:
    kinds = {CONTROL: True, UNKNOWN: True, USER_DEFINED: False}
    return [{"id": i, "content": tokens[i], "single_word": False, "lstrip": False, "rstrip": False,
             "normalized": False, "special": kinds[t]} for i, t in enumerate(types) if t in kinds]


def _post_processor(metadata: dict[str, Any], tokens: list[str]) -> dict[str, Any] | None:
    """TemplateProcessing adding BOS / EOS around each sequence when the file says so (else None)."""
    n = len(tokens)
    ends = []
    for key, where in (("bos_token_id", "front"), ("eos_token_id", "back")):
        tid = _token_id(metadata, key, n)
        if _add_flag(metadata, key[:3]) and tid is not None:
            ends.append((where, tokens[tid], tid))
    if not ends:
        return None
    front = [{"SpecialToken": {"id": t, "type_id": 0}} for w, t, _ in ends if w == "front"]
    back = [{"SpecialToken": {"id": t, "type_id": 0}} for w, t, _ in ends if w == "back"]
    seq = [{"Sequence": {"id": "A", "type_id": 0}}]
    pair = [{"Sequence": {"id": "B", "type_id": 1}}]
    specials = {t: {"id": t, "ids": [i], "tokens": [t]} for _, t, i in ends}
    return {"type": "TemplateProcessing", "single": front + seq + back,
            "pair": front + seq + back + front + pair + back, "special_tokens": specials}


def _bpe_tokenizer_json(metadata: dict[str, Any]) -> dict[str, Any]:
    tokens = _tokens(metadata)
    types = list(metadata.get("tokenizer.ggml.token_type") or [1] * len(tokens))
    if len(types) != len(tokens):
        raise ValueError(f"GGUF tokenizer.ggml.token_type has {len(types)} entries for {len(tokens)} tokens")
    pre = gguf_pre_tokenizer(metadata.get("tokenizer.ggml.pre"))
    merges = []
    for n, m in enumerate(metadata["tokenizer.ggml.merges"]):
        left, sep, right = m.partition(" ")
        if not sep or not left or not right or " " in right:
            raise ValueError(f"GGUF tokenizer.ggml.merges[{n}]={m!r} is not 'left right'")
        merges.append([left, right])
    splits = [{"type": "Split", "pattern": {"Regex": r}, "behavior": "Isolated", "invert": False}
              for r in pre.regexes]
    return {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": _added_tokens(tokens, types),
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [*splits, dict(_BYTE_LEVEL)]},
        "post_processor": _post_processor(metadata, tokens),
        "decoder": dict(_BYTE_LEVEL, use_regex=True),
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                  "ignore_merges": pre.ignore_merges, "vocab": {t: i for i, t in enumerate(tokens)},
                  "merges": merges},
    }


def _spm_arrays(metadata: dict[str, Any], tokens: list[str]) -> tuple[list[float], list[int]]:
    """Scores (absent: all 0) and types (absent: all normal); llama.cpp reads the first len(tokens) entries."""
    n = len(tokens)
    scores = metadata.get("tokenizer.ggml.scores")
    types = metadata.get("tokenizer.ggml.token_type")
    for key, arr in (("scores", scores), ("token_type", types)):
        if arr is not None and len(arr) < n:
            raise ValueError(f"GGUF tokenizer.ggml.{key} has {len(arr)} entries for {n} tokens")
    types = [int(t) for t in types[:n]] if types is not None else [NORMAL] * n
    odd = [tokens[i] for i, t in enumerate(types) if t == BYTE and parse_byte_token(tokens[i]) is None]
    if odd:
        raise ValueError(f"GGUF tokens {odd[:4]} are typed byte but are not spelled <0xNN>; scratchlm reads byte "
                         "tokens as <0xNN> only")
    return ([float(x) for x in scores[:n]] if scores is not None else [0.0] * n), types


def _spm_ids(metadata: dict[str, Any], n: int) -> dict[str, int | None]:
    """The special ids llama.cpp reads (the older prefix/suffix/middle keys win over fim_pre/suf/mid)."""
    ids = {key: _token_id(metadata, key, n) for key in ("eos_token_id", *AUTO_IDS)}
    for old, key in FIM_ALIASES.items():
        if (tid := _token_id(metadata, old, n)) is not None:
            ids[key] = tid
    return ids


def spm_tokenizer_parts(metadata: dict[str, Any]) -> TokenizerParts:
    """The pipeline stages of a SentencePiece ("llama") GGUF vocabulary, exact to llama.cpp (module docstring)."""
    tokens = _tokens(metadata)
    scores, types = _spm_arrays(metadata, tokens)
    n = len(tokens)
    attrs = token_attributes(tokens, types, _spm_ids(metadata, n))
    lstrip, rstrip = strip_ids(tokens, attrs, metadata.get("general.name") or "",
                               metadata.get("tokenizer.ggml.pre") or "", metadata.get("general.architecture") or "")
    added = [AddedToken(tokens[i], i, special=bool(a & HIDDEN), lstrip=i in lstrip, rstrip=i in rstrip)
             for i, a in enumerate(attrs) if a & MATCHED]
    space = bool(metadata.get("tokenizer.ggml.add_space_prefix", True))
    unk = _token_id(metadata, "unknown_token_id", n)
    post = _post_processor(metadata, tokens)
    return TokenizerParts(
        model=SentencePieceBPE(tokens, scores, unk_token=tokens[unk] if unk is not None else None),
        normalizer=Sequence([Prepend("▁"), Replace(" ", "▁")]) if space else Replace(" ", "▁"),
        post_processor=TemplateProcessing.from_json(post, "post_processor") if post else None,
        decoder=TokenPieces({t: piece(t, a) for t, a in zip(tokens, attrs)},
                            {t for t, a in zip(tokens, attrs) if a & HIDDEN}, space),
        added_tokens=added, added_matching="longest_first")


def tokenizer_json_from_gguf(metadata: dict[str, Any]) -> dict[str, Any]:
    """The tokenizer.json dict (HF `tokenizers` layout) of the GGUF's tokenizer (for SentencePiece files the
    HF form, see the module docstring)."""
    if _model(metadata) == "llama":
        return parts_to_dict(spm_tokenizer_parts(metadata))
    return _bpe_tokenizer_json(metadata)


def pretrained_from_gguf(metadata: dict[str, Any]) -> PretrainedTokenizer:
    """The GGUF's tokenizer with its config, chat template and special tokens: the byte-level BPE through its
    tokenizer.json, a SentencePiece vocabulary through llama.cpp's stages (spm_tokenizer_parts)."""
    config = tokenizer_config_from_gguf(metadata)
    if _model(metadata) == "llama":
        return pretrained_from_parts(spm_tokenizer_parts(metadata), config, add_named_tokens=False)
    return pretrained_from_json(_bpe_tokenizer_json(metadata), config)


def tokenizer_config_from_gguf(metadata: dict[str, Any]) -> dict[str, Any]:
    """The tokenizer_config.json dict: special tokens by text, add_bos/add_eos, the chat template."""
    tokens = _tokens(metadata)
    config: dict[str, Any] = {"tokenizer_class": "PreTrainedTokenizerFast"}
    for name, key in SPECIAL_KEYS.items():
        tid = _token_id(metadata, key, len(tokens))
        if tid is not None:
            config[name] = tokens[tid]
    config["add_bos_token"] = _add_flag(metadata, "bos")
    config["add_eos_token"] = _add_flag(metadata, "eos")
    if metadata.get("tokenizer.chat_template"):
        config["chat_template"] = metadata["tokenizer.chat_template"]
    return config


def stop_token_ids_from_gguf(metadata: dict[str, Any]) -> list[int]:
    """The ids that end a reply, as llama.cpp's end-of-generation set (token_attributes.eog_ids): eos,
    end-of-turn, end-of-message first (in that order), then the other end-of-generation tokens the
    vocabulary has (e.g. Gemma's <end_of_turn>, <|endoftext|> beside <|im_end|>) by id; no repeats."""
    tokens = list(metadata.get("tokenizer.ggml.tokens") or [])
    n = len(tokens)
    ids = [_token_id(metadata, key, n) for key in STOP_KEYS]
    types = list(metadata.get("tokenizer.ggml.token_type") or [1] * n)
    eog = eog_ids(tokens, types, _spm_ids(metadata, n)) if len(types) == n else set()
    return list(dict.fromkeys([*(i for i in ids if i is not None), *sorted(eog)]))


def _token_list(tokenizer_json: dict[str, Any], vocab_size: int) -> tuple[list[str], list[int]]:
    """Tokens by id and their llama.cpp types; ids past the tokenizer up to vocab_size become [PAD{i}] (unused)."""
    by_id: dict[int, str] = {int(i): t for t, i in tokenizer_json["model"]["vocab"].items()}
    types: dict[int, int] = {}
    for a in tokenizer_json.get("added_tokens", []):
        by_id[int(a["id"])] = a["content"]
        types[int(a["id"])] = CONTROL if a.get("special") else USER_DEFINED
    n = max(vocab_size, max(by_id) + 1)
    missing = [i for i in range(max(by_id) + 1) if i not in by_id]
    if missing:
        raise ValueError(f"the tokenizer has no token for ids {missing[:5]}; GGUF needs one token per id")
    tokens = [by_id.get(i, f"[PAD{i}]") for i in range(n)]
    return tokens, [types.get(i, 1 if i in by_id else 5) for i in range(n)]


def gguf_tokenizer_metadata(tokenizer_json: dict[str, Any], vocab_size: int, chat_template: str | None = None,
                            bos_token_id: int | None = None, stop_token_ids: list[int] | None = None
                            ) -> dict[str, tuple[Any, Any]]:
    """`tokenizer.ggml.*` metadata {key: (value, GGUFValueType)} for a byte-level BPE tokenizer.json dict
    (the inverse of tokenizer_json_from_gguf)."""
    import gguf

    from scratchlm.interop.gguf.pre_tokenizer_names import gguf_pre_name

    model = tokenizer_json.get("model") or {}
    if model.get("type") != "BPE" or model.get("byte_fallback") or tokenizer_json.get("normalizer") not in (
            None, {"type": "NFC"}):
        raise ValueError("GGUF export writes byte-level BPE tokenizers (tokenizer.ggml.model 'gpt2') only; this "
                         f"one has model {model.get('type')!r}, byte_fallback={model.get('byte_fallback')}, "
                         f"normalizer {tokenizer_json.get('normalizer')}")
    tokens, types = _token_list(tokenizer_json, vocab_size)
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    S, U32, B, A = (gguf.GGUFValueType.STRING, gguf.GGUFValueType.UINT32, gguf.GGUFValueType.BOOL,
                    gguf.GGUFValueType.ARRAY)
    post = tokenizer_json.get("post_processor") or {}
    single = post.get("single", []) if post.get("type") == "TemplateProcessing" else []
    meta: dict[str, tuple[Any, Any]] = {
        "tokenizer.ggml.model": ("gpt2", S), "tokenizer.ggml.pre": (gguf_pre_name(tokenizer_json.get("pre_tokenizer")), S),
        "tokenizer.ggml.tokens": (tokens, A), "tokenizer.ggml.token_type": (types, A), "tokenizer.ggml.merges": (merges, A),
        "tokenizer.ggml.add_bos_token": (bool(single) and "SpecialToken" in single[0], B),
        "tokenizer.ggml.add_eos_token": (bool(single) and "SpecialToken" in single[-1], B),
    }
    stops = list(stop_token_ids or [])
    for key, tid in (("bos_token_id", bos_token_id), ("eos_token_id", stops[0] if stops else None),
                     ("eot_token_id", stops[1] if len(stops) > 1 else None)):
        if tid is not None:
            meta[f"tokenizer.ggml.{key}"] = (int(tid), U32)
    if chat_template:
        meta["tokenizer.chat_template"] = (chat_template, S)
    return meta
