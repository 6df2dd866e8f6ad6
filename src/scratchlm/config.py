"""ModelConfig: every architectural choice of a TransformerLM, validated, plus named presets.

Presets are plain Python (no exec), looked up by exact name with `get_preset`; the error lists them.
Derived sizes: head_dim = d_model // n_heads unless given; d_ff defaults to 4*D for the MLP and to
8/3*D rounded up to `ffn_multiple_of` for SwiGLU; n_kv_heads defaults to n_heads (MHA).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scratchlm.config_checks import LAYER_TYPES, check_attention_layout, check_moe, check_scalars
from scratchlm.field_types import check_field_types
from scratchlm.nn.activations import ACTIVATIONS
from scratchlm.nn.attention import ATTN_IMPLS, QK_NORM_SCOPES
from scratchlm.nn.ffn import swiglu_hidden_dim
from scratchlm.nn.moe import MOE_IMPLS, MOE_ROUTERS
from scratchlm.nn.rope import ROPE_STYLES
from scratchlm.nn.rope_scaling import check_rope_scaling

CHOICES: dict[str, tuple[str, ...]] = {
    "norm": ("rmsnorm", "layernorm"),
    "ffn": ("swiglu", "glu", "mlp"),
    "activation": tuple(sorted(ACTIVATIONS)),
    "pos_embedding": ("rope", "learned", "sinusoidal", "none"),
    "rope_style": ROPE_STYLES,
    "norm_placement": ("pre", "post", "sandwich", "output"),
    "qk_norm_scope": QK_NORM_SCOPES,
    "moe_router": MOE_ROUTERS,
    "moe_impl": MOE_IMPLS,
    "attn_impl": ATTN_IMPLS,
    "ops_impl": ("reference", "fused"),
}


@dataclass
class ModelConfig:
    """Architecture of a decoder-only Transformer LM (see docs/model.md for each field)."""

    vocab_size: int = 4096
    d_model: int = 256
    n_layers: int = 4
    n_heads: int = 4
    n_kv_heads: int | None = None
    head_dim: int | None = None
    d_ff: int | None = None
    ffn_multiple_of: int = 64
    max_seq_len: int = 256
    norm: str = "rmsnorm"
    norm_eps: float = 1e-6
    norm_bias: bool = True
    norm_unit_offset: bool = False  # RMSNorm gain stored as 1 + w, w initialised to 0 (Gemma)
    ffn: str = "swiglu"
    activation: str = "gelu"
    mlp_bias: bool = False
    qkv_bias: bool = False
    attn_out_bias: bool = False
    qk_norm: bool = False
    qk_norm_scope: str = "head"  # QK-norm over each head's Hd ("head") or the whole H*Hd projection (OLMo-2)
    attn_scale: float | None = None  # attention score multiplier; None = 1/sqrt(head_dim)
    attn_softcap: float | None = None  # c * tanh(scores / c) on attention scores (Gemma-2)
    final_softcap: float | None = None  # c * tanh(logits / c) on the LM logits (Gemma-2/3)
    embedding_multiplier: float = 1.0  # token embeddings times this (Gemma: sqrt(d_model); Granite)
    residual_multiplier: float = 1.0  # each sublayer output times this before the residual add (Granite)
    logits_scaling: float = 1.0  # LM logits divided by this (Granite)
    pos_embedding: str = "rope"
    rope_style: str = "half"
    rope_base: float = 10000.0
    rotary_dim: int | None = None  # RoPE rotates only this many dims of each head (Phi-4-mini); None = all
    rope_scaling: dict[str, Any] | None = None  # nn/rope_scaling.py: linear, dynamic, llama3, yarn, longrope
    rope_local_base: float | None = None  # RoPE base of the sliding-window layers (Gemma-3); None = rope_base
    nope_layers: tuple[int, ...] = ()  # layers without positional rotation ("NoPE", SmolLM3)
    sliding_window: int | None = None  # W: a sliding layer's query sees the W most recent keys (itself included)
    layer_types: tuple[str, ...] | None = None  # per layer "full_attention" | "sliding_attention"; None: all
    #                                             sliding when sliding_window is set, else all full
    norm_placement: str = "pre"
    moe_num_experts: int = 0  # nn/moe.py: > 0 makes every FFN (but moe_dense_layers) a mixture of experts
    moe_top_k: int = 2  # experts per token
    moe_d_ff: int | None = None  # width of each expert (default d_ff)
    moe_router: str = "softmax_topk"  # or "topk_softmax"
    moe_norm_topk_prob: bool = True  # softmax_topk: renormalise the k chosen probabilities to sum to 1
    moe_shared_d_ff: int = 0  # > 0: a sigmoid-gated shared expert of this width in every MoE layer (Qwen2-MoE)
    moe_dense_layers: tuple[int, ...] = ()  # layers that keep the dense FFN (width d_ff)
    moe_aux_loss_coef: float = 0.01  # weight of the load-balancing loss in training (train/moe_loss.py)
    moe_impl: str = "reference"  # "reference" (every expert, dense combine) or "grouped" (sparse, tested equal)
    tie_embeddings: bool = True
    attn_impl: str = "reference"
    ops_impl: str = "reference"  # "fused": norms, activations and RoPE through torch's fused kernels
    init_std: float = 0.02
    hf_family: str | None = None  # export preference only (no effect on the math): the HF model_type it came from
    # names of the fields filled in by __post_init__ (re-derived by `replace` unless given)
    derived: tuple[str, ...] = field(default=(), init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_field_types(self)  # wrong types (e.g. --model.norm_eps=small) are a ValueError naming the field
        self.derived = tuple(n for n in ("n_kv_heads", "head_dim", "d_ff", "moe_d_ff") if getattr(self, n) is None)
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "max_seq_len", "ffn_multiple_of"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"ModelConfig.{name} must be a positive integer, got {value!r}")
        for name, valid in CHOICES.items():
            if getattr(self, name) not in valid:
                raise ValueError(f"ModelConfig.{name}={getattr(self, name)!r} is not one of {valid}")
        if self.n_kv_heads is None:
            self.n_kv_heads = self.n_heads
        if self.n_kv_heads <= 0 or self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"ModelConfig.n_heads={self.n_heads} must be divisible by n_kv_heads={self.n_kv_heads} "
                "(MHA: n_kv_heads = n_heads, MQA: 1, GQA: a divisor of n_heads)"
            )
        if self.head_dim is None:
            if self.d_model % self.n_heads:
                raise ValueError(
                    f"ModelConfig.d_model={self.d_model} must be divisible by n_heads={self.n_heads} "
                    "(or set head_dim explicitly)"
                )
            self.head_dim = self.d_model // self.n_heads
        if self.head_dim <= 0:
            raise ValueError(f"ModelConfig.head_dim must be positive, got {self.head_dim}")
        if self.rotary_dim == self.head_dim:
            self.rotary_dim = None  # None = the whole head (so it follows head_dim through `replace`)
        if self.pos_embedding == "rope" and (self.rope_dim % 2 or not 0 < self.rope_dim <= self.head_dim):
            what = "head_dim" if self.rotary_dim is None else "rotary_dim"
            raise ValueError(f"ModelConfig.{what}={self.rope_dim} must be even for RoPE (rotations act on pairs) "
                             f"and in (0, head_dim={self.head_dim}]")
        if self.pos_embedding == "sinusoidal" and self.d_model % 2:
            raise ValueError(f"ModelConfig.d_model={self.d_model} must be even for sinusoidal positions")
        if self.d_ff is None:
            gated = self.ffn in ("swiglu", "glu")
            self.d_ff = swiglu_hidden_dim(self.d_model, self.ffn_multiple_of) if gated else 4 * self.d_model
        if self.d_ff <= 0:
            raise ValueError(f"ModelConfig.d_ff must be positive, got {self.d_ff}")
        if not self.norm_eps > 0:
            raise ValueError(f"ModelConfig.norm_eps must be > 0, got {self.norm_eps}")
        if not self.rope_base > 1:
            raise ValueError(f"ModelConfig.rope_base must be > 1, got {self.rope_base}")
        if self.rope_scaling is not None:
            if self.pos_embedding != "rope":
                raise ValueError(f"ModelConfig.rope_scaling needs pos_embedding='rope', got {self.pos_embedding!r}")
            self.rope_scaling = dict(self.rope_scaling)
            check_rope_scaling(self.rope_scaling, self.rope_dim)
        check_attention_layout(self)
        check_scalars(self)
        check_moe(self)
        if not self.init_std > 0:
            raise ValueError(f"ModelConfig.init_std must be > 0, got {self.init_std}")

    @property
    def rope_dim(self) -> int:
        """The dims of each head that RoPE rotates: rotary_dim, or the whole head_dim."""
        return self.head_dim if self.rotary_dim is None else self.rotary_dim

    def layer_type(self, i: int) -> str:
        """"full_attention" or "sliding_attention" for layer i."""
        if self.layer_types is not None:
            return self.layer_types[i]
        return LAYER_TYPES[1] if self.sliding_window is not None else LAYER_TYPES[0]

    def layer_window(self, i: int) -> int | None:
        """The sliding window of layer i (None: full causal attention)."""
        return self.sliding_window if self.layer_type(i) == "sliding_attention" else None

    def is_moe_layer(self, i: int) -> bool:
        """True when layer i's FFN is a mixture of experts."""
        return self.moe_num_experts > 0 and i not in self.moe_dense_layers

    @property
    def fused_ops(self) -> bool:
        """ops_impl == "fused": norms, activations and RoPE through torch's fused kernels."""
        return self.ops_impl == "fused"

    def to_dict(self) -> dict[str, Any]:
        """All fields with derived sizes resolved (what config.json stores)."""
        out = dataclasses.asdict(self)
        out.pop("derived")
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ModelConfig":
        """Build from a dict; unknown keys are an error naming them and the valid fields."""
        known = {f.name for f in dataclasses.fields(cls) if f.init}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown ModelConfig field(s) {unknown}; valid fields: {sorted(known)}")
        return cls(**data)

    def replace(self, **changes: Any) -> "ModelConfig":
        """A copy with `changes` applied (validated again); sizes that were derived are derived again."""
        rederive = {name: None for name in self.derived if name not in changes}
        return ModelConfig.from_dict({**self.to_dict(), **rederive, **changes})

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> "ModelConfig":
        return cls.from_dict(json.loads(Path(path).read_text()))


