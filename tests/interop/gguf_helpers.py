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


# ---- one tiny random transformers model per llama.cpp architecture (test_gguf_families*.py) ----
#
# D = 256 (token_embd, q/k/v, gate/up rows: K-quant blocks) with FFN / expert widths of 160 / 64 / 96 and a
# qwen3 head of 48 (ffn_down, attn_output rows not a multiple of 256: the quantizer's fallback types Q5_0, Q5_1,
# IQ4_NL, Q4_0, Q8_0). Each model is built so that transformers and llama.cpp compute the same function where
# llama.cpp hard-codes what transformers configures (gemma2/3: query_pre_attn_scalar = head_dim; smollm3: NoPE on
# every 4th layer; qwen2moe: no top-k renormalisation; qwen3moe: renormalised; phi3: prompts longer than L0 = 16,
# so both take the long factors).

FAMILY_D, FAMILY_F, FAMILY_HEAD = 256, 160, 64


def _family_common(vocab: int, **kw):
    base = dict(vocab_size=vocab, hidden_size=FAMILY_D, intermediate_size=FAMILY_F, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-5,
                tie_word_embeddings=False, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    return {**base, **kw}


def family_cases(vocab: int) -> dict[str, tuple[str, str, str, dict]]:
    """family -> (GGUF architecture, transformers model class, config class, config kwargs)."""
    llama3 = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
              "high_freq_factor": 4.0, "original_max_position_embeddings": 32}
    gemma3_rope = {"full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6},
                   "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}
    longrope = {"rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.75,
                "short_factor": [1.0 + 0.05 * i for i in range(24)], "long_factor": [1.0 + 0.5 * i for i in range(24)],
                "original_max_position_embeddings": 16}
    moe = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64, decoder_sparse_step=1,
               mlp_only_layers=[])
    c = lambda **kw: _family_common(vocab, **kw)  # noqa: E731
    return {
        "llama": ("llama", "LlamaForCausalLM", "LlamaConfig",
                  c(attention_bias=True, mlp_bias=True, rope_parameters=llama3)),
        "mistral": ("llama", "MistralForCausalLM", "MistralConfig", c(sliding_window=None, head_dim=FAMILY_HEAD)),
        "mixtral": ("llama", "MixtralForCausalLM", "MixtralConfig",
                    c(num_local_experts=4, num_experts_per_tok=2, intermediate_size=64, sliding_window=None,
                      head_dim=FAMILY_HEAD, rope_theta=1e6)),
        "qwen2": ("qwen2", "Qwen2ForCausalLM", "Qwen2Config", c(tie_word_embeddings=True, rope_theta=1e6)),
        "qwen3": ("qwen3", "Qwen3ForCausalLM", "Qwen3Config", c(head_dim=48)),
        "gemma": ("gemma", "GemmaForCausalLM", "GemmaConfig",
                  c(head_dim=FAMILY_HEAD, tie_word_embeddings=True, hidden_act="gelu_pytorch_tanh")),
        "gemma2": ("gemma2", "Gemma2ForCausalLM", "Gemma2Config",
                   c(num_hidden_layers=3, head_dim=FAMILY_HEAD, tie_word_embeddings=True, sliding_window=8,
                     query_pre_attn_scalar=FAMILY_HEAD, attn_logit_softcapping=50.0, final_logit_softcapping=30.0)),
        "gemma3": ("gemma3", "Gemma3ForCausalLM", "Gemma3TextConfig",
                   c(num_hidden_layers=3, head_dim=FAMILY_HEAD, sliding_window=8, query_pre_attn_scalar=FAMILY_HEAD,
                     layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                     rope_parameters=gemma3_rope, final_logit_softcapping=None)),
        "phi3": ("phi3", "Phi3ForCausalLM", "Phi3Config",
                 c(original_max_position_embeddings=16, partial_rotary_factor=0.75, rope_parameters=longrope)),
        "olmo2": ("olmo2", "Olmo2ForCausalLM", "Olmo2Config", c(rope_theta=5e5)),
        "granite": ("granite", "GraniteForCausalLM", "GraniteConfig",
                    c(embedding_multiplier=2.0, residual_multiplier=0.5, attention_multiplier=0.1, logits_scaling=4.0)),
        "smollm3": ("smollm3", "SmolLM3ForCausalLM", "SmolLM3Config",
                    c(num_hidden_layers=4, rope_theta=2e6, tie_word_embeddings=True)),
        "qwen2moe": ("qwen2moe", "Qwen2MoeForCausalLM", "Qwen2MoeConfig",
                     c(**moe, shared_expert_intermediate_size=96, norm_topk_prob=False, rope_theta=1e6)),
        "qwen3moe": ("qwen3moe", "Qwen3MoeForCausalLM", "Qwen3MoeConfig",
                     c(**moe, head_dim=FAMILY_HEAD, norm_topk_prob=True, rope_theta=1e6)),
    }


