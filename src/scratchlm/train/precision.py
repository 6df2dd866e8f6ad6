"""Mixed precision: how a trainer's forward and backward passes compute (`--precision`).

    fp32        every op in fp32
    bf16-mixed  torch.autocast(bfloat16): matmuls (and the other ops on autocast's bf16 list) run in bf16 on
                bf16 copies of the weights made inside each forward; the master weights, their gradients,
                the optimizer state and the losses stay fp32 (cross entropy and log-probs upcast the
                logits: train/losses.py, align/logprobs.py; norms and RoPE compute in fp32 and cast back).
bf16 keeps fp32's exponent range, so no loss scaling is needed (fp16 would need a GradScaler).
The optimizer step and gradient clipping always run outside autocast, on the fp32 master weights.
Speed: bf16 pays where the CPU has bf16 matrix units (AVX512-BF16, AMX) or on a GPU; a CPU without them
(AVX2 only) runs bf16 matmuls through slow fallback kernels (benchmarks/RESULTS.md measures both).
"""

from __future__ import annotations

import contextlib

import torch

PRECISIONS = ("fp32", "bf16-mixed")


def check_precision(precision: str, what: str = "precision") -> str:
    """`precision` if it is one of PRECISIONS, else a ValueError naming the valid ones."""
    if precision not in PRECISIONS:
        raise ValueError(f"{what}={precision!r} is not one of {PRECISIONS}")
    return precision


def autocast(precision: str, device: torch.device | str) -> contextlib.AbstractContextManager:
    """The context a forward (and the backward it records) runs in: bf16 autocast for bf16-mixed, else nothing."""
    check_precision(precision)
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(torch.device(device).type, dtype=torch.bfloat16)


def full_precision(device: torch.device | str) -> contextlib.AbstractContextManager:
    """Leave any enclosing autocast: what runs inside sees fp32 as stored (optimizer steps, rollout sampling)."""
    return torch.autocast(torch.device(device).type, enabled=False)