def _llama(**kw: Any) -> ModelConfig:
    return ModelConfig(norm="rmsnorm", ffn="swiglu", pos_embedding="rope", rope_style="half", **kw)


def _gpt2(**kw: Any) -> ModelConfig:
    return ModelConfig(
        norm="layernorm", norm_eps=1e-5, ffn="mlp", activation="gelu_tanh", mlp_bias=True, qkv_bias=True,
        attn_out_bias=True, pos_embedding="learned", tie_embeddings=True, **kw,
    )


PRESETS: dict[str, Any] = {
    # ~0.9M params: unit tests and instant smoke runs.
    "llama-tiny": lambda: _llama(vocab_size=1024, d_model=128, n_layers=4, n_heads=4, n_kv_heads=2, max_seq_len=256),
    # the benchmark reference shape: vocab 8192, 6 layers, D 384, 6 heads, 2 kv heads, d_ff 1024.
    "llama-small": lambda: _llama(
        vocab_size=8192, d_model=384, n_layers=6, n_heads=6, n_kv_heads=2, d_ff=1024, max_seq_len=512
    ),
    "gpt2-tiny": lambda: _gpt2(vocab_size=1024, d_model=128, n_layers=4, n_heads=4, max_seq_len=256),
    # the real GPT-2 124M shape (for HF interop).
    "gpt2-small": lambda: _gpt2(vocab_size=50257, d_model=768, n_layers=12, n_heads=12, max_seq_len=1024),
}


def get_preset(name: str, **overrides: Any) -> ModelConfig:
    """Return a fresh config for preset `name` (exact match) with `overrides` applied."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; available presets: {sorted(PRESETS)}")
    config = PRESETS[name]()
    return config.replace(**overrides) if overrides else config
