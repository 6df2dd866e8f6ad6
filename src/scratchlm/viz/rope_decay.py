"""RoPE long-term decay (RoFormer, Su et al. 2021, sec. 3.4.3 and fig. 2).

With h_i = q_[2i:2i+2] k*_[2i:2i+2] (complex) and S_j = sum_{k=0}^{j-1} e^{i r theta_k}, Abel summation gives
    |sum_i h_i e^{i r theta_i}| <= (max_i |h_{i+1} - h_i|) * sum_{j=1}^{d/2} |S_j|
The "relative upper bound" plotted against the relative distance r is (1 / (d/2)) * sum_{j=1}^{d/2} |S_j|;
it decays (with oscillations) as r grows: distant tokens interact less.
"""

from __future__ import annotations

from pathlib import Path

import torch

from scratchlm.nn.rope import rope_inv_freq


def rope_relative_upper_bound(distances: torch.Tensor, head_dim: int = 128, base: float = 10000.0) -> torch.Tensor:
    """(N,) relative distances -> (N,) bound (1/(d/2)) sum_j |S_j| in float64."""
    theta = rope_inv_freq(head_dim, base).double()  # (d/2,)
    angles = distances.double()[:, None] * theta[None, :]  # (N, d/2)
    partial = torch.cumsum(torch.polar(torch.ones_like(angles), angles), dim=-1)  # S_1..S_{d/2}: (N, d/2)
    return partial.abs().mean(dim=-1)


def plot_rope_decay(out: str | Path, head_dim: int = 128, base: float = 10000.0, max_distance: int = 256) -> Path:
    """Write the RoFormer fig. 2 plot (bound vs distance) to `out` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from scratchlm.viz.save import save_figure

    r = torch.arange(max_distance + 1)
    bound = rope_relative_upper_bound(r, head_dim, base)
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(r.numpy(), bound.numpy())
    ax.set_xlabel("relative distance m - n")
    ax.set_ylabel("relative upper bound")
    ax.set_title(f"RoPE long-term decay (d={head_dim}, base={base:g})")
    ax.grid(alpha=0.3)
    return save_figure(fig, out)
