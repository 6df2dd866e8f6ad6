"""The next-token distribution before and after each sampling filter, for one prompt.

p_T = softmax(logits / T); a filter f keeps a subset K of tokens and renormalises:
    p_f(v) = p_T(v) / sum_{u in K} p_T(u)  for v in K, else 0
(top-k: the k largest; top-p: the smallest prefix of the sorted distribution with mass >= p;
min-p: tokens with p_T(v) >= min_p * max p_T). Filters come from scratchlm.generate.sampling.
"""

from __future__ import annotations

from pathlib import Path

import torch

from scratchlm.generate.sampling import apply_temperature, min_p_filter, top_k_filter, top_p_filter
from scratchlm.nn.softmax import softmax


def filtered_distributions(
    logits: torch.Tensor, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0
) -> dict[str, torch.Tensor]:
    """logits (V,) -> {"base": p_T, "top-k": ..., "top-p": ..., "min-p": ...} (each (V,), sums to 1)."""
    scaled = apply_temperature(logits[None].float(), temperature)  # (1, V)
    out = {"base": softmax(scaled, -1)[0]}
    if top_k:
        out[f"top-k={top_k}"] = softmax(top_k_filter(scaled, top_k), -1)[0]
    if top_p < 1.0:
        out[f"top-p={top_p:g}"] = softmax(top_p_filter(scaled, top_p), -1)[0]
    if min_p > 0.0:
        out[f"min-p={min_p:g}"] = softmax(min_p_filter(scaled, min_p), -1)[0]
    return out


def plot_distributions(dists: dict[str, torch.Tensor], labels: list[str], out: str | Path, n_show: int = 20) -> Path:
    """Bar charts of the n_show most likely tokens (by the base distribution), one panel per filter."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from scratchlm.viz.save import save_figure

    order = torch.argsort(dists["base"], descending=True)[:n_show]
    names = [labels[i] for i in order.tolist()]
    top = max(float(p[order].max()) for p in dists.values()) * 1.15
    fig, axes = plt.subplots(len(dists), 1, figsize=(max(6, 0.45 * n_show), 2.2 * len(dists)), squeeze=False)
    for ax, (title, p) in zip(axes[:, 0], dists.items()):
        ax.bar(range(len(names)), p[order].numpy(), color="tab:blue" if title == "base" else "tab:orange")
        kept = int((p > 0).sum())
        ax.set_title(f"{title}  ({kept} tokens kept)", fontsize=9)
        ax.set_ylim(0, top)
        ax.set_xticks(range(len(names)), names, rotation=60, fontsize=7)
    return save_figure(fig, out)
