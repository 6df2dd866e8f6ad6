"""Hand back the calling thread's OpenMP worker threads, so only the scheduler thread keeps a team.

torch's CPU kernels (and scratchlm's C++ kernels, through at::parallel_for) run on OpenMP. With GNU libgomp,
every thread that ever ran a parallel region keeps its own pool of worker threads for the life of the thread,
and once the process holds more such threads than it has CPUs, libgomp stops spinning between parallel
regions (GOMP_SPINCOUNT throttles from ~300,000 to 100 spins): every region then wakes its workers through the
kernel. The server loads the model on the main thread (one pool) and decodes on the scheduler thread (a
second pool); on a 2-CPU machine that put the process at 4 managed threads against 2 CPUs, and each of the
~150 parallel regions of a decode step paid a futex wake-up: the C++ step used 1.7 of 2 cores and took
~15 ms instead of ~12 (SmolLM2-135M Q4_1, benchmarks/RESULTS.md).

`release_openmp_team()` asks every OpenMP runtime mapped into the process to free the calling thread's pool
(OpenMP 5.0 `omp_pause_resource_all(omp_pause_soft)`; libgomp frees the thread's pool, its workers exit). The
thread may still run parallel regions later (a new pool is made on demand); the server's event loop runs no
torch work, so after the call the scheduler's pool is the only one.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

OMP_PAUSE_SOFT = 1  # omp_pause_resource_t: free the runtime's resources, keep its settings
RUNTIMES = ("libgomp", "libiomp", "libomp")  # GNU, Intel and LLVM OpenMP runtimes


def openmp_runtimes(maps: Path = Path("/proc/self/maps")) -> list[str]:
    """Paths of the OpenMP runtime libraries mapped into this process (Linux; [] where /proc is absent)."""
    try:
        lines = maps.read_text().splitlines()
    except OSError:
        return []
    fields = (line.split(maxsplit=5) for line in lines)  # address perms offset dev inode [path]
    paths = {f[5] for f in fields if len(f) == 6}
    return sorted(p for p in paths if os.path.basename(p).startswith(RUNTIMES) and ".so" in p)


def release_openmp_team() -> int:
    """Free the calling thread's OpenMP worker pool in every mapped runtime; returns how many runtimes did.
    A no-op (0) where none is mapped or a runtime lacks omp_pause_resource_all (OpenMP < 5.0)."""
    done = 0
    for path in openmp_runtimes():
        try:
            lib = ctypes.CDLL(path)  # already loaded: the same handle, no second copy
            pause = lib.omp_pause_resource_all
        except (OSError, AttributeError):
            continue
        pause.argtypes, pause.restype = [ctypes.c_int], ctypes.c_int
        done += pause(OMP_PAUSE_SOFT) == 0
    return done
