"""Run metrics: a JSONL log, MFU from FLOPs per token, a measured matmul peak, and the loss plot.

MFU = achieved FLOP/s / peak FLOP/s, achieved = tokens/s * 6N-style training FLOPs per token
(`scratchlm.model_stats`: 3 x forward FLOPs, attention included).
"""

from __future__ import annotations

import io
import json
import time
from pathlib import Path
from typing import Any

import torch

from scratchlm.io_utils import atomic_write, atomic_write_text
from scratchlm.nn import onednn_linear


def measure_matmul_peak_gflops(dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
                               n: int = 1024, seconds: float = 0.5) -> float:
    """Best GFLOP/s of an n x n @ n x n matmul (2 n^3 FLOPs) over about `seconds`, by torch's matmul and (fp32 on
    CPU) by oneDNN's (nn/onednn_linear.py, the fused Linear's product): the faster of the two is the peak.

    The inputs come from a private generator: the global RNG (e.g. a resumed run's restored state) is untouched."""
    gen = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(n, n, device=device, dtype=dtype, generator=gen)
    b = torch.randn(n, n, device=device, dtype=dtype, generator=gen)
    products = [lambda: a @ b]
    if onednn_linear.applies(a, b):
        products.append(lambda: onednn_linear.mm_nt(a, b.t()))  # a (b^T)^T
    best = float("inf")
    for product in products:
        for _ in range(3):  # warm-up (thread pool, caches, clocks)
            product()
        t_end = time.perf_counter() + seconds / len(products)
        while time.perf_counter() < t_end or best == float("inf"):
            if torch.device(device).type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            product()
            if torch.device(device).type == "cuda":
                torch.cuda.synchronize()
            best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best / 1e9


def mfu(tokens_per_s: float, flops_per_token: float, peak_gflops: float) -> float:
    """Model FLOPs utilization in [0, 1]: tokens/s * FLOPs/token / peak."""
    return tokens_per_s * flops_per_token / (peak_gflops * 1e9) if peak_gflops > 0 else 0.0


class PeakTracker:
    """The peak GFLOP/s that MFU divides by: `given` (> 0, trusted as is) or measured (0.5 s at start).

    A measured peak is a lower bound of the machine's (a busy moment, a slow clock), so when a step
    achieves more than it, the peak is measured again and raised to at least the achieved rate: the
    MFU of a measured peak never exceeds 1 (the issue was 1.645 from a 0.3 s start-up measurement)."""

    def __init__(self, given: float, dtype: torch.dtype, device: torch.device) -> None:
        self.given, self.dtype, self.device = given, dtype, device
        self.peak = given or measure_matmul_peak_gflops(dtype, device, seconds=0.5)

    def mfu(self, tokens_per_s: float, flops_per_token: float) -> float:
        """MFU of this rate against the (possibly raised) peak."""
        achieved = tokens_per_s * flops_per_token / 1e9
        if not self.given and achieved > self.peak:
            self.peak = max(self.peak, achieved, measure_matmul_peak_gflops(self.dtype, self.device, seconds=0.3))
        return mfu(tokens_per_s, flops_per_token, self.peak)


class MetricsLog:
    """Append-only JSONL of metric records ({"step": ..., ...}); truncated to a step on resume."""

    def __init__(self, path: str | Path, enabled: bool = True) -> None:
        self.path = Path(path)
        self.enabled = enabled

    def truncate_after(self, step: int) -> None:
        """Keep only records with step <= `step` (the resumed checkpoint), rewritten atomically."""
        if not self.enabled or not self.path.exists():
            return
        keep = [line for line in self.path.read_text().splitlines()
                if line.strip() and _is_complete(line) and json.loads(line).get("step", 0) <= step]
        atomic_write_text(self.path, "".join(line + "\n" for line in keep))

    def write(self, record: dict[str, Any]) -> None:
        if self.enabled:
            with open(self.path, "a") as f:
                f.write(json.dumps(record) + "\n")

    def read(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines() if line.strip() and _is_complete(line)]


def _is_complete(line: str) -> bool:
    """A line cut by a kill mid-write is not valid JSON: skip it."""
    try:
        json.loads(line)
        return True
    except json.JSONDecodeError:
        return False


def plot_loss_curve(records: list[dict[str, Any]], path: str | Path, title: str = "") -> Path:
    """Train loss (and val loss points) against step, written atomically as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    train = [(r["step"], r["loss"]) for r in records if "loss" in r]
    val = [(r["step"], r["val_loss"]) for r in records if "val_loss" in r]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    if train:
        ax.plot(*zip(*train), label="train loss", linewidth=1)
    if val:
        ax.plot(*zip(*val), "o-", label="val loss", markersize=3)
    ax.set_xlabel("step")
    ax.set_ylabel("cross entropy (nats/token)")
    ax.set_title(title or "scratchlm training")
    ax.grid(alpha=0.3)
    ax.legend()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    with atomic_write(path) as f:
        f.write(buf.getvalue())
    return Path(path)
