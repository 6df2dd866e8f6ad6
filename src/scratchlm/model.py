"""The Transformer language model: embedding -> blocks -> final norm -> LM head.

Block, by norm_placement (m = residual_multiplier, 1 except Granite):
    pre       h = x + m Attn(N1(x));          out = h + m FFN(N2(h))           (GPT-2, Llama; default)
    post      h = N1(x + Attn(x));            out = N2(h + FFN(h))             (original "Add & Norm")
    sandwich  h = x + m N3(Attn(N1(x)));      out = h + m N4(FFN(N2(h)))       (Gemma-2/3: four norms)
    output    h = x + m N3(Attn(x));          out = h + m N4(FFN(h))           (OLMo-2: norms on outputs)
FFN: SwiGLU / GLU / MLP, or a mixture of experts (nn/moe.py) on the layers config.is_moe_layer says.
Model: x_0 = embed(ids) * embedding_multiplier; logits = head(norm(x_L)) / logits_scaling, then
final_softcap c * tanh(logits / c) when set.
Parameter names follow HF Llama [firm]: model.embed_tokens, model.layers.{i}.self_attn.{q,k,v,o}_proj,
model.layers.{i}.mlp.{gate,up,down}_proj, model.layers.{i}.{input,post_attention}_layernorm (N1, N2),
model.norm, lm_head; the output norms N3, N4 are model.layers.{i}.{attn,ffn}_output_norm (interop renames
them to each family's names). Learned absolute positions live in model.embed_positions.
Shapes: input_ids (B, T) -> logits (B, T, V).
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from scratchlm.config import ModelConfig
from scratchlm.nn.attention import Attention
from scratchlm.nn.embedding import Embedding
from scratchlm.nn.ffn import GLU, MLP, SwiGLU
from scratchlm.nn.kv_cache import KVCache
from scratchlm.nn.linear import Linear
from scratchlm.nn.masks import layer_mask
from scratchlm.nn.moe import MoE
from scratchlm.nn.norm import LayerNorm, RMSNorm
from scratchlm.nn.positional import LearnedPositions, SinusoidalPositions, check_positions_shape
from scratchlm.nn.rope import RotaryEmbedding
from scratchlm.nn.softcap import softcap


def make_norm(config: ModelConfig, dim: int, matmul_input: bool = False) -> nn.Module:
    """RMSNorm or LayerNorm as the config says; matmul_input: only matrix products read its output (RMSNorm may
    then write bf16 under bf16 autocast, nn/fused_rms_norm.py)."""
    if config.norm == "rmsnorm":
        return RMSNorm(dim, config.norm_eps, fused=config.fused_ops, unit_offset=config.norm_unit_offset,
                       matmul_input=matmul_input)
    return LayerNorm(dim, config.norm_eps, bias=config.norm_bias, fused=config.fused_ops)


def make_ffn(config: ModelConfig, layer_idx: int = 0) -> nn.Module:
    """The position-wise FFN of block `layer_idx`: a mixture of experts, SwiGLU, GLU with config.activation,
    or an MLP."""
    c = config
    if c.is_moe_layer(layer_idx):
        act = "silu" if c.ffn == "swiglu" else c.activation
        return MoE(c.d_model, c.moe_d_ff, c.moe_num_experts, c.moe_top_k, c.moe_router, c.moe_norm_topk_prob,
                   c.moe_shared_d_ff, act, c.moe_impl, c.fused_ops)
    if c.ffn == "swiglu":
        return SwiGLU(c.d_model, c.d_ff, bias=c.mlp_bias, fused=c.fused_ops)
    if c.ffn == "glu":
        return GLU(c.d_model, c.d_ff, c.activation, bias=c.mlp_bias, fused=c.fused_ops)
    return MLP(c.d_model, c.d_ff, c.activation, bias=c.mlp_bias, fused=c.fused_ops)


class Block(nn.Module):
    """One Transformer layer: self-attention and FFN, each with a residual and its norms (module docstring)."""

    def __init__(self, config: ModelConfig, rope: RotaryEmbedding | None, layer_idx: int = 0) -> None:
        super().__init__()
        c, placement = config, config.norm_placement
        self.placement = placement
        self.residual_multiplier = c.residual_multiplier
        pre = placement in ("pre", "sandwich")  # the norm feeds only the attention / FFN projections
        self.input_layernorm = make_norm(c, c.d_model, matmul_input=pre) if placement != "output" else None
        self.self_attn = Attention(
            c.d_model, c.n_heads, c.n_kv_heads, c.head_dim, qkv_bias=c.qkv_bias, out_bias=c.attn_out_bias,
            qk_norm=c.qk_norm, norm_eps=c.norm_eps, rope=rope, attn_impl=c.attn_impl, fused=c.fused_ops,
            qk_norm_scope=c.qk_norm_scope, norm_unit_offset=c.norm_unit_offset, scale=c.attn_scale,
            softcap=c.attn_softcap,
        )
        outputs = placement in ("sandwich", "output")
        self.attn_output_norm = make_norm(c, c.d_model) if outputs else None
        self.post_attention_layernorm = make_norm(c, c.d_model, matmul_input=pre) if placement != "output" else None
        self.mlp = make_ffn(c, layer_idx)
        self.moe = isinstance(self.mlp, MoE)
        self.ffn_output_norm = make_norm(c, c.d_model) if outputs else None

    def _residual(self, x: torch.Tensor, out: torch.Tensor, norm: nn.Module | None) -> torch.Tensor:
        """x + m * norm(out) (norm and m only where the block has them)."""
        if norm is not None:
            out = norm(out)
        return x + (out if self.residual_multiplier == 1.0 else out * self.residual_multiplier)

    def forward(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        mask: torch.Tensor | None,
        is_causal: bool,
        kv_cache: KVCache | None = None,
        layer_idx: int = 0,
        router_logits: list[torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """x (B, T, D) -> (B, T, D); an MoE FFN appends its router logits to `router_logits` (if given)."""
        attn_args = (positions, mask, is_causal, kv_cache, layer_idx)
        ffn = (lambda h: self.mlp(h, router_logits)) if self.moe else self.mlp
        if self.placement == "post":
            h = self.input_layernorm(x + self.self_attn(x, *attn_args))
            return self.post_attention_layernorm(h + ffn(h))
        pre_attn = x if self.input_layernorm is None else self.input_layernorm(x)
        h = self._residual(x, self.self_attn(pre_attn, *attn_args), self.attn_output_norm)
        pre_ffn = h if self.post_attention_layernorm is None else self.post_attention_layernorm(h)
        return self._residual(h, ffn(pre_ffn), self.ffn_output_norm)


def layer_ropes(config: ModelConfig) -> tuple[RotaryEmbedding | None, RotaryEmbedding | None]:
    """(global RoPE, local RoPE of the sliding-window layers or None when they share the global one)."""
    if config.pos_embedding != "rope":
        return None, None
    c = config
    rope = RotaryEmbedding(c.rope_dim, c.max_seq_len, c.rope_base, c.rope_style, fused=c.fused_ops,
                           scaling=c.rope_scaling)
    local = None
    if c.rope_local_base is not None:
        local = RotaryEmbedding(c.rope_dim, c.max_seq_len, c.rope_local_base, c.rope_style, fused=c.fused_ops)
    return rope, local


def layer_rope_kind(config: ModelConfig, i: int) -> str | None:
    """"global", "local" (a sliding layer with rope_local_base) or None (NoPE layer / no RoPE) for layer i."""
    if config.pos_embedding != "rope" or i in config.nope_layers:
        return None
    return "local" if config.rope_local_base is not None and config.layer_window(i) is not None else "global"


class Decoder(nn.Module):
    """The `model.*` part: embeddings, the stack of blocks and the final norm."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = Embedding(config.vocab_size, config.d_model)
        self.embed_positions: nn.Module | None = None
        if config.pos_embedding == "learned":
            self.embed_positions = LearnedPositions(config.max_seq_len, config.d_model)
        elif config.pos_embedding == "sinusoidal":
            self.embed_positions = SinusoidalPositions(config.max_seq_len, config.d_model)
        self.rotary_emb, self.rotary_emb_local = layer_ropes(config)
        self.layers = nn.ModuleList(Block(config, self.layer_rope(config, i), i) for i in range(config.n_layers))
        # post-norm blocks already end in a norm; the others need a final one
        self.norm = make_norm(config, config.d_model, matmul_input=True) if config.norm_placement != "post" else None

    def layer_rope(self, config: ModelConfig, i: int) -> RotaryEmbedding | None:
        """The RoPE of layer i: none on a NoPE layer, the local one on sliding-window layers when it exists,
        else the global one."""
        return {"global": self.rotary_emb, "local": self.rotary_emb_local, None: None}[layer_rope_kind(config, i)]


