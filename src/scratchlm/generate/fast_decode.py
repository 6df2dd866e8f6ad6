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
their router; the experts run on the model's own weights through nn/moe.py's grouped path, or the C++ step's
moe_layer.h over the same weights (so the weight formats (int8, bf16, q8_0...) apply to everything but the experts).
Test: tests/generate/test_fast_decode.py (logits == the model's cached forward, every config family).
"""

from __future__ import annotations


import torch
import torch.nn.functional as F

from scratchlm.config import ModelConfig
from scratchlm.generate.packed_linear import (  # PackedLinear, mkl_packing_available, quantize_int8: re-exported
    BlockSource, PackedLinear, mkl_packing_available, packed, quantize_int8)
from scratchlm.generate.decode_formats import QUANT_MODES, check_format_dims
from scratchlm.generate.native_step import native_step
from scratchlm.generate.packed_layer import PackedLayer, PackedNorm
from scratchlm.model import TransformerLM, layer_rope_kind
from scratchlm.nn.block_embedding import BlockEmbedding
from scratchlm.nn.block_experts import BlockExperts
from scratchlm.nn.block_linear import DENSE_TYPES
from scratchlm.nn.kv_cache import KVCache
from scratchlm.nn.paged_kv_cache import BlockPool, BlockTable
from scratchlm.nn.rope import RotaryEmbedding, rope_rotation
from scratchlm.nn.softcap import softcap


def supports(config: ModelConfig) -> bool:
    """True when FastDecoder can pack this architecture (every placement but post-norm)."""
    return config.norm_placement != "post"


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
        check_format_dims(c, quant)
        self.config, self.quant = c, quant
        self.dtype = model.dtype
        self.h, self.kvh, self.hd = c.n_heads, c.n_kv_heads, c.head_dim
        table = model.model.embed_tokens
        # a table in ggml blocks stays so (rows dequantized on lookup); a dense one is used as it is
        self.embed = table if isinstance(table, BlockEmbedding) else table.weight.detach()
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
        plain = (self.positions is None and self.dtype == torch.float32
                 and quant != "int8")  # what the C++ step leaves to the torch path; it checks the rest
        # the whole step in C++ where supported (generate/native_step.py)
        self.native = (native_step(c, self.layers, self.head, self.embed, self.rope, self.local_rope)
                       if plain else None)
        # every matrix in ggml blocks (no dense part; experts too, an MoE layer's small router may be dense): the
        # C++ step then multiplies a prompt's rows with kernels/csrc/block_gemm.h, as fast as the forward's (each
        # expert on its own rows: moe_layer.h), and takes long prompts (generate/prefill.py)
        routers = {id(layer.ffn_in) for layer in self.layers if layer.moe is not None}
        self.prompt_gemm = all(layer.moe is None or isinstance(layer.moe.experts, BlockExperts)
                               for layer in self.layers) and all(
            lin.parts and all(p.ggml_type not in DENSE_TYPES for p in lin.parts)
            for lin in self.linears() if id(lin) not in routers)

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
    def chunk(self, tokens: torch.Tensor, positions: torch.Tensor, key_mask: torch.Tensor | None,
              cache: KVCache, all_logits: bool = False) -> torch.Tensor:
        """C prompt tokens per row in one C++ call (the native step only; see `native`): tokens, RoPE positions
        (B, C), key_mask (B, S + C) bool over slots [0, S + C) or None, cache at seq_len S -> the logits (B, V) of
        each row's last token (all_logits: (B, C, V), every token's); writes slots [S, S + C) of every layer
        (token c attends to slots <= S + c) and advances by C. The model's forward of the same tokens up to fp32
        summation order."""
        if self.native is None:
            raise ValueError("this decoder has no C++ step (architecture, dtype or kernels); use the model's forward")
        s, c = cache.seq_len, tokens.shape[1]
        if s + c > cache.max_seq_len:
            raise ValueError(f"KV cache overflow: {s + c} tokens > cache capacity {cache.max_seq_len}; "
                             "allocate a larger cache (max_seq_len) or shorten the prompt")
        logits = self.native.chunk(tokens, positions, key_mask, cache.k, cache.v, s, all_logits)
        cache.advance(c)
        return logits.view(tokens.shape[0], c, -1) if all_logits else logits

    @torch.inference_mode()
    def paged(self, tokens: torch.Tensor, positions: torch.Tensor, pool: BlockPool, tables: list[BlockTable],
              all_logits: bool = False) -> torch.Tensor:
        """C tokens per row (tokens, RoPE positions (B, C)) in one C++ call over the rows' block tables (the
        native step only): row b's tokens are stored at its slots [len_b, len_b + C) (its blocks must have room:
        BlockTable.room) and attend over the row's own slots up to each, so rows of any lengths share one call
        with no padding and no copy of their K/V. Returns the logits (B, V) of each row's last token (all_logits:
        (B, C, V), every token's) and advances every table by C. Equal to `chunk` / `step` on a contiguous cache
        holding the same K/V."""
        if self.native is None:
            raise ValueError("this decoder has no C++ step (architecture, dtype or kernels); use the model's forward")
        c, bs = tokens.shape[1], pool.block_size
        short = [i for i, t in enumerate(tables) if t.room(bs) < c]
        if short:
            raise ValueError(f"rows {short[:5]} have no room for {c} more tokens in their blocks; grow their tables first")
        width = max(len(t.blocks) for t in tables)
        ids = torch.tensor([t.blocks + [0] * (width - len(t.blocks)) for t in tables], dtype=torch.long)
        lengths = torch.tensor([t.length for t in tables], dtype=torch.long)
        logits = self.native.paged(tokens, positions, lengths, ids, pool.k, pool.v, all_logits)
        for t in tables:
            t.length += c
        return logits.view(len(tables), c, -1) if all_logits else logits

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
        x = self.embed(tokens) if isinstance(self.embed, BlockEmbedding) else F.embedding(tokens, self.embed)  # (B, D)
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
