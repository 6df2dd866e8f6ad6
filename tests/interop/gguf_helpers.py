"""Write tiny GGUF files the way llama.cpp's convert_hf_to_gguf.py does, with gguf-py's GGUFWriter.

Independent of scratchlm's GGUF code: names, metadata keys and the llama Q/K row permutation are
written out here literally from llama.cpp's converter, quantization uses gguf-py's quantizers, and
K-quant blocks (gguf-py has no K-quantizer) are random bytes with finite scales.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import torch

GLOBAL = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}
LAYER = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
         "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
         "self_attn.k_norm": "attn_k_norm", "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate",
         "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
K_QUANTS = ("Q4_K", "Q5_K", "Q6_K")
F16_OFFSETS = {"Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}


QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|"
               r"\s+(?!\S)|\s+")
CHATML_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def train_tiny_bpe(shared_data: Path, vocab_size: int = 400):
    """A Qwen2-style byte-level BPE `tokenizers.Tokenizer` (ChatML specials) trained on tinyshakespeare."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(QWEN2_REGEX), behavior="isolated"),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=CHATML_SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator((shared_data / "tinyshakespeare.txt").read_text()[:30000].split("\n"), trainer)
    return tok


TEXTS = ["Hello world, What is the capital of France?", "numbers 2024 and 3.14", "<|im_start|>user\nhi<|im_end|>\n",
         "  spaces\tand\nnewlines  ", "emoji 🤗 CJK 中文"]


def tiny_hf_model(family: str, vocab: int):
    """A 2-layer random-weight transformers model of `family` (llama untied, qwen2/qwen3 tied) for export tests."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

    from interop_helpers import randomize_

    common = dict(vocab_size=vocab, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=64, bos_token_id=None, eos_token_id=None,
                  pad_token_id=None)
    cls, cfg = {"llama": (LlamaForCausalLM, LlamaConfig(**common, tie_word_embeddings=False)),
                "qwen2": (Qwen2ForCausalLM, Qwen2Config(**common, tie_word_embeddings=True)),
                "qwen3": (Qwen3ForCausalLM, Qwen3Config(**common, head_dim=128, tie_word_embeddings=True))}[family]
    return randomize_(cls(cfg)).eval()


def gguf_tensor_name(hf: str) -> str:
    base, kind = hf.rsplit(".", 1)
    if base in GLOBAL:
        return f"{GLOBAL[base]}.{kind}"
    parts = base.split(".")
    return f"blk.{parts[2]}.{LAYER['.'.join(parts[3:])]}.{kind}"


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf.py LlamaModel.permute: HF "half" rotary rows -> interleaved pairs."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def random_k_blocks(type_name: str, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[type_name]]
    data = rng.integers(0, 256, (rows, cols // block, size), dtype=np.uint8)
    for off in F16_OFFSETS[type_name]:
        scale = (rng.random((rows, cols // block)) * 0.004 + 0.001).astype(np.float16)
        data[:, :, off:off + 2] = scale.view(np.uint8).reshape(rows, -1, 2)
    return data.reshape(rows, -1)


def encode(values: np.ndarray, type_name: str, rng: np.random.Generator) -> tuple[np.ndarray, gguf.GGMLQuantizationType]:
    qtype = gguf.GGMLQuantizationType[type_name]
    if type_name == "F32":
        return values.astype(np.float32), qtype
    if type_name == "F16":
        return values.astype(np.float16), qtype
    if type_name in K_QUANTS:
        return random_k_blocks(type_name, *values.shape, rng), qtype
    return gguf.quants.quantize(values.astype(np.float32), qtype), qtype


def write_gguf(hf_model: torch.nn.Module, path: Path, arch: str, types: dict[str, str] | None = None,
               default_type: str = "F32", metadata: dict | None = None, seed: int = 0) -> Path:
    """Write `hf_model` as a GGUF file: 2-D weights in `types[hf_name]` (else default_type), 1-D in F32.

    metadata: extra {key: value} pairs (strings, ints, floats, bools, lists) added as they are.
    """
    cfg = hf_model.config
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), arch)
    n_head, n_kv = cfg.num_attention_heads, cfg.num_key_value_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // n_head
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_dimension_count(head_dim)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    w.add_vocab_size(cfg.vocab_size)
    for key, value in (metadata or {}).items():
        w.add_key_value(key, value, _value_type(value), sub_type=_value_type(value[0]) if isinstance(value, list) else None)
    state = {k: v.detach().float().numpy() for k, v in hf_model.state_dict().items()}
    if cfg.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    for name, value in state.items():
        if arch == "llama" and (".q_proj." in name or ".k_proj." in name):
            value = llama_cpp_permute(value, n_head if ".q_proj." in name else n_kv)
        kind = (types or {}).get(name, default_type) if value.ndim == 2 else "F32"
        data, qtype = encode(value, kind, rng)
        w.add_tensor(gguf_tensor_name(name), data, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _value_type(value) -> gguf.GGUFValueType:
    if isinstance(value, list):
        return gguf.GGUFValueType.ARRAY
    return {bool: gguf.GGUFValueType.BOOL, int: gguf.GGUFValueType.INT32, float: gguf.GGUFValueType.FLOAT32,
            str: gguf.GGUFValueType.STRING}[type(value)]


def tokenizer_metadata(tok, pre: str, chat_template: str | None = None, bos: str | None = None,
                       eos: str | None = None, add_bos: bool = False) -> dict:
    """tokenizer.ggml.* metadata for an HF `tokenizers.Tokenizer` (byte-level BPE), as llama.cpp writes it."""
    import json

    spec = json.loads(tok.to_str())
    n = tok.get_vocab_size(with_added_tokens=True)
    tokens = [tok.id_to_token(i) for i in range(n)]
    special = {a["id"] for a in spec["added_tokens"] if a["special"]}
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
    meta = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": pre, "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.token_type": [3 if i in special else 1 for i in range(n)],
            "tokenizer.ggml.merges": merges, "tokenizer.ggml.add_bos_token": add_bos}
    if bos is not None:
        meta["tokenizer.ggml.bos_token_id"] = tok.token_to_id(bos)
    if eos is not None:
        meta["tokenizer.ggml.eos_token_id"] = tok.token_to_id(eos)
    if chat_template is not None:
        meta["tokenizer.chat_template"] = chat_template
    return meta


def write_metadata_only(path: Path, arch: str, metadata: dict) -> Path:
    w = gguf.GGUFWriter(str(path), arch)
    for key, value in metadata.items():
        w.add_key_value(key, value, _value_type(value), sub_type=_value_type(value[0]) if isinstance(value, list) else None)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
