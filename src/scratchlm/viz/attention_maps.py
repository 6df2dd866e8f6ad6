"""Attention probabilities of every layer and head, and a heat-map plot.

P[l, b, h] = softmax(q_h k_{g(h)}^T / sqrt(Hd) + causal mask), q/k taken exactly as the model computes
them (projections, QK-norm, RoPE) by replaying each layer's self-attention input.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from scratchlm.model import TransformerLM
from scratchlm.nn.masks import causal_mask
from scratchlm.nn.softmax import softmax


@torch.no_grad()
def attention_probs(model: TransformerLM, input_ids: torch.Tensor) -> list[torch.Tensor]:
    """input_ids (B, T) -> per layer (B, H, T, T) attention probabilities (causal)."""
    captured: list[tuple] = []

    def grab(module, args, kwargs):  # args: (x, positions, mask, is_causal, ...)
        captured.append((module, args[0], args[1] if len(args) > 1 else kwargs.get("positions")))

    handles = [layer.self_attn.register_forward_pre_hook(grab, with_kwargs=True) for layer in model.model.layers]
    try:
        model(input_ids)
    finally:
        for h in handles:
            h.remove()
    out = []
    t = input_ids.shape[1]
    mask = causal_mask(t, t, device=input_ids.device)
    for attn, x, positions in captured:
        q, k, _ = attn.project_qkv(x, positions)  # (B, H, T, Hd), (B, KvH, T, Hd)
        k = k.repeat_interleave(attn.n_heads // attn.n_kv_heads, dim=1)  # (B, H, T, Hd)
        scores = q @ k.transpose(-2, -1) / math.sqrt(attn.head_dim)  # (B, H, T, T)
        out.append(softmax(scores.float(), dim=-1, mask=mask))
    return out


def plot_attention(probs: list[torch.Tensor], tokens: list[str], out: str | Path, layer: int | None = None) -> Path:
    """Grid of heat-maps (rows: layers, cols: heads) for batch row 0; `layer` picks a single layer."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from scratchlm.viz.save import save_figure

    layers = list(range(len(probs))) if layer is None else [layer]
    n_heads = probs[0].shape[1]
    fig, axes = plt.subplots(len(layers), n_heads, figsize=(2.6 * n_heads, 2.6 * len(layers)), squeeze=False)
    labels = tokens if len(tokens) <= 24 else None
    for r, li in enumerate(layers):
        for h in range(n_heads):
            ax = axes[r][h]
            ax.imshow(probs[li][0, h].cpu().numpy(), cmap="viridis", vmin=0.0, vmax=1.0)
            ax.set_title(f"layer {li} head {h}", fontsize=8)
            if labels is not None:
                ax.set_xticks(range(len(labels)), labels, rotation=90, fontsize=6)
                ax.set_yticks(range(len(labels)), labels, fontsize=6)
            else:
                ax.set_xticks([])
                ax.set_yticks([])
    return save_figure(fig, out)