class TransformerLM(nn.Module):
    """Decoder-only LM returning next-token logits."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        # a training-time switch, not architecture (so not in config.json): keep only each block's input in the
        # forward and recompute the block in the backward (less memory, one more forward of the blocks)
        self.activation_checkpointing = False
        self.model = Decoder(config)
        self.lm_head = Linear(config.d_model, config.vocab_size, bias=False, fused=config.fused_ops)
        if config.tie_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        if not self.lm_head.weight.is_meta:  # built on the meta device: a loader assigns the weights
            self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        """All linears/embeddings ~ N(0, init_std), biases 0, norm gains 1 (w = 0 for a 1 + w gain);
        residual-output projections (o_proj, down_proj) ~ N(0, init_std / sqrt(2 * n_layers)) (GPT-2 sec. 2.3)."""
        std = self.config.init_std
        for name, p in self.named_parameters():
            if p.dim() == 1:
                is_norm_weight = "norm" in name and name.endswith("weight")
                p.fill_(1.0 if is_norm_weight and not self.config.norm_unit_offset else 0.0)
            elif name.endswith(("o_proj.weight", "down_proj.weight", "experts.down_proj")):
                p.normal_(0.0, std / math.sqrt(2 * self.config.n_layers))
            else:
                p.normal_(0.0, std)

    def _check_input(self, input_ids: torch.Tensor, start: int) -> None:
        if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2:
            shape = tuple(input_ids.shape) if isinstance(input_ids, torch.Tensor) else type(input_ids).__name__
            raise ValueError(f"input_ids must be a (B, T) integer tensor, got {shape}")
        if input_ids.shape[1] == 0:
            raise ValueError("input_ids is empty (T = 0); pass at least one token")
        end = start + input_ids.shape[1]
        if end > self.config.max_seq_len:
            raise ValueError(
                f"sequence length {end} exceeds the model context max_seq_len={self.config.max_seq_len}; "
                "truncate the input (keep the last max_seq_len tokens) or use a model with a longer context"
            )

    def forward(
        self,
        input_ids: torch.Tensor,
        token_positions: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        kv_cache: KVCache | None = None,
        logits_to_keep: int = 0,
        return_router_logits: bool = False,
        return_hidden: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        """input_ids (B, T) -> logits (B, T, V), fp32 master weights.

        token_positions: (T,) or (B, T) position of each token (default: slots start..start+T-1 where
        start = kv_cache.seq_len or 0). attention_mask: (B, S) bool/0-1 over all key slots so far
        (S = start + T), True = real token, False = padding. kv_cache: a KVCache; the new tokens are
        appended and the cache advanced by T (it keeps every token: sliding-window layers mask the
        keys older than their window, see nn/masks.py). logits_to_keep: n > 0 returns only the last n positions'
        logits (B, n, V) (generation's prefill needs 1; skips the LM head on the rest); 0 = all.
        return_router_logits: also return every MoE layer's router logits (B T, E), for the training loss's
        load-balancing term: (logits, (router logits per MoE layer, ...)).
        return_hidden: return the final norm's output (B, T, D) in place of the logits (the head is left to
        the caller: the chunked head + cross entropy of train/chunked_ce.py).
        """
        start = kv_cache.seq_len if kv_cache is not None else 0
        self._check_input(input_ids, start)
        b, t = input_ids.shape
        s = start + t
        if token_positions is None:
            token_positions = torch.arange(start, s, device=input_ids.device)
        check_positions_shape(token_positions, b, t)  # also for absolute (learned/sinusoidal) positions
        if attention_mask is not None and tuple(attention_mask.shape) != (b, s):
            raise ValueError(f"attention_mask must have shape (B, S) = {(b, s)}, got {tuple(attention_mask.shape)}")
        windows = [self.config.layer_window(i) for i in range(self.config.n_layers)]
        masks = {w: layer_mask(t, s, start, attention_mask, w, input_ids.device) for w in set(windows)}

        x = self.model.embed_tokens(input_ids)  # (B, T, D)
        if self.config.embedding_multiplier != 1.0:
            x = x * self.config.embedding_multiplier
        if self.model.embed_positions is not None:
            x = x + self.model.embed_positions(token_positions).to(x.dtype)
        router_logits: list[torch.Tensor] | None = [] if return_router_logits else None
        recompute = self.activation_checkpointing and self.training and torch.is_grad_enabled() and kv_cache is None
        for i, layer in enumerate(self.model.layers):
            if recompute:
                x = checkpoint(layer, x, token_positions, *masks[windows[i]], None, i, router_logits,
                               use_reentrant=False)
            else:
                x = layer(x, token_positions, *masks[windows[i]], kv_cache, i, router_logits)
        if logits_to_keep > 0:
            x = x[:, -logits_to_keep:]  # (B, n, D): norm and head are per position
        if self.model.norm is not None:
            x = self.model.norm(x)
        if kv_cache is not None:
            kv_cache.advance(t)
        logits = x if return_hidden else self.logits(x)  # (B, T, V), or (B, T, D) hidden states
        return (logits, tuple(router_logits)) if router_logits is not None else logits

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """Final hidden states (B, T, D) -> logits (B, T, V): the head, / logits_scaling, then final_softcap."""
        logits = self.lm_head(x)
        if self.config.logits_scaling != 1.0:
            logits = logits / self.config.logits_scaling
        if self.config.final_softcap is not None:
            logits = softcap(logits, self.config.final_softcap)
        return logits

    @property
    def device(self) -> torch.device:
        """Where the model computes: its parameters' device (a model on ggml blocks keeps them there too)."""
        return next(self.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        """The compute dtype: its floating parameters' (fp32 for a model on ggml blocks, whose matrices are
        uint8 block buffers, not parameters)."""
        return next(self.parameters()).dtype

    def new_kv_cache(self, batch_size: int, max_seq_len: int | None = None, dtype: torch.dtype | None = None) -> KVCache:
        """Allocate a KVCache sized for this model."""
        c = self.config
        return KVCache(c.n_layers, batch_size, c.n_kv_heads, max_seq_len or c.max_seq_len, c.head_dim,
                       dtype or self.dtype, self.device)
