"""A lean one-token decode step: the model's math with its weights re-packed for batch-1/8 GEMVs.

Decoding one token per row is memory bound: every step streams all weights once. The model's own
forward spends more time in per-op overhead (~40 small ops per layer) than in its matmuls at this
size. `FastDecoder` computes exactly the same function (pre-norm blocks) with fewer, cheaper ops:

    qkv   = x_n @ [Wq; Wk; Wv]^T                       one GEMV instead of three
    gu    = x_n @ [Wgate; Wup]^T                        one GEMV instead of two
    W^T   stored contiguous (in, out)                  x @ W^T streams the matrix row by row
    norm  RMSNorm(x) = x * rsqrt(mean(x^2) + eps) * g,  g folded into the next matrix:
          (x * r * g) @ W^T = (x * r) @ (diag(g) W^T)
    RoPE  rot(x) = x @ R,  R the fixed signed permutation of the pairing style (exact: one +-1 per column),
          x' = x * cos + rot(x) * sin                   both styles, one table lookup per step
    attn  softmax(q K^T / sqrt(Hd)) V on the cache slots [0, S), q grouped (B KvH, G, Hd) for GQA/MQA
          (two bmm); 1/sqrt(Hd) is folded into the q rows of [Wq; Wk; Wv], residual adds into addmm;
          a sliding-window layer reads only its last W slots [S - W, S) (the cache holds every token)

It reads and writes the model's KVCache in the model's layout, so prefill runs through the model and
the steps through this class (or the other way round) interchangeably. Post-norm blocks are not packed
(`supports(config)` says so; the engine then uses the model's step). Memory: a second copy of every
matrix (the tied LM head included), so keep using the model for training. Mixture-of-experts layers pack
their router; the experts run on the model's own weights through nn/moe.py's grouped path (so the weight
formats (int8, bf16, q8_0...) apply to everything but the experts).
Test: tests/generate/test_fast_decode.py (logits == the model's cached forward, every config family).
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F

from scratchlm.config import ModelConfig
from scratchlm.generate.packed_linear import (  # PackedLinear, mkl_packing_available, quantize_int8: re-exported
    WEIGHT_FORMATS, BlockSource, PackedLinear, mkl_packing_available, norm_gain, packed, quantize_int8)
from scratchlm.generate.native_step import native_step
from scratchlm.model import TransformerLM, layer_rope_kind
from scratchlm.nn.activations import TORCH_ACTIVATIONS
from scratchlm.nn.kv_cache import KVCache
from scratchlm.nn.moe import MoE
from scratchlm.nn.rope import RotaryEmbedding, rope_rotation
from scratchlm.nn.softcap import softcap


def supports(config: ModelConfig) -> bool:
    """True when FastDecoder can pack this architecture (every placement but post-norm)."""
    return config.norm_placement != "post"


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


QUANT_MODES = WEIGHT_FORMATS  # FastDecoder's quant= values (generate/packed_linear.py)


INT8_K_MULTIPLE = 16  # torch's CPU int8 kernel reads its input dim in blocks of 16 (wrong results or a crash otherwise)
K_MULTIPLE = {"int8": INT8_K_MULTIPLE, "bf16": 16, "q8_0": 32, "q4_1": 32, "q8_0_a8": 32,
              "q4_1_a8": 32}  # our kernels: 16 lanes, 32-blocks
MODE_NAMES = {"int8": "fast-int8", "bf16": "fast-bf16", "q8_0": "fast-q8_0", "q4_1": "fast-q4_1",
              "q8_0_a8": "fast-q8_0-a8", "q4_1_a8": "fast-q4_1-a8"}


def check_int8_dims(c: ModelConfig, quant: str = "int8") -> None:
    """ValueError unless every matrix's input dim (d_model, n_heads*head_dim, d_ff) is a multiple of the
    weight format's K_MULTIPLE."""
    if quant not in K_MULTIPLE:
        return
    multiple = K_MULTIPLE[quant]
    dims = {"d_model": c.d_model, "n_heads*head_dim": c.n_heads * c.head_dim, "d_ff": c.d_ff}
    bad = {k: v for k, v in dims.items() if v % multiple}
    if bad:
        raise ValueError(f"decode='{MODE_NAMES[quant]}' needs {sorted(dims)} to be multiples of {multiple} (its "
                         f"kernel), got {bad}; use decode='fast' for this model")


