"""Load-balancing auxiliary loss for mixture-of-experts training (Switch Transformer, Fedus et al. 2021,
eq. 4; the form transformers' Mixtral / Qwen-MoE use), so the router keeps every expert busy.

Over all N tokens of all MoE layers together (router logits stacked to (L N, E)):
    p   = softmax(logits)                       router probabilities (L N, E)
    f_j = mean over tokens of one_hot(top_k(p)_j)   fraction of tokens whose j-th choice is each expert (k, E)
    P   = mean over tokens of p                 mean probability given to each expert (E,)
    aux = E * sum_{j, e} f_j[e] P[e]
With a perfectly uniform router aux = k (its minimum for a balanced load); it grows when a few experts
take most tokens and the router is confident about them. Only P carries gradient (f counts choices).
The training loss is CE + moe_aux_loss_coef * aux (train/loop.py); validation reports CE alone.
"""

from __future__ import annotations

import torch


def load_balancing_loss(router_logits: tuple[torch.Tensor, ...] | list[torch.Tensor], top_k: int) -> torch.Tensor:
    """aux (a 0-dim fp32 tensor) from each MoE layer's router logits (N, E); see the module docstring."""
    if not router_logits:
        raise ValueError("load_balancing_loss needs the router logits of at least one MoE layer")
    logits = torch.cat([r.float() for r in router_logits], dim=0)  # (L N, E)
    n_experts = logits.shape[-1]
    probs = torch.softmax(logits, dim=-1)
    _, chosen = torch.topk(probs, top_k, dim=-1)  # (L N, k)
    fraction = torch.nn.functional.one_hot(chosen, n_experts).float().mean(dim=0)  # (k, E)
    mean_prob = probs.mean(dim=0)  # (E,)
    return (fraction * mean_prob[None]).sum() * n_experts
