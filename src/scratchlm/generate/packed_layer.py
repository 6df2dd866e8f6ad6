"""One transformer block re-packed for the one-token decode step (FastDecoder's layers).

    PackedNorm    RMSNorm/LayerNorm with the gain folded into the next matrix: returns x_hat only
    PackedLayer   fused [Wq; Wk; Wv] and [Wgate; Wup] PackedLinears with the input norm gains and the
                  attention scale folded in, output-norm gains and Granite's residual multiplier, QK-norm
                  gains laid out per head, the MoE router (experts run from the model's own weights)
The folding identities are in generate/fast_decode.py's module docstring; generate/native_step.py hands the
same parts to the C++ step where it computes the block.
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F

from scratchlm.config import ModelConfig
from scratchlm.generate.packed_linear import BlockSource, norm_gain, packed
from scratchlm.nn.activations import TORCH_ACTIVATIONS
from scratchlm.nn.moe import MoE


class PackedNorm:
    """RMSNorm/LayerNorm whose gain is folded into the following matrix: returns the un-gained x_hat.

    rms:   x_hat = x * rsqrt(||x||^2 / D + eps)        (= rsqrt(mean(x^2) + eps); fp32 like the model's
                                                        norms; one vector_norm beats square + mean)
    layer: x_hat = (x - mean) * rsqrt(var + eps)        the LayerNorm bias b becomes b @ W^T, added to the
                                                        following matmul's bias
    """

    def __init__(self, kind: str, eps: float) -> None:
        self.kind, self.eps = kind, eps
        self.eps_t = torch.tensor(eps)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        if self.kind == "layernorm":
            return F.layer_norm(x32, x32.shape[-1:], eps=self.eps)
        n = torch.linalg.vector_norm(x32, dim=-1, keepdim=True)  # (B, 1)
        return x32 * torch.rsqrt(torch.addcmul(self.eps_t, n, n, value=1.0 / x32.shape[-1]))


class PackedLayer:
    """One block's weights, packed (see the module docstring). Placements "pre", "sandwich" and "output":
    the input norms fold into qkv / gate-up; the output norms (sandwich/output) and Granite's residual
    multiplier m act on the sublayer outputs (m folds into o/down rows when there is no output norm)."""

    def __init__(self, block: torch.nn.Module, config: ModelConfig, dtype: torch.dtype, quant: str | None,
                 norm: PackedNorm, source: BlockSource | None = None, window: int | None = None,
                 rope_kind: str | None = "global") -> None:
        c, attn, mlp = config, block.self_attn, block.mlp
        self.window = window  # sliding window: attend only the last `window` cache slots
        self.rope_kind = rope_kind  # "global", "local" (Gemma-3's sliding layers) or None (NoPE layer)
        self.norm = norm  # stateless (the gains are folded into the matrices): shared by every norm
        self.pre_norm = block.input_layernorm is not None  # False for norm_placement "output" (OLMo-2)
        self.softcap = c.attn_softcap
        # the attention scale (1/sqrt(Hd) unless attn_scale) is folded into the q rows or the q QK-norm gain
        scale = c.attn_scale if c.attn_scale is not None else 1.0 / math.sqrt(c.head_dim)
        q_rows, kv_rows = c.n_heads * c.head_dim, 2 * c.n_kv_heads * c.head_dim
        rows = torch.cat((torch.full((q_rows,), 1.0 if c.qk_norm else scale), torch.ones(kv_rows)))
        pack = functools.partial(packed, dtype=dtype, quant=quant, source=source)
        self.qkv = pack([attn.q_proj, attn.k_proj, attn.v_proj], norm=block.input_layernorm, row_scale=rows)
        m = c.residual_multiplier
        self.attn_out_gain = _output_gain(block.attn_output_norm, m)
        self.ffn_out_gain = _output_gain(block.ffn_output_norm, m)
        fold_m = None if m == 1.0 else torch.full((c.d_model,), m)
        self.o = pack([attn.o_proj], row_scale=fold_m if self.attn_out_gain is None else None)
        self.gated = c.ffn in ("swiglu", "glu")
        self.act = TORCH_ACTIVATIONS["silu" if c.ffn == "swiglu" else c.activation]
        self.moe = mlp if isinstance(mlp, MoE) else None  # experts run from the model's weights (grouped path)
        if self.moe is not None:  # router with the pre-FFN norm gain folded in; experts read x_hat * g
            self.ffn_in = pack([mlp.gate], norm=block.post_attention_layernorm)
            self.down, self.dtype, self.m = None, dtype, m
            norm_in = block.post_attention_layernorm
            self.ffn_gain = None if norm_in is None else norm_gain(norm_in)
        else:
            ins = [mlp.gate_proj, mlp.up_proj] if self.gated else [mlp.up_proj]
            self.ffn_in = pack(ins, norm=block.post_attention_layernorm)
            self.down = pack([mlp.down_proj], row_scale=fold_m if self.ffn_out_gain is None else None)
        self.qk_gain = None
        self.qk_scope = c.qk_norm_scope
        self.qk_norm = PackedNorm("rmsnorm", c.norm_eps)
        if c.qk_norm:  # QK-norm gains of q and k, laid out like the (H + KvH, Hd) qk heads
            q_gain, k_gain = norm_gain(attn.q_norm) * scale, norm_gain(attn.k_norm)
            if self.qk_scope == "head":
                gains = [q_gain] * c.n_heads + [k_gain] * c.n_kv_heads
                self.qk_gain = torch.stack(gains)  # (H + KvH, Hd)
            else:  # one gain per channel of the whole projection
                self.qk_gain = torch.cat((q_gain, k_gain)).view(c.n_heads + c.n_kv_heads, c.head_dim)

    def qk_normalize(self, qk: torch.Tensor, h: int) -> torch.Tensor:
        """QK-norm of qk (B, H + KvH, Hd) fp32: per head, or over q's and k's whole projections."""
        if self.qk_scope == "head":
            return self.qk_norm(qk) * self.qk_gain
        b = qk.shape[0]
        q, k = self.qk_norm(qk[:, :h].reshape(b, -1)), self.qk_norm(qk[:, h:].reshape(b, -1))
        return torch.cat((q, k), -1).view(qk.shape) * self.qk_gain

    def attn_residual(self, x: torch.Tensor, heads: torch.Tensor) -> torch.Tensor:
        """x + m * out_norm(o_proj(heads)) (B, D), the norm only where the block has one."""
        if self.attn_out_gain is None:
            return self.o.residual(x, heads)
        return x + self.norm(self.o(heads)) * self.attn_out_gain

    def moe_residual(self, x: torch.Tensor) -> torch.Tensor:
        """x (B, D) -> x + m * out_norm(MoE(post_attention_norm(x))): packed router, the model's experts."""
        x_hat = self.norm(x) if self.pre_norm else x
        logits = self.ffn_in(x_hat)  # (B, E) router logits
        x_in = (x_hat if self.ffn_gain is None else x_hat * self.ffn_gain).to(self.dtype)  # (B, D)
        out = self.moe.mix(x_in, logits, "grouped")  # (B, D)
        if self.ffn_out_gain is not None:
            return x + self.norm(out) * self.ffn_out_gain
        return x + (out if self.m == 1.0 else out * self.m)

    def ffn_residual(self, x: torch.Tensor) -> torch.Tensor:
        """x (B, D) -> x + m * out_norm(FFN(post_attention_norm(x))) (B, D)."""
        if self.moe is not None:
            return self.moe_residual(x)
        h = self.ffn_in(self.norm(x) if self.pre_norm else x)  # (B, 2F) gate|up, or (B, F)
        if self.gated:
            gate, up = h.chunk(2, dim=-1)
            h = self.act(gate) * up
        else:
            h = self.act(h)
        if self.ffn_out_gain is None:
            return self.down.residual(x, h)
        return x + self.norm(self.down(h)) * self.ffn_out_gain


def _output_gain(norm: torch.nn.Module | None, multiplier: float) -> torch.Tensor | None:
    """m * g (D,) fp32 of an output norm (sandwich/output placements), or None without one."""
    return None if norm is None else norm_gain(norm) * multiplier
