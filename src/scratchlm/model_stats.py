"""Parameter counts and FLOPs per token of a TransformerLM.

Forward FLOPs per token (PaLM appendix B convention; a multiply-add counts 2):
    F_fwd = 2 * N_matmul + 4 * L * H * Hd * T
where N_matmul counts the weights of every matmul (attention/FFN projections and the LM head; the
embedding lookup is not a matmul), and the second term is QK^T and AV over a context of T tokens.
Mixture of experts: a token runs k of E experts, so the stacked expert weights count k / E (active
parameters). Sliding-window layers attend over min(T, W) keys.
Training (forward + backward) is 3 * F_fwd per token. A model on ggml blocks (a GGUF loaded as stored)
counts its block matrices as the weights they encode; `weight_memory` says what they take in memory.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from scratchlm.config import ModelConfig
from scratchlm.kernels.ops import native_kernels, repacked_bytes
from scratchlm.nn.block_embedding import BlockEmbedding
from scratchlm.nn.block_linear import BlockLinear


@dataclass
class ModelStats:
    n_params: int  # unique parameters (a tied embedding/head counted once)
    n_embedding: int  # token (+ learned position) embedding parameters
    n_matmul: int  # weights that take part in matmuls, LM head included
    flops_per_token_fwd: int
    flops_per_token_train: int


def weight_shapes(model: nn.Module) -> dict[str, torch.Size]:
    """name -> shape of every unique weight: the parameters and the matrices kept in ggml blocks (a tied
    head reading the embedding's blocks counted once)."""
    shapes = {n: p.shape for n, p in model.named_parameters()}
    seen = set()
    for name, m in model.named_modules():
        if isinstance(m, (BlockLinear, BlockEmbedding)) and m.data.data_ptr() not in seen:
            seen.add(m.data.data_ptr())
            shapes[f"{name}.weight"] = torch.Size(m.blocks.shape)
    return shapes


def count_parameters(model: nn.Module) -> int:
    """Number of unique parameters (shared tensors counted once; block matrices by the values they encode)."""
    return sum(s.numel() for s in weight_shapes(model).values())


def weight_memory(model: nn.Module) -> dict[str, int]:
    """Bytes the weights take: {"blocks": ggml block buffers (a GGUF's own bytes, shared once),
    "dense": floating-point parameters}."""
    blocks = {b.data_ptr(): b.numel() for b in model.buffers() if b.dtype == torch.uint8}
    dense = sum(p.numel() * p.element_size() for p in model.parameters())
    return {"blocks": sum(blocks.values()), "dense": dense}


def repacked_memory(model: nn.Module) -> int:
    """Bytes of the repacked copies the decoder makes of the model's Q4_K / Q4_0 / Q2_K / Q3_K block matrices
    (kernels/ops.py's `repacked`: 16 rows interleaved; they replace the file's pages of those matrices; 0 without
    the kernels or with SCRATCHLM_REPACK=0)."""
    mod, seen, total = native_kernels(), set(), 0
    for m in model.modules():
        if isinstance(m, BlockLinear) and m.data.data_ptr() not in seen:
            seen.add(m.data.data_ptr())
            total += repacked_bytes(mod, m.blocks)
    return total


def model_stats(model: nn.Module, config: ModelConfig, seq_len: int | None = None) -> ModelStats:
    """Parameter breakdown and FLOPs per token at context length seq_len (default max_seq_len)."""
    t = seq_len or config.max_seq_len
    shapes = weight_shapes(model)
    n_params = sum(s.numel() for s in shapes.values())
    n_embedding = sum(s.numel() for n, s in shapes.items() if "embed_" in n)
    n_matmul = sum(
        s.numel() for n, s in shapes.items() if len(s) == 2 and "embed_" not in n
    ) + config.vocab_size * config.d_model * int(config.tie_embeddings)
    experts = sum(s.numel() for n, s in shapes.items() if len(s) == 3 and ".experts." in n)
    if experts:
        n_matmul += experts * config.moe_top_k // config.moe_num_experts
    contexts = [min(t, w) if (w := config.layer_window(i)) is not None else t for i in range(config.n_layers)]
    attn = 4 * config.n_heads * config.head_dim * sum(contexts)
    fwd = 2 * n_matmul + attn
    return ModelStats(n_params, n_embedding, n_matmul, fwd, 3 * fwd)