@torch.no_grad()
def randomize_family_(model: torch.nn.Module, gemma: bool, seed: int = 1) -> torch.nn.Module:
    """Weights that make a varied greedy continuation (not one repeated token) for a tied head too: matrices
    N(0, 1/in) with the residual-output projections x8, embeddings N(0, 0.02^2), norm gains 1 +- 0.1 (Gemma:
    stored as w = gain - 1), biases N(0, 0.1^2). Gemma's gate projections x30: most GELU inputs are then beyond
    +-10, where llama.cpp's GELU is exact (within, it reads an fp16 table, ~5e-4 relative per value)."""
    g = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        if "norm" in name:
            p.copy_((0.0 if gemma else 1.0) + 0.1 * torch.randn(p.shape, generator=g))
        elif name.endswith("bias"):
            p.copy_(0.1 * torch.randn(p.shape, generator=g))
        elif "embed_tokens" in name:
            p.copy_(0.02 * torch.randn(p.shape, generator=g))
        else:
            scale = 8.0 if ("o_proj" in name or "down_proj" in name) else 1.0
            scale = 30.0 if gemma and "gate_proj" in name else scale
            p.copy_(torch.randn(p.shape, generator=g) * scale / p.shape[-1] ** 0.5)
    return model


def build_family_model(family: str, vocab: int) -> tuple[str, torch.nn.Module]:
    """(GGUF architecture, the family's tiny random transformers model in eval mode)."""
    import transformers

    arch, cls, config_cls, kwargs = family_cases(vocab)[family]
    model = getattr(transformers, cls)(getattr(transformers, config_cls)(**kwargs))
    return arch, randomize_family_(model, gemma=family.startswith("gemma")).eval()


PERMUTED_ARCHS = ("llama", "granite", "smollm3")  # llama.cpp's NORM RoPE: the converter permutes q/k rows


def llama_cpp_unpermute(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """The inverse of `llama_cpp_permute`: interleaved rotary rows -> HF's "half" order."""
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def gguf_values(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Every tensor of a GGUF file dequantized by gguf-py (gguf.quants.dequantize), and its ggml type name."""
    reader = gguf.GGUFReader(str(path))
    values = {t.name: torch.from_numpy(np.array(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32))
              for t in reader.tensors}
    return values, {t.name: t.tensor_type.name for t in reader.tensors}


def hf_with_gguf_weights(path: Path, hf: torch.nn.Module, arch: str) -> tuple[torch.nn.Module, dict[str, str]]:
    """A copy of the transformers model `hf` holding the GGUF file's values as gguf-py dequantizes them, mapped
    by llama.cpp's own tensor map (gguf.get_tensor_name_map) and the converter's transformations undone (q/k rows
    of the NORM-RoPE archs, Gemma's 1 + w norms, transformers v5's fused expert gate|up); and the file's types."""
    values, types = gguf_values(path)
    cfg = hf.config
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH[arch.upper()], cfg.num_hidden_layers)
    state = {}
    for key, p in hf.state_dict().items():
        if key.endswith("mlp.experts.gate_up_proj"):  # (E, 2F, D) = gate | up
            blk = key.replace("model.layers.", "blk.").replace("mlp.experts.gate_up_proj", "")
            v = torch.cat([values[blk + "ffn_gate_exps.weight"], values[blk + "ffn_up_exps.weight"]], 1)
        else:
            name = names.get_name(key, try_suffixes=(".weight", ".bias"))
            name = name if name in values else f"{name}.weight"
            if key == "lm_head.weight" and name not in values:  # tied: the head is the embedding
                name = "token_embd.weight"
            v = values[name]
        if arch in PERMUTED_ARCHS and (".q_proj." in key or ".k_proj." in key):
            v = llama_cpp_unpermute(v, cfg.num_attention_heads if ".q_proj." in key else cfg.num_key_value_heads)
        if arch.startswith("gemma") and "norm" in key:
            v = v - 1.0
        state[key] = v.reshape(p.shape)
    ref = type(hf)(cfg).eval()
    ref.load_state_dict(state, strict=True)
    return ref, types
