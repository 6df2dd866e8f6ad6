"""One way to name a model: a scratchlm checkpoint dir, a Hugging Face dir or a `.gguf` file -> everything to run it.

    loaded = load_pretrained("path/to/SmolLM2-135M-Instruct.Q4_1.gguf")
    loaded.model, loaded.tokenizer          # TransformerLM (eval mode), scratchlm Tokenizer
    loaded.chat_template                    # the model's Jinja template, or None (scratchlm's ChatML)
    loaded.stop_token_ids                   # eos / end-of-turn ids (generation_config.json or GGUF metadata)
    loaded.sampling                         # SamplingParams defaults the model ships (generation_config / GGUF)
    print(loaded.summary())                 # gguf SmolLM2-135M-Instruct.Q4_1.gguf: llama 'Smollm2 ...', 134.5M params, ...

Kinds (`model_kind`): a file starting with the GGUF magic -> "gguf"; a directory whose config.json has
`model_type`/`architectures` -> "hf"; any other directory with config.json -> "scratchlm"; a directory
holding exactly one .gguf file and no config.json -> that file. Every CLI command's --checkpoint goes
through `load_pretrained`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from scratchlm.interop import model_extras
from scratchlm.interop.gguf_file import GGUFContents, is_gguf_file, read_gguf
from scratchlm.interop.gguf_load import load_gguf
from scratchlm.interop.gguf_tokenizer import (stop_token_ids_from_gguf, tokenizer_config_from_gguf,
                                             tokenizer_json_from_gguf)
from scratchlm.interop.pretrained import from_pretrained, is_hf_config, read_config_json
from scratchlm.interop.tokenizer_files import TOKENIZER_JSON
from scratchlm.io_utils import atomic_write_text
from scratchlm.model import TransformerLM
from scratchlm.tokenizer import Tokenizer
from scratchlm.tokenizer.formats import META_FILE
from scratchlm.tokenizer.pretrained import load_pretrained_tokenizer, pretrained_from_json

MODEL_KINDS = ("scratchlm", "hf", "gguf")


@dataclass
class LoadedModel:
    """A model with what it needs to run: tokenizer, chat template, stop ids, sampling defaults."""

    model: TransformerLM
    tokenizer: Any
    chat_template: str | None
    stop_token_ids: list[int]
    bos_token_id: int | None
    sampling: dict[str, float]
    kind: str
    path: Path
    family: str
    tokenizer_config: dict[str, Any] = field(default_factory=dict)
    generation_config: dict[str, Any] = field(default_factory=dict)
    weight_types: dict[str, int] = field(default_factory=dict)

    def summary(self) -> str:
        """One line: what was loaded (kind, family, params, dtype, context, template, stop tokens)."""
        params = sum(p.numel() for p in self.model.parameters())
        dtype = str(next(self.model.parameters()).dtype).removeprefix("torch.")
        stored = ", ".join(f"{n} {t}" for t, n in sorted(self.weight_types.items(), key=lambda kv: -kv[1]))
        template = "the model's own" if self.chat_template else "scratchlm ChatML (the model has none)"
        stops = [self.tokenizer.decode([i]) for i in self.stop_token_ids]
        return (f"{self.kind} {self.path.name}: {self.family}, {params / 1e6:.1f}M params, {dtype}"
                f"{f' (file tensors: {stored})' if stored else ''}, context {self.model.config.max_seq_len}, "
                f"chat template: {template}, stop tokens {stops}")


def model_kind(path: str | Path) -> tuple[str, Path]:
    """("scratchlm" | "hf" | "gguf", resolved path); clear errors for anything else."""
    path = Path(path)
    if path.is_file():
        if is_gguf_file(path):
            return "gguf", path
        raise ValueError(f"{path} is a file but not a GGUF file; pass a model directory (config.json + "
                         "model.safetensors) or a .gguf file")
    if not path.is_dir():
        raise FileNotFoundError(f"model path {path} does not exist (expected a checkpoint directory, an HF model "
                                "directory or a .gguf file)")
    if not (path / "config.json").is_file():
        ggufs = sorted(p for p in path.glob("*.gguf") if is_gguf_file(p))
        if len(ggufs) == 1:
            return "gguf", ggufs[0]
        if ggufs:
            raise ValueError(f"{path} holds {len(ggufs)} GGUF files ({', '.join(p.name for p in ggufs)}); name one")
    return ("hf" if is_hf_config(read_config_json(path)) else "scratchlm"), path


def _no_tokenizer(directory: Path) -> FileNotFoundError:
    return FileNotFoundError(
        f"{directory} holds no tokenizer (neither {TOKENIZER_JSON} nor scratchlm's {META_FILE}); copy the "
        "model's tokenizer.json (+ tokenizer_config.json) into it, pass --tokenizer DIR, or for a model you "
        f"trained yourself, train one with `scratchlm tokenizer train --out {directory}`")


def load_tokenizer_dir(directory: str | Path, prefer_hf: bool = True) -> Tokenizer:
    """The tokenizer in a model directory: tokenizer.json (HF) or scratchlm's files, whichever is there,
    with the directory's chat template and special tokens attached (tokenizer.chat_template)."""
    directory = Path(directory)
    if not (directory / TOKENIZER_JSON).is_file() and not (directory / META_FILE).is_file():
        raise _no_tokenizer(directory)
    return load_pretrained_tokenizer(directory, prefer_hf=prefer_hf).tokenizer


