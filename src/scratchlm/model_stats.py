"""Parameter counts and FLOPs per token of a TransformerLM.

Forward FLOPs per token (PaLM appendix B convention; a multiply-add counts 2):
    F_fwd = 2 * N_matmul + 4 * L * H * Hd * T
where N_matmul counts the weights of every matmul (attention/FFN projections and the LM head; the
embedding lookup is not a matmul), and the second term is QK^T and AV over a context of T tokens.
Mixture of experts: a token runs k of E experts, so the stacked expert weights count k / E (active
parameters). Sliding-window layers attend over min(T, W) keys.
Training (forward + backward) is 3 * F_fwd per token.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from scratchlm.config import ModelConfig


@dataclass
class ModelStats:
    n_params: int  # unique parameters (a tied embedding/head counted once)
    n_embedding: int  # token (+ learned position) embedding parameters
    n_matmul: int  # weights that take part in matmuls, LM head included
    flops_per_token_fwd: int
    flops_per_token_train: int


def count_parameters(model: nn.Module) -> int:
    """Number of unique parameters (shared tensors counted once)."""
    return sum(p.numel() for p in model.parameters())


def model_stats(model: nn.Module, config: ModelConfig, seq_len: int | None = None) -> ModelStats:
    """Parameter breakdown and FLOPs per token at context length seq_len (default max_seq_len)."""
    t = seq_len or config.max_seq_len
    n_params = count_parameters(model)
    n_embedding = sum(p.numel() for n, p in model.named_parameters() if "embed_" in n)
    n_matmul = sum(
        p.numel() for n, p in model.named_parameters() if p.dim() == 2 and "embed_" not in n
    ) + config.vocab_size * config.d_model * int(config.tie_embeddings)
    experts = sum(p.numel() for n, p in model.named_parameters() if p.dim() == 3 and ".experts." in n)
    if experts:
        n_matmul += experts * config.moe_top_k // config.moe_num_experts
    contexts = [min(t, w) if (w := config.layer_window(i)) is not None else t for i in range(config.n_layers)]
    attn = 4 * config.n_heads * config.head_dim * sum(contexts)
    fwd = 2 * n_matmul + attn
    return ModelStats(n_params, n_embedding, n_matmul, fwd, 3 * fwd)
