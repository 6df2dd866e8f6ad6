"""Mixture of experts (Shazeer et al. 2017; Mixtral, Qwen-MoE): a router sends each token to k of E FFNs.

For a token x (D,) with router ("gate") weights W_r (E, D):
    logits = W_r x                                                        (E,)
    router "softmax_topk" (Mixtral, Qwen-MoE): p = softmax(logits); (w, idx) = top_k(p, k);
                          w <- w / sum(w) when norm_topk_prob (Mixtral always renormalises)
    router "topk_softmax": (l, idx) = top_k(logits, k); w = softmax(l)   (= renormalised softmax_topk)
    y = sum_j w_j Expert_{idx_j}(x),    Expert_e(x) = down_e(act(gate_e x) * up_e x)   (gated FFN experts)
    shared expert (Qwen2-MoE): y <- y + sigmoid(w_s . x) SharedFFN(x)
Expert weights are stacked: gate_proj, up_proj (E, F, D) and down_proj (E, D, F), each [e] a Linear weight.

Two implementations of the same function (`impl`, ModelConfig.moe_impl), tested equal:
  "reference": every expert on every token, mixed by the dense combine matrix C (N, E) that holds w_j at
               column idx_j and 0 elsewhere: y = sum_e C[:, e] Expert_e(x). The definition, easy to read;
               E / k times the compute of the sparse model.
  "grouped":   tokens sorted by expert; each expert runs once on exactly the tokens routed to it (N k rows
               in total), outputs scattered back with index_add. The sparse compute of a real MoE.
Shapes: x (B, T, D) -> (B, T, D); router logits (N, E) with N = B T are appended to `router_logits`
when a list is given (the training loss's load-balancing term reads them, see train/moe_loss.py).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from scratchlm.nn.activations import get_activation
from scratchlm.nn.ffn import GLU
from scratchlm.nn.linear import Linear

MOE_ROUTERS = ("softmax_topk", "topk_softmax")
MOE_IMPLS = ("reference", "grouped")


def route(logits: torch.Tensor, top_k: int, router: str, norm_topk_prob: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Router logits (N, E) -> (weights (N, k) fp32, expert indices (N, k)); see the module docstring."""
    if router == "topk_softmax":
        top, idx = torch.topk(logits.float(), top_k, dim=-1)
        return torch.softmax(top, dim=-1), idx
    probs = torch.softmax(logits.float(), dim=-1)
    weights, idx = torch.topk(probs, top_k, dim=-1)
    if norm_topk_prob:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, idx


class Experts(nn.Module):
    """E gated FFNs with stacked weights: gate_proj, up_proj (E, F, D), down_proj (E, D, F)."""

    def __init__(self, n_experts: int, d_model: int, d_ff: int, activation: str = "silu", fused: bool = False) -> None:
        super().__init__()
        self.gate_proj = nn.Parameter(torch.empty(n_experts, d_ff, d_model))
        self.up_proj = nn.Parameter(torch.empty(n_experts, d_ff, d_model))
        self.down_proj = nn.Parameter(torch.empty(n_experts, d_model, d_ff))
        if not self.gate_proj.is_meta:  # a model built on the meta device gets its weights from a loader
            for w, fan_in in ((self.gate_proj, d_model), (self.up_proj, d_model), (self.down_proj, d_ff)):
                nn.init.uniform_(w, -1.0 / math.sqrt(fan_in), 1.0 / math.sqrt(fan_in))
        self.act = get_activation(activation, fused)

    def expert(self, e: int, x: torch.Tensor) -> torch.Tensor:
        """Expert e on rows x (n, D) -> (n, D)."""
        h = self.act(x @ self.gate_proj[e].t()) * (x @ self.up_proj[e].t())  # (n, F)
        return h @ self.down_proj[e].t()

    def dense(self, x: torch.Tensor, combine: torch.Tensor) -> torch.Tensor:
        """Reference: sum_e combine[:, e] * Expert_e(x) over every expert; x (N, D), combine (N, E)."""
        out = torch.zeros_like(x)
        for e in range(self.gate_proj.shape[0]):
            out = out + combine[:, e:e + 1].to(x.dtype) * self.expert(e, x)
        return out

    def grouped(self, x: torch.Tensor, weights: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """Fast path: each expert on exactly its routed rows; x (N, D), weights/idx (N, k)."""
        flat = idx.flatten()  # (N k,) expert of each (token, slot)
        order = torch.argsort(flat, stable=True)
        token = order // idx.shape[1]  # (N k,) the token of each sorted pair
        counts = torch.bincount(flat, minlength=self.gate_proj.shape[0]).tolist()
        out = torch.zeros_like(x)
        for e, rows in enumerate(torch.split(torch.arange(flat.numel(), device=x.device), counts)):
            if rows.numel() == 0:
                continue
            pairs = order[rows]  # flat (token, slot) positions routed to expert e
            y = self.expert(e, x[token[rows]]) * weights.flatten()[pairs, None].to(x.dtype)
            out.index_add_(0, token[rows], y)
        return out


class MoE(nn.Module):
    """Router + experts (+ an optional sigmoid-gated shared expert); the FFN of an MoE block."""

    def __init__(self, d_model: int, d_ff: int, n_experts: int, top_k: int, router: str = "softmax_topk",
                 norm_topk_prob: bool = True, shared_d_ff: int = 0, activation: str = "silu",
                 impl: str = "reference", fused: bool = False) -> None:
        super().__init__()
        if router not in MOE_ROUTERS or impl not in MOE_IMPLS or not 0 < top_k <= n_experts:
            raise ValueError(f"MoE needs router in {MOE_ROUTERS}, impl in {MOE_IMPLS} and 0 < top_k <= n_experts, "
                             f"got router={router!r}, impl={impl!r}, top_k={top_k}, n_experts={n_experts}")
        self.top_k, self.router, self.norm_topk_prob, self.impl = top_k, router, norm_topk_prob, impl
        self.gate = Linear(d_model, n_experts, bias=False, fused=fused)
        self.experts = Experts(n_experts, d_model, d_ff, activation, fused)
        self.shared_expert = GLU(d_model, shared_d_ff, activation, fused=fused) if shared_d_ff else None
        self.shared_expert_gate = Linear(d_model, 1, bias=False, fused=fused) if shared_d_ff else None

    def forward(self, x: torch.Tensor, router_logits: list[torch.Tensor] | None = None) -> torch.Tensor:
        """x (B, T, D) -> (B, T, D); appends this layer's router logits (B T, E) to `router_logits`."""
        flat = x.reshape(-1, x.shape[-1])  # (N, D)
        logits = self.gate(flat)  # (N, E)
        if router_logits is not None:
            router_logits.append(logits)
        return self.mix(flat, logits, self.impl).view(x.shape)

    def mix(self, flat: torch.Tensor, logits: torch.Tensor, impl: str = "grouped") -> torch.Tensor:
        """Route rows flat (N, D) by their router logits (N, E) and mix the experts' outputs (N, D)."""
        weights, idx = route(logits, self.top_k, self.router, self.norm_topk_prob)  # (N, k) each
        if impl == "grouped":
            out = self.experts.grouped(flat, weights, idx)
        else:
            combine = torch.zeros_like(logits, dtype=torch.float32).scatter(1, idx, weights)  # (N, E)
            out = self.experts.dense(flat, combine)
        if self.shared_expert is not None:
            out = out + torch.sigmoid(self.shared_expert_gate(flat)) * self.shared_expert(flat)
        return out

