"""Which llama.cpp architecture computes a ModelConfig exactly as scratchlm does, or why none does.

`export_problem(arch, config)` reads the architecture's row (architectures.py): the values its llama.cpp code
hard-codes (`fixed`), the features it can carry (`can`, in the terms of interop/hf/family_helpers.py's
FEATURE_DEFAULTS), the RoPE scalings it runs, its shapes (square attention, tied head), its MoE routing, and
its own check (arch_write.py). `export_architecture(config)` tries the config's own family first
(config.hf_family, set on import), then architectures.EXPORT_ORDER. A window that never binds (W >=
max_seq_len) is no window; an attention scale equal to 1/sqrt(head_dim) is the default one. A config without
hf_family is tried first as the family save_pretrained would pick (interop/hf/config_json.export_family).
"""

from __future__ import annotations

from typing import Any

from scratchlm.config import ModelConfig
from scratchlm.interop.gguf.arch_write import close, rope_problem
from scratchlm.interop.gguf.architectures import (ARCHITECTURES, EXPORT_ORDER, FROM_HF_FAMILY, GGUF_ARCHITECTURES,
                                                  GGUFArch)
from scratchlm.interop.hf.config_json import export_family
from scratchlm.interop.hf.family_helpers import PARTIAL_ROTARY_CAN, unusual


def normalised(c: ModelConfig) -> ModelConfig:
    """c without the features that change nothing: windows that never bind, a default attention scale."""
    changes: dict[str, Any] = {}
    if c.sliding_window is not None and c.sliding_window >= c.max_seq_len:
        changes.update(sliding_window=None, layer_types=None)
    if c.attn_scale is not None and close(c.attn_scale, c.head_dim ** -0.5):
        changes["attn_scale"] = None
    return c.replace(**changes) if changes else c


def _same(have: Any, want: Any) -> bool:
    return close(have, want) if isinstance(want, float) and isinstance(have, (int, float)) else have == want


def _moe_problem(arch: GGUFArch, c: ModelConfig) -> str | None:
    name = f"llama.cpp's {arch.name}"
    if not c.moe_num_experts:
        return f"moe_num_experts=0 ({name} is a mixture of experts)" if arch.moe == "required" else None
    if c.moe_dense_layers:
        return f"moe_dense_layers={c.moe_dense_layers} ({name} makes every layer a mixture of experts)"
    renorm = c.moe_norm_topk_prob or c.moe_router == "topk_softmax"
    if renorm != arch.moe_renorm:
        return (f"moe_norm_topk_prob={c.moe_norm_topk_prob} ({name} "
                f"{'renormalises' if arch.moe_renorm else 'does not renormalise'} the top-k weights)")
    if bool(c.moe_shared_d_ff) != arch.shared_expert:
        has = "needs a" if arch.shared_expert else "has no"
        return f"moe_shared_d_ff={c.moe_shared_d_ff} ({name} {has} shared expert)"
    return None


def export_problem(arch: GGUFArch, config: ModelConfig) -> str | None:
    """Why llama.cpp's `arch` would compute something else than scratchlm for `config` (None: it would not)."""
    c = normalised(config)
    fixed = arch.fixed(c)
    for name, want in fixed.items():
        if not _same(getattr(c, name), want):
            return f"{name}={getattr(c, name)!r} (llama.cpp's {arch.name} has {want!r})"
    can = arch.can | set(fixed) | ({PARTIAL_ROTARY_CAN} if arch.partial_rotary else set())
    reason = unusual(c, f"llama.cpp's {arch.name}", can)
    if reason:
        return reason
    if "ffn" not in fixed and c.ffn != "swiglu":
        return f"ffn={c.ffn!r} (llama.cpp's {arch.name} has a SwiGLU FFN)"
    if arch.square_attention and c.n_heads * c.head_dim != c.d_model:
        return (f"n_heads * head_dim = {c.n_heads * c.head_dim} != d_model={c.d_model} (llama.cpp's {arch.name} "
                "projects q and o with D x D matrices)")
    if arch.head == "never" and not c.tie_embeddings:
        return f"tie_embeddings=False (llama.cpp's {arch.name} always reads the head from the embedding)"
    return rope_problem(c, arch.rope_kinds) or _moe_problem(arch, c) or arch.check(c)


def _hf_preference(config: ModelConfig) -> str | None:
    """The architecture of the HF family save_pretrained would pick (None when none fits)."""
    try:
        return FROM_HF_FAMILY.get(export_family(config))
    except ValueError:
        return None


def export_architecture(config: ModelConfig) -> GGUFArch:
    """The llama.cpp architecture to write `config` as (module docstring); ValueError listing why each fails."""
    preferred = FROM_HF_FAMILY.get(config.hf_family or "") or _hf_preference(config)
    reasons = {}
    for name in dict.fromkeys([*([preferred] if preferred else []), *EXPORT_ORDER]):
        why = export_problem(ARCHITECTURES[name], config)
        if why is None:
            return ARCHITECTURES[name]
        reasons[name] = why
    raise ValueError(f"GGUF export supports the {', '.join(GGUF_ARCHITECTURES)} architectures, and llama.cpp would "
                     "run this model differently as each of them: "
                     + "; ".join(f"{name}: {why}" for name, why in reasons.items())
                     + "; export it with save_pretrained (Hugging Face format) instead")
