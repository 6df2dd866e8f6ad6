"""GGUF tokenizer metadata (`tokenizer.ggml.*`, `tokenizer.chat_template`) -> tokenizer.json + tokenizer_config.json dicts.

A GGUF stores a byte-level BPE tokenizer (`tokenizer.ggml.model = "gpt2"`) as arrays:
    tokens       id -> text (normal tokens spelled in GPT-2's byte->unicode alphabet, added tokens as is)
    merges       "left right" in rank order
    token_type   1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte
    pre          the pre-tokenizer's name (see gguf_pretokenize)
    bos/eos/eot/eom/unknown/padding_token_id, add_bos_token, add_eos_token
The tokenizer.json built here is what HF `tokenizers` would hold for the same model: model BPE (vocab,
merges, ignore_merges), control tokens as special added tokens and user-defined ones as plain added
tokens (both matched whole in text, as llama.cpp does), llama.cpp's regexes as Split pre-tokenizers +
ByteLevel, a ByteLevel decoder, and a BOS/EOS TemplateProcessing post-processor when the file asks for
BOS/EOS. tokenizer_config carries the chat template and the special tokens by text.
"""

from __future__ import annotations

from typing import Any

from scratchlm.interop.gguf.pre_tokenizer_names import gguf_pre_tokenizer

CONTROL, USER_DEFINED, UNKNOWN = 3, 4, 2
_BYTE_LEVEL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}
# tokenizer_config.json name -> GGUF id key
SPECIAL_KEYS = {"bos_token": "bos_token_id", "eos_token": "eos_token_id", "unk_token": "unknown_token_id",
                "pad_token": "padding_token_id"}
# ids that end a reply: eos, end-of-turn, end-of-message
STOP_KEYS = ("eos_token_id", "eot_token_id", "eom_token_id")


def _tokens(metadata: dict[str, Any]) -> list[str]:
    model = metadata.get("tokenizer.ggml.model")
    if model != "gpt2":
        raise ValueError(f"GGUF tokenizer.ggml.model={model!r} is not supported by scratchlm: only 'gpt2' "
                         "(byte-level BPE) tokenizers can be loaded from GGUF metadata")
    tokens = metadata.get("tokenizer.ggml.tokens")
    if not tokens or "tokenizer.ggml.merges" not in metadata:
        raise ValueError("GGUF file lacks tokenizer.ggml.tokens or tokenizer.ggml.merges; it carries no tokenizer")
    return tokens


def _token_id(metadata: dict[str, Any], key: str, n_tokens: int) -> int | None:
    value = metadata.get(f"tokenizer.ggml.{key}")
    if value is None:
        return None
    if not 0 <= int(value) < n_tokens:
        raise ValueError(f"GGUF tokenizer.ggml.{key}={value} is outside the vocabulary [0, {n_tokens})")
    return int(value)


def _added_tokens(tokens: list[str], types: list[int]) -> list[dict[str, Any]]:
    kinds = {CONTROL: True, UNKNOWN: True, USER_DEFINED: False}
    return [{"id": i, "content": tokens[i], "single_word": False, "lstrip": False, "rstrip": False,
             "normalized": False, "special": kinds[t]} for i, t in enumerate(types) if t in kinds]


def _post_processor(metadata: dict[str, Any], tokens: list[str]) -> dict[str, Any] | None:
    """TemplateProcessing adding BOS / EOS around each sequence when the file says so (else None)."""
    n = len(tokens)
    ends = []
    for key, where in (("bos_token_id", "front"), ("eos_token_id", "back")):
        add = metadata.get(f"tokenizer.ggml.add_{key.removesuffix('_id')}")
        tid = _token_id(metadata, key, n)
        if add and tid is not None:
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


def tokenizer_json_from_gguf(metadata: dict[str, Any]) -> dict[str, Any]:
    """The tokenizer.json dict (HF `tokenizers` layout) of the GGUF's byte-level BPE tokenizer."""
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


def tokenizer_config_from_gguf(metadata: dict[str, Any]) -> dict[str, Any]:
    """The tokenizer_config.json dict: special tokens by text, add_bos/add_eos, the chat template."""
    tokens = _tokens(metadata)
    config: dict[str, Any] = {"tokenizer_class": "PreTrainedTokenizerFast"}
    for name, key in SPECIAL_KEYS.items():
        tid = _token_id(metadata, key, len(tokens))
        if tid is not None:
            config[name] = tokens[tid]
    config["add_bos_token"] = bool(metadata.get("tokenizer.ggml.add_bos_token", False))
    config["add_eos_token"] = bool(metadata.get("tokenizer.ggml.add_eos_token", False))
    if metadata.get("tokenizer.chat_template"):
        config["chat_template"] = metadata["tokenizer.chat_template"]
    return config


def stop_token_ids_from_gguf(metadata: dict[str, Any]) -> list[int]:
    """The ids that end a reply (eos, end-of-turn, end-of-message), in that order, without repeats."""
    n = len(metadata.get("tokenizer.ggml.tokens") or [])
    ids = [_token_id(metadata, key, n) for key in STOP_KEYS]
    return list(dict.fromkeys(i for i in ids if i is not None))


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
