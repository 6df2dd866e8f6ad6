"""What travels beside a model's weights: end-of-reply token ids, generation defaults, tokenizer_config.json
(read here, and written back beside a converted or fine-tuned copy by `write_model_extras`).

    source           stop ids                                           sampling defaults
    HF / scratchlm   generation_config.json and config.json eos_token_id generation_config.json
    directory        (int or list), tokenizer_config.json eos_token      (do_sample false -> greedy)
    GGUF             tokenizer.ggml.eos / eot / eom (gguf_tokenizer)      general.sampling.*
The chat template is read with the tokenizer (scratchlm.tokenizer.hf_files: tokenizer_config.json,
chat_template.jinja, or GGUF's tokenizer.chat_template) and attached to it as `tokenizer.chat_template`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scratchlm.io_utils import atomic_write_text, read_json_object

if TYPE_CHECKING:
    from scratchlm.load.loaded_model import LoadedModel

TOKENIZER_CONFIG, GENERATION_CONFIG = "tokenizer_config.json", "generation_config.json"
# generation_config.json field -> SamplingParams field (values must be numbers)
_HF_SAMPLING = {"temperature": "temperature", "top_k": "top_k", "top_p": "top_p", "min_p": "min_p",
                "repetition_penalty": "repetition_penalty"}
_GGUF_SAMPLING = {"general.sampling.temp": "temperature", "general.sampling.top_k": "top_k",
                  "general.sampling.top_p": "top_p", "general.sampling.min_p": "min_p",
                  "general.sampling.penalty_repeat": "repetition_penalty"}


def _json(path: Path) -> dict[str, Any]:
    """The JSON object in `path`, {} when the file is absent; ValueError naming a corrupt file."""
    return read_json_object(path, str(path)) if path.is_file() else {}


def tokenizer_config(directory: Path) -> dict[str, Any]:
    return _json(directory / TOKENIZER_CONFIG)


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


def write_model_extras(loaded: "LoadedModel", directory: str | Path) -> list[str]:
    """Write the loaded model's tokenizer_config.json (chat template, special tokens) and
    generation_config.json (eos ids, sampling defaults) into `directory`; returns the names written.

    With the weights (save_model / save_pretrained) and the tokenizer (Tokenizer.save) this makes a
    fine-tuned or converted copy that chats exactly like the model it came from."""
    directory = Path(directory)
    written = []
    for name, data in ((TOKENIZER_CONFIG, loaded.tokenizer_config), (GENERATION_CONFIG, loaded.generation_config)):
        if data:
            atomic_write_text(directory / name, json.dumps(data, indent=2, ensure_ascii=False) + "\n")
            written.append(name)
    return written