def gguf_tokenizer(metadata: dict[str, Any]) -> Tokenizer:
    """The byte-level BPE tokenizer a GGUF file describes (via its tokenizer.json form), with its chat
    template and special tokens attached."""
    return pretrained_from_json(tokenizer_json_from_gguf(metadata), tokenizer_config_from_gguf(metadata)).tokenizer


def _template_source(tokenizer: Any) -> str | None:
    """The Jinja source of the chat template the tokenizer loaders attached (None: scratchlm's ChatML)."""
    template = getattr(tokenizer, "chat_template", None)
    return template.source if template is not None else None


def _token_id(tokenizer: Any, text: str) -> int | None:
    return (getattr(tokenizer, "special_token_ids", None) or {}).get(text)


def _load_gguf_kind(path: Path, contents: GGUFContents, tokenizer: Any, **kw: Any) -> LoadedModel:
    meta = contents.metadata
    model = load_gguf(path, contents=contents, **kw)
    tok = tokenizer if tokenizer is not None else gguf_tokenizer(meta)
    counts: dict[str, int] = {}
    for t in contents.tensors.values():
        counts[t.type_name] = counts.get(t.type_name, 0) + 1
    name = meta.get("general.name")
    family = f"{meta['general.architecture']}{f' {name!r}' if name else ''}"
    stops, bos = stop_token_ids_from_gguf(meta), meta.get("tokenizer.ggml.bos_token_id")
    sampling = model_extras.sampling_from_gguf(meta)
    generation = {"bos_token_id": bos, "eos_token_id": stops, **sampling, **({"do_sample": True} if sampling else {})}
    tok_config = tokenizer_config_from_gguf(meta) if tokenizer is None else {}
    return LoadedModel(model, tok, _template_source(tok), stops, bos, sampling, "gguf", path, family, tok_config,
                       generation, counts)


def load_pretrained(path: str | Path, *, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
                    tokenizer: str | Path | None = None, keep_quantized: bool = True, progress: bool = False,
                    **config_overrides: Any) -> LoadedModel:
    """Load a scratchlm checkpoint dir, an HF dir or a GGUF file with its tokenizer and chat metadata.

    tokenizer: a directory whose tokenizer replaces the model's own. keep_quantized: attach a GGUF
    file's ggml blocks as model.quantized_weights (see gguf_load). config_overrides: e.g. attn_impl.
    """
    kind, path = model_kind(path)
    tok = load_tokenizer_dir(tokenizer, prefer_hf=True) if tokenizer is not None else None
    if kind == "gguf":
        loaded = _load_gguf_kind(path, read_gguf(path), tok, device=device, dtype=dtype,
                                 keep_quantized=keep_quantized, progress=progress, **config_overrides)
    else:
        model = from_pretrained(path, device=device, dtype=dtype, progress=progress, **config_overrides).eval()
        tok = tok if tok is not None else load_tokenizer_dir(path, prefer_hf=kind == "hf")
        data = read_config_json(path)
        stops = model_extras.stop_ids_from_dir(path, lambda text: _token_id(tok, text))
        family = data.get("model_type", "scratchlm") if kind == "hf" else "scratchlm"
        template = _template_source(tok)
        tok_config = {} if tokenizer is not None else model_extras.tokenizer_config(path)
        if template and tokenizer is None:
            tok_config.setdefault("chat_template", template)  # also when it came from chat_template.jinja
        loaded = LoadedModel(model, tok, template, stops, data.get("bos_token_id") if kind == "hf" else None,
                             model_extras.sampling_from_dir(path), kind, path, family, tok_config,
                             model_extras.generation_config(path))
    _check_vocab(loaded)
    return loaded


def write_model_extras(loaded: LoadedModel, directory: str | Path) -> list[str]:
    """Write the loaded model's tokenizer_config.json (chat template, special tokens) and
    generation_config.json (eos ids, sampling defaults) into `directory`; returns the names written.

    With the weights (save_model / save_pretrained) and the tokenizer (Tokenizer.save) this makes a
    fine-tuned or converted copy that chats exactly like the model it came from."""
    directory = Path(directory)
    written = []
    for name, data in ((model_extras.TOKENIZER_CONFIG, loaded.tokenizer_config),
                       (model_extras.GENERATION_CONFIG, loaded.generation_config)):
        if data:
            atomic_write_text(directory / name, json.dumps(data, indent=2, ensure_ascii=False) + "\n")
            written.append(name)
    return written


def _check_vocab(loaded: LoadedModel) -> None:
    if loaded.tokenizer.vocab_size > loaded.model.config.vocab_size:
        raise ValueError(f"the tokenizer has {loaded.tokenizer.vocab_size} tokens but the model in {loaded.path} only "
                         f"{loaded.model.config.vocab_size}; pass the tokenizer the model was trained with "
                         "(--tokenizer DIR)")
    if not loaded.stop_token_ids:
        from scratchlm.generate.streaming import default_stop_ids

        loaded.stop_token_ids = default_stop_ids(loaded.tokenizer)
