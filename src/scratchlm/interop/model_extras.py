"""What travels beside a model's weights: chat template, end-of-reply token ids, generation defaults.

    source           chat template                                   stop ids                        sampling defaults
    HF / scratchlm   tokenizer_config.json "chat_template" (a str,   generation_config.json and      generation_config.json
    directory        or the "default" of a named list), else         config.json eos_token_id (int   (do_sample false -> greedy)
                     chat_template.jinja                             or list), tokenizer_config
                                                                     eos_token
    GGUF             tokenizer.chat_template                         tokenizer.ggml.eos / eot / eom  general.sampling.*
A model with no template of its own is chatted with scratchlm's ChatML (`tokenizer.chat_template`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

TOKENIZER_CONFIG, GENERATION_CONFIG, TEMPLATE_FILE = "tokenizer_config.json", "generation_config.json", "chat_template.jinja"
# generation_config.json field -> SamplingParams field (values must be numbers)
_HF_SAMPLING = {"temperature": "temperature", "top_k": "top_k", "top_p": "top_p", "min_p": "min_p",
                "repetition_penalty": "repetition_penalty"}
_GGUF_SAMPLING = {"general.sampling.temp": "temperature", "general.sampling.top_k": "top_k",
                  "general.sampling.top_p": "top_p", "general.sampling.min_p": "min_p",
                  "general.sampling.penalty_repeat": "repetition_penalty"}


def _json(path: Path) -> dict[str, Any]:
    """The JSON object in `path`, {} when the file is absent; ValueError naming a corrupt file."""
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not valid JSON ({exc}); the file is corrupt") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path} must hold a JSON object, got {type(data).__name__}")
    return data


def tokenizer_config(directory: Path) -> dict[str, Any]:
    return _json(directory / TOKENIZER_CONFIG)


def chat_template_from_dir(directory: Path) -> str | None:
    """The model's Jinja chat template, or None when the directory has none."""
    template = tokenizer_config(directory).get("chat_template")
    if isinstance(template, list):  # [{"name": "default", "template": ...}, {"name": "tool_use", ...}]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    if isinstance(template, str) and template:
        return template
    path = directory / TEMPLATE_FILE
    return path.read_text(encoding="utf-8") if path.is_file() else None


def _ids(value: Any) -> list[int]:
    if isinstance(value, bool) or value is None:
        return []
    if isinstance(value, int):
        return [value]
    if isinstance(value, list):
        return [v for v in value if isinstance(v, int) and not isinstance(v, bool)]
    return []


def stop_ids_from_dir(directory: Path, token_id: Any) -> list[int]:
    """eos ids from generation_config.json, config.json and tokenizer_config.json's eos_token (by text).

    token_id: callable text -> id or None (the tokenizer's lookup)."""
    ids = _ids(_json(directory / GENERATION_CONFIG).get("eos_token_id"))
    ids += _ids(_json(directory / "config.json").get("eos_token_id"))
    eos = tokenizer_config(directory).get("eos_token")
    if isinstance(eos, dict):  # {"content": "<|im_end|>", ...}
        eos = eos.get("content")
    if isinstance(eos, str):
        ids += _ids(token_id(eos))
    return list(dict.fromkeys(ids))


def generation_config(directory: Path) -> dict[str, Any]:
    """generation_config.json as a dict ({} when absent)."""
    return _json(directory / GENERATION_CONFIG)


def sampling_from_dir(directory: Path) -> dict[str, float]:
    """SamplingParams defaults from generation_config.json ({} when there is none)."""
    gen = generation_config(directory)
    out = {ours: gen[hf] for hf, ours in _HF_SAMPLING.items() if isinstance(gen.get(hf), (int, float))}
    if gen and not gen.get("do_sample", False):
        out["temperature"] = 0.0  # HF samples only with do_sample=true; greedy otherwise
    return out


def sampling_from_gguf(metadata: dict[str, Any]) -> dict[str, float]:
    return {ours: metadata[key] for key, ours in _GGUF_SAMPLING.items() if isinstance(metadata.get(key), (int, float))}
