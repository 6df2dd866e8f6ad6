"""The Transformer language model: embedding -> blocks -> final norm -> LM head.

Block, pre-norm (default; GPT-2, Llama):
    h = x + Attn(Norm1(x));         out = h + FFN(Norm2(h))
Block, post-norm (original Transformer "Add & Norm"):
    h = Norm1(x + Attn(x));         out = Norm2(h + FFN(h))
Parameter names follow HF Llama [firm]: model.embed_tokens, model.layers.{i}.self_attn.{q,k,v,o}_proj,
model.layers.{i}.mlp.{gate,up,down}_proj, model.layers.{i}.{input,post_attention}_layernorm, model.norm,
lm_head. Learned absolute positions live in model.embed_positions.
Shapes: input_ids (B, T) -> logits (B, T, V).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from scratchlm.config import ModelConfig
from scratchlm.nn.attention import Attention
from scratchlm.nn.embedding import Embedding
from scratchlm.nn.ffn import MLP, SwiGLU
from scratchlm.nn.kv_cache import KVCache
from scratchlm.nn.linear import Linear
from scratchlm.nn.masks import causal_mask, padding_to_attention_mask
from scratchlm.nn.norm import LayerNorm, RMSNorm
from scratchlm.nn.positional import LearnedPositions, SinusoidalPositions
from scratchlm.nn.rope import RotaryEmbedding


def make_norm(config: ModelConfig, dim: int) -> nn.Module:
    """RMSNorm or LayerNorm as the config says."""
    if config.norm == "rmsnorm":
        return RMSNorm(dim, config.norm_eps, fused=config.fused_ops)
    return LayerNorm(dim, config.norm_eps, bias=config.norm_bias, fused=config.fused_ops)


class Block(nn.Module):
    """One Transformer layer: self-attention and FFN, each with a residual and a norm."""

    def __init__(self, config: ModelConfig, rope: RotaryEmbedding | None) -> None:
        super().__init__()
        self.post_norm = config.norm_placement == "post"
        self.input_layernorm = make_norm(config, config.d_model)
        self.self_attn = Attention(
            config.d_model, config.n_heads, config.n_kv_heads, config.head_dim, qkv_bias=config.qkv_bias,
            out_bias=config.attn_out_bias, qk_norm=config.qk_norm, norm_eps=config.norm_eps, rope=rope,
            attn_impl=config.attn_impl, fused=config.fused_ops,
        )
        self.post_attention_layernorm = make_norm(config, config.d_model)
        if config.ffn == "swiglu":
            self.mlp: nn.Module = SwiGLU(config.d_model, config.d_ff, bias=config.mlp_bias, fused=config.fused_ops)
        else:
            self.mlp = MLP(config.d_model, config.d_ff, config.activation, bias=config.mlp_bias,
                           fused=config.fused_ops)

    def forward(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        mask: torch.Tensor | None,
        is_causal: bool,
        kv_cache: KVCache | None = None,
        layer_idx: int = 0,
    ) -> torch.Tensor:
        """x (B, T, D) -> (B, T, D)."""
        attn_args = (positions, mask, is_causal, kv_cache, layer_idx)
        if self.post_norm:
            h = self.input_layernorm(x + self.self_attn(x, *attn_args))
            return self.post_attention_layernorm(h + self.mlp(h))
        h = x + self.self_attn(self.input_layernorm(x), *attn_args)
        return h + self.mlp(self.post_attention_layernorm(h))


class Decoder(nn.Module):
    """The `model.*` part: embeddings, the stack of blocks and the final norm."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = Embedding(config.vocab_size, config.d_model)
        self.embed_positions: nn.Module | None = None
        rope = None
        if config.pos_embedding == "learned":
            self.embed_positions = LearnedPositions(config.max_seq_len, config.d_model)
        elif config.pos_embedding == "sinusoidal":
            self.embed_positions = SinusoidalPositions(config.max_seq_len, config.d_model)
        elif config.pos_embedding == "rope":
            rope = RotaryEmbedding(config.head_dim, config.max_seq_len, config.rope_base, config.rope_style,
                                   fused=config.fused_ops, scaling=config.rope_scaling)
        self.rotary_emb = rope
        self.layers = nn.ModuleList(Block(config, rope) for _ in range(config.n_layers))
        # post-norm blocks already end in a norm; pre-norm needs a final one
        self.norm = make_norm(config, config.d_model) if config.norm_placement == "pre" else None


class TransformerLM(nn.Module):
    """Decoder-only LM returning next-token logits."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.model = Decoder(config)
        self.lm_head = Linear(config.d_model, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        """All linears/embeddings ~ N(0, init_std), biases 0, norms 1; residual-output projections
        (o_proj, down_proj) ~ N(0, init_std / sqrt(2 * n_layers)) (GPT-2 sec. 2.3)."""
        std = self.config.init_std
        for name, p in self.named_parameters():
            if p.dim() == 1:
                is_norm_weight = "norm" in name and name.endswith("weight")
                p.fill_(1.0 if is_norm_weight else 0.0)
            elif name.endswith(("o_proj.weight", "down_proj.weight")):
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
    ) -> torch.Tensor:
        """input_ids (B, T) -> logits (B, T, V), fp32 master weights.

        token_positions: (T,) or (B, T) position of each token (default: slots start..start+T-1 where
        start = kv_cache.seq_len or 0). attention_mask: (B, S) bool/0-1 over all key slots so far
        (S = start + T), True = real token, False = padding. kv_cache: a KVCache; the new tokens are
        appended and the cache advanced by T. logits_to_keep: n > 0 returns only the last n positions'
        logits (B, n, V) (generation's prefill needs 1; skips the LM head on the rest); 0 = all.
        """
        start = kv_cache.seq_len if kv_cache is not None else 0
        self._check_input(input_ids, start)
        b, t = input_ids.shape
        s = start + t
        if token_positions is None:
            token_positions = torch.arange(start, s, device=input_ids.device)
        if attention_mask is not None and tuple(attention_mask.shape) != (b, s):
            raise ValueError(f"attention_mask must have shape (B, S) = {(b, s)}, got {tuple(attention_mask.shape)}")
        mask, is_causal = None, True
        if attention_mask is not None:
            mask = causal_mask(t, s, start, input_ids.device) & padding_to_attention_mask(attention_mask)
            is_causal = False
        elif start > 0:
            mask, is_causal = (None, False) if t == 1 else (causal_mask(t, s, start, input_ids.device), False)

        x = self.model.embed_tokens(input_ids)  # (B, T, D)
        if self.model.embed_positions is not None:
            x = x + self.model.embed_positions(token_positions).to(x.dtype)
        for i, layer in enumerate(self.model.layers):
            x = layer(x, token_positions, mask, is_causal, kv_cache, i)
        if logits_to_keep > 0:
            x = x[:, -logits_to_keep:]  # (B, n, D): norm and head are per position
        if self.model.norm is not None:
            x = self.model.norm(x)
        if kv_cache is not None:
            kv_cache.advance(t)
        return self.lm_head(x)  # (B, T, V)

    def new_kv_cache(self, batch_size: int, max_seq_len: int | None = None, dtype: torch.dtype | None = None) -> KVCache:
        """Allocate a KVCache sized for this model."""
        c = self.config
        p = self.lm_head.weight
        return KVCache(c.n_layers, batch_size, c.n_kv_heads, max_seq_len or c.max_seq_len, c.head_dim,
                       dtype or p.dtype, p.device)