def block_source(model: TransformerLM) -> BlockSource:
    """weight Parameter -> its GGUF blocks (`model.quantized_weights`, by HF name; a tied head shares
    the embedding's), or None."""
    blocks = getattr(model, "quantized_weights", None) or {}
    by_id = {id(p): blocks[name] for name, p in model.named_parameters(remove_duplicate=False) if name in blocks}
    return lambda weight: by_id.get(id(weight))


class FastDecoder:
    """Packed weights of a pre-norm TransformerLM + a one-token step over the model's KVCache.

    quant=None computes in the model's dtype (fp32: equal to the model's forward to ~1e-6);
    quant="int8" stores every matrix as int8 rows with per-row scales (see quantize_int8), a quarter
    of the fp32 bytes: decoding is memory bound, so fewer bytes is faster, at the cost of the
    quantization error (tests bound it against the model with the dequantized weights).
    quant="bf16" | "q8_0" | "q4_1" | "gguf": our C++ kernels on bf16 weights or ggml blocks, fp32 math on
    exactly the dequantized weights; "gguf" runs a GGUF-loaded model's own blocks (the exact model);
    "q8_0_a8" | "q4_1_a8": those blocks times activations rounded to 8 bits per 32-block (llama.cpp's
    CPU scheme, quant/act_quant.py), see generate/packed_linear.py.
    """

    def __init__(self, model: TransformerLM, quant: str | None = None) -> None:
        c = model.config
        if not supports(c):
            raise ValueError(f"FastDecoder packs pre-norm (and sandwich/output-norm) blocks, not "
                             f"norm_placement={c.norm_placement!r}; use the model's own step (decode='model')")
        if quant not in QUANT_MODES:
            raise ValueError(f"unknown quant {quant!r}; valid: {QUANT_MODES}")
        if quant == "int8":
            if not hasattr(torch.ops.aten, "_weight_int8pack_mm"):
                raise ValueError("quant='int8' needs torch's _weight_int8pack_mm kernel (torch >= 2.4); use quant=None")
        check_int8_dims(c, quant)
        self.config, self.quant = c, quant
        self.dtype = model.lm_head.weight.dtype
        self.h, self.kvh, self.hd = c.n_heads, c.n_kv_heads, c.head_dim
        self.embed = model.model.embed_tokens.weight.detach()
        self.positions = model.model.embed_positions  # learned/sinusoidal module or None
        self.norm = PackedNorm(c.norm, c.norm_eps)
        source = block_source(model)
        self.layers = [PackedLayer(block, c, self.dtype, quant, self.norm, source, c.layer_window(i),
                                   layer_rope_kind(c, i)) for i, block in enumerate(model.model.layers)]
        self.head = packed([model.lm_head], self.dtype, quant, model.model.norm, source=source)
        rope, local_rope = model.model.rotary_emb, model.model.rotary_emb_local
        self.rope = None if rope is None else rope.fused_copy()  # full-width tables: x * cos + rot(x) * sin
        self.local_rope = None if local_rope is None else local_rope.fused_copy()
        if rope is not None:  # over the rotary dims (all of Hd unless partial rotary)
            self.rotation = rope_rotation(rope.head_dim, rope.style, torch.float32).to(rope.cos.device)
        self.native = native_step(self)  # the whole step in C++ where supported (generate/native_step.py)

    def linears(self) -> list[PackedLinear]:
        """Every packed matrix of the model (the layers', then the LM head)."""
        return [m for layer in self.layers for m in (layer.qkv, layer.o, layer.ffn_in, layer.down)
                if m is not None] + [self.head]

    def pack_for_batch(self, batch: int) -> None:
        """Prepare the MKL-packed GEMMs for a fixed batch of `batch` rows (no-op for 1 row or int8)."""
        if batch > 1:
            for lin in self.linears():
                lin.pack_for_batch(batch)

    def rotate(self, qk: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None,
               layer: PackedLayer) -> torch.Tensor:
        """qk (B, H + KvH, Hd) in fp32 -> QK-norm (if any), then RoPE with this step's (cos, sin) (B, 1, Hd)."""
        if layer.qk_gain is not None:
            qk = layer.qk_normalize(qk, self.h)
        if rope is None:
            return qk
        cos, sin = rope
        d = self.rotation.shape[0]
        part = qk if d == qk.shape[-1] else qk[..., :d]  # partial rotary: the rest passes through
        rotated = (part.flatten(0, 1) @ self.rotation).view(part.shape)  # one 2-D mm, not a broadcast bmm
        out = torch.addcmul(part * cos, rotated, sin)
        return out if part is qk else torch.cat((out, qk[..., d:]), -1)

    @torch.inference_mode()
    def step(self, tokens: torch.Tensor, positions: torch.Tensor, key_mask: torch.Tensor | None,
             cache: KVCache) -> torch.Tensor:
        """tokens (B,), RoPE positions (B,), key_mask (B, S) bool over slots [0, S) or None, cache at
        seq_len S - 1 -> next-token logits (B, V); writes slot S - 1 of every layer and advances."""
        b = tokens.shape[0]
        s = cache.seq_len
        if s + 1 > cache.max_seq_len:
            raise ValueError(f"KV cache overflow: {s + 1} tokens > cache capacity {cache.max_seq_len}; "
                             "allocate a larger cache (max_seq_len) or shorten prompt + max_new_tokens")
        if self.native is not None:
            logits = self.native.step(tokens, positions, key_mask, cache.k, cache.v, s)
            cache.advance(1)
            return logits
        h, kvh, hd = self.h, self.kvh, self.hd
        x = F.embedding(tokens, self.embed)  # (B, D)
        if self.config.embedding_multiplier != 1.0:
            x = x * self.config.embedding_multiplier
        if self.positions is not None:
            x = x + self.positions(positions).to(x.dtype)
        ks, vs = cache.k.unbind(0), cache.v.unbind(0)  # per layer (B, KvH, T_max, Hd)
        ropes = {"global": self._tables(self.rope, positions), "local": self._tables(self.local_rope, positions),
                 None: None}
        bias = None
        if key_mask is not None:  # (B * KvH, 1, S): 0 where visible, -inf on padding
            bias = torch.zeros(key_mask.shape, device=key_mask.device).masked_fill_(~key_mask, float("-inf"))
            bias = bias[:, None, None].expand(b, kvh, 1, s + 1).reshape(b * kvh, 1, s + 1)
        for i, layer in enumerate(self.layers):
            qkv = layer.qkv(layer.norm(x) if layer.pre_norm else x)  # (B, (H + 2 KvH) Hd), q rows pre-scaled
            qk = self.rotate(qkv[:, : (h + kvh) * hd].view(b, h + kvh, hd).float(), ropes[layer.rope_kind], layer)
            ks[i].select(2, s).copy_(qk[:, h:])  # (B, KvH, Hd) into slot s
            vs[i].select(2, s).copy_(qkv[:, (h + kvh) * hd:].view(b, kvh, hd))
            q = qk[:, :h].reshape(b * kvh, h // kvh, hd).to(cache.k.dtype)  # (B KvH, G, Hd): GQA groups
            lo = 0 if layer.window is None else max(0, s + 1 - layer.window)  # a sliding layer's oldest key
            keys = ks[i][:, :, lo: s + 1].flatten(0, 1)  # (B KvH, S', Hd), a view
            scores = torch.bmm(q, keys.transpose(1, 2)).float()  # (B KvH, G, S')
            if layer.softcap is not None:
                scores = softcap(scores, layer.softcap)
            if bias is not None:
                scores = scores + bias[..., lo:]
            probs = torch.softmax(scores, dim=-1).to(cache.v.dtype)
            out = torch.bmm(probs, vs[i][:, :, lo: s + 1].flatten(0, 1))  # (B KvH, G, Hd)
            x = layer.attn_residual(x, out.view(b, h * hd))  # x + o_proj(heads)
            x = layer.ffn_residual(x)
        cache.advance(1)
        logits = self.head(self.norm(x))  # (B, V) in the model dtype, like its forward
        if self.config.logits_scaling != 1.0:
            logits = logits / self.config.logits_scaling
        return logits if self.config.final_softcap is None else softcap(logits, self.config.final_softcap)

    @staticmethod
    def _tables(rope: RotaryEmbedding | None, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """This step's (cos, sin) (B, 1, Hd) of a fused-form RoPE, or None without RoPE."""
        if rope is None:
            return None
        cos, sin = rope.tables(positions)  # (B, Hd) each
        return cos[:, None], sin[:, None]
