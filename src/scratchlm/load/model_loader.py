"""One way to name a model: a scratchlm checkpoint dir, a Hugging Face dir, a `.gguf` file or a PEFT
adapter dir -> everything to run it.

    loaded = load_pretrained("path/to/SmolLM2-135M-Instruct.Q4_1.gguf")
    loaded.model, loaded.tokenizer          # TransformerLM (eval mode), scratchlm Tokenizer
    loaded.chat_template                    # the model's Jinja template, or None (scratchlm's ChatML)
    loaded.stop_token_ids                   # eos / end-of-turn ids (generation_config.json or GGUF metadata)
    loaded.sampling                         # SamplingParams defaults the model ships (generation_config / GGUF)
    print(loaded.summary())                 # gguf SmolLM2-135M-Instruct.Q4_1.gguf: llama 'Smollm2 ...', 134.5M params, ...
    model = from_pretrained(path)           # the model alone, from any of the same paths

The kind of a path is decided once, in load/kinds.py. A PEFT adapter directory loads the base model its
adapter_config.json names (base_model_name_or_path, itself any kind of path) with the adapter merged in.
Every CLI command's --checkpoint goes through `load_pretrained`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from scratchlm.interop.gguf.model_load import load_gguf
from scratchlm.interop.gguf.reader import GGUFContents, read_gguf
from scratchlm.interop.gguf.tokenizer_metadata import stop_token_ids_from_gguf, tokenizer_config_from_gguf
from scratchlm.interop.hf.model_dir import load_hf_dir, read_config_json
from scratchlm.interop.hf.peft_adapter import load_adapter, read_adapter_config
from scratchlm.load import generation_config
from scratchlm.load.kinds import model_kind
from scratchlm.load.loaded_model import LoadedModel
from scratchlm.load.tokenizers import gguf_tokenizer, load_tokenizer_dir, special_token_id, template_source
from scratchlm.model import TransformerLM
from scratchlm.model_files import load_model
from scratchlm.nn.lora import merge_lora
from scratchlm.tokenizer.chat.render import default_stop_ids


def _adapter_base(path: Path) -> str:
    base = read_adapter_config(path).get("base_model_name_or_path")
    if not base:
        raise ValueError(f"adapter {path} names no base model (base_model_name_or_path); load its base and apply "
                         "it with scratchlm.interop.hf.peft_adapter.load_adapter")
    return base


def from_pretrained(path: str | Path, *, device: str | torch.device = "cpu", dtype: torch.dtype | None = None,
                    progress: bool = False, **config_overrides: Any) -> TransformerLM:
    """The model alone (eval mode) from a scratchlm dir, an HF dir (Llama, Qwen, Gemma, Phi, ... GPT-2), a
    GGUF file or a PEFT adapter dir (merged into its base).

    dtype=None: as stored where that can run (a GGUF on its own ggml blocks), fp32 otherwise;
    torch.float32 / bfloat16: a dense copy in that dtype. config_overrides replace ModelConfig fields
    that do not change the weights' meaning, e.g. attn_impl="sdpa" or rope_style="interleaved" (q/k
    rows are then permuted to match).
    """
    kind, path = model_kind(path)
    if kind != "gguf" and dtype is None:
        dtype = torch.float32
    if kind == "gguf":
        return load_gguf(path, device=device, dtype=dtype, progress=progress, **config_overrides)
    if kind == "hf":
        return load_hf_dir(path, device=device, dtype=dtype, progress=progress, **config_overrides)
    if kind == "adapter":
        base = from_pretrained(_adapter_base(path), device=device, dtype=dtype, progress=progress,
                               **config_overrides)
        return merge_lora(load_adapter(base, path)).eval()
    return load_model(path, map_location=device, **config_overrides).to(dtype).eval()


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
    sampling = generation_config.sampling_from_gguf(meta)
    generation = {"bos_token_id": bos, "eos_token_id": stops, **sampling, **({"do_sample": True} if sampling else {})}
    tok_config = tokenizer_config_from_gguf(meta) if tokenizer is None else {}
    return LoadedModel(model, tok, template_source(tok), stops, bos, sampling, "gguf", path, family, tok_config,
                       generation, counts)


def _load_dir_kind(kind: str, path: Path, tokenizer: Any, **kw: Any) -> LoadedModel:
    model = from_pretrained(path, **kw)
    tok = tokenizer if tokenizer is not None else load_tokenizer_dir(path, prefer_hf=kind == "hf")
    data = read_config_json(path)
    stops = generation_config.stop_ids_from_dir(path, lambda text: special_token_id(tok, text))
    family = data.get("model_type", "scratchlm") if kind == "hf" else "scratchlm"
    template = template_source(tok)
    tok_config = {} if tokenizer is not None else generation_config.tokenizer_config(path)
    if template and tokenizer is None:
        tok_config.setdefault("chat_template", template)  # also when it came from chat_template.jinja
    return LoadedModel(model, tok, template, stops, data.get("bos_token_id") if kind == "hf" else None,
                       generation_config.sampling_from_dir(path), kind, path, family, tok_config,
                       generation_config.generation_config(path))


def load_pretrained(path: str | Path, *, device: str | torch.device = "cpu", dtype: torch.dtype | None = None,
                    tokenizer: str | Path | None = None, keep_quantized: bool = True, progress: bool = False,
                    **config_overrides: Any) -> LoadedModel:
    """Load a scratchlm checkpoint dir, an HF dir, a GGUF file or a PEFT adapter dir with its tokenizer and
    chat metadata (module docstring).

    dtype: None = as stored (a GGUF runs on its own blocks; directories load fp32), or a dense copy in
    torch.float32 / bfloat16. tokenizer: a directory whose tokenizer replaces the model's own.
    keep_quantized: with a dense dtype, attach a GGUF file's ggml blocks as model.quantized_weights (see
    interop/gguf/model_load.py). config_overrides: e.g. attn_impl.
    """
    kind, path = model_kind(path)
    tok = load_tokenizer_dir(tokenizer, prefer_hf=True) if tokenizer is not None else None
    if kind == "adapter":
        loaded = load_pretrained(_adapter_base(path), device=device, dtype=dtype or torch.float32, tokenizer=tokenizer,
                                 keep_quantized=False, progress=progress, **config_overrides)
        loaded.model = merge_lora(load_adapter(loaded.model, path)).eval()
        return loaded
    kw = dict(device=device, dtype=dtype, progress=progress, **config_overrides)
    if kind == "gguf":
        loaded = _load_gguf_kind(path, read_gguf(path), tok, keep_quantized=keep_quantized, **kw)
    else:
        loaded = _load_dir_kind(kind, path, tok, **kw)
    _check_vocab(loaded)
    return loaded


def _check_vocab(loaded: LoadedModel) -> None:
    if loaded.tokenizer.vocab_size > loaded.model.config.vocab_size:
        raise ValueError(f"the tokenizer has {loaded.tokenizer.vocab_size} tokens but the model in {loaded.path} only "
                         f"{loaded.model.config.vocab_size}; pass the tokenizer the model was trained with "
                         "(--tokenizer DIR)")
    if not loaded.stop_token_ids:
        loaded.stop_token_ids = default_stop_ids(loaded.tokenizer)
