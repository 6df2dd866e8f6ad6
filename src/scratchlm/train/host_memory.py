"""Keep freed host memory inside a training process instead of handing it back to the OS every step.

A training step allocates and frees the same activations and gradients each step (~100 MB at the llama-small
benchmark shape). glibc's malloc serves blocks above its mmap threshold (128 KB, rising by itself to at most
32 MB) with fresh mmaps and unmaps them on free, and trims the heap's free top past 2x that threshold, so
every step touches those pages anew: each first touch is a page fault that zeroes 4 KB. Measured on the
llama-small bf16 step (2 threads): ~22,000 page faults a step (~88 MB), a few percent of its time, and more
than half the cost of a small op (an RMSNorm forward + backward with its three casts to bf16: 5.5 -> 2.4 ms).

    mallopt(M_MMAP_THRESHOLD, 1 GiB)      blocks below 1 GiB come from the heap (reused, no fresh pages)
    mallopt(M_TRIM_THRESHOLD, 2 GiB - 1)  the heap's free top stays mapped

The peak resident memory is unchanged (what a step frees is what the next allocates); what stays resident after
a peak is at most that peak. Nothing numeric changes. Applies only to glibc (Linux); elsewhere, or with
SCRATCHLM_KEEP_HOST_MEMORY=0, it does nothing. Trainers call `keep_host_memory()` once when they start.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

M_TRIM_THRESHOLD = -1  # glibc malloc.h
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 1 << 30
TRIM_THRESHOLD = (1 << 31) - 1  # mallopt takes an int

_applied = False


def _glibc() -> ctypes.CDLL | None:
    """The C library when it is glibc (it has mallopt and gnu_get_libc_version), else None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None
    return libc if hasattr(libc, "mallopt") and hasattr(libc, "gnu_get_libc_version") else None


def keep_host_memory(enabled: bool | None = None) -> bool:
    """Set glibc malloc to keep freed blocks (see the module docstring); True when the settings are in force.

    enabled None reads SCRATCHLM_KEEP_HOST_MEMORY (default on; "0" turns it off). Idempotent."""
    global _applied
    if enabled is None:
        enabled = os.environ.get("SCRATCHLM_KEEP_HOST_MEMORY", "1") != "0"
    if not enabled:
        return _applied
    if _applied:
        return True
    libc = _glibc()
    if libc is None:
        return False
    _applied = bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(libc.mallopt(M_TRIM_THRESHOLD,
                                                                                           TRIM_THRESHOLD))
    return _applied
