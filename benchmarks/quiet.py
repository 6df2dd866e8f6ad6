"""Wait for a quiet machine before a timed run: the CPU time that *other* processes use, from /proc.

On a 2-core machine a second busy process wrecks 2-thread timings (llama.cpp drops from ~140 to 5-7
tok/s), so each timed run first waits until, over a short window, everything but this process used
less than `max_busy` of one core. Linux only; elsewhere it returns at once (reported as unknown).
"""

from __future__ import annotations

import os
import time
from pathlib import Path


def _cpu_ticks() -> tuple[int, int] | None:
    """(busy ticks of the whole machine, ticks of this process), or None off Linux."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
        mine = Path(f"/proc/{os.getpid()}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    values = [int(v) for v in fields]
    busy = sum(values) - values[3] - values[4]  # all but idle and iowait
    return busy, int(mine[11]) + int(mine[12])  # utime + stime of this process


def others_busy(window_s: float = 1.0) -> float | None:
    """Cores' worth of CPU used by other processes over the next window_s seconds (None: unknown)."""
    a = _cpu_ticks()
    time.sleep(window_s)
    b = _cpu_ticks()
    if a is None or b is None:
        return None
    hz = os.sysconf("SC_CLK_TCK")
    return max(0.0, ((b[0] - a[0]) - (b[1] - a[1])) / hz / window_s)


def wait_quiet(max_busy: float = 0.15, timeout_s: float = 600.0, stats: dict | None = None) -> float | None:
    """Block until other processes use < max_busy cores for 2 consecutive 1 s windows (or timeout).

    Returns the last measured load; `stats` (if given) accumulates waits and the worst load accepted.
    """
    deadline = time.monotonic() + timeout_s
    calm, load = 0, None
    while time.monotonic() < deadline:
        load = others_busy()
        if load is None:
            return None
        calm = calm + 1 if load < max_busy else 0
        if calm >= 2:
            break
    if stats is not None:
        stats["waits"] = stats.get("waits", 0) + 1
        stats["timeouts"] = stats.get("timeouts", 0) + (calm < 2)
        stats["max_load"] = max(stats.get("max_load", 0.0), load or 0.0)
    return load
