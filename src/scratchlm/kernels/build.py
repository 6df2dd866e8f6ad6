"""Build (once, cached) and load scratchlm's C++ decode kernels; `None` where that is not possible.

The sources ship as package data (`kernels/csrc/*.cpp`) and are compiled on first use with
`torch.utils.cpp_extension.load` (g++, ninja) for the machine that runs them (`-march=native`: AVX-512
inner loops where the CPU has them, a portable loop otherwise). The build lands in torch's extension
cache (`TORCH_EXTENSIONS_DIR`, default ~/.cache/torch_extensions) under a name that hashes the sources,
the flags and the CPU, so later processes load it in well under a second and a changed source or
another CPU gets its own build. Set `SCRATCHLM_KERNELS=0` to never build or use them: every caller
then takes its pure-torch path (same math, see kernels/ops.py). `SCRATCHLM_KERNELS_PORTABLE=1` builds the
portable inner loops even where the CPU has AVX2 / AVX-512 (csrc/simd.h), to test them on any machine.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import os
import platform
import shutil
import warnings
from pathlib import Path
from collections.abc import Iterator
from types import ModuleType

CSRC = Path(__file__).parent / "csrc"
SOURCES = ("module.cpp",)  # includes the headers (simd.h, simd_dot.h, blocks.h, gemv.h, gemv_a8.h,
#                            gemv_a8_blocks.h, a8_gemm.h, block_gemm.h, gemm_micro.h, strassen_gemm.h, gemv_centered*.h,
#                            gemv_fixed24.h, gemv_fixed24_avx2.h, gemv_fixed24_b32.h, gemv_r16.h, r16_layout.h, weight_rows.h, parallel.h,
#                            matrix_ref.h, linear.h, softmax_exp.h,
#                            kv_attention.h,
#                            llama_step.h, moe_layer.h, gate_activation.h, causal_softmax.h, attention_scores.h, cross_entropy_rows.h,
#                            rms_norm_rows.h, silu_gate.h, rope_rows.h, aligned_buffer.h)
CFLAGS = ("-O3", "-march=native", "-fopenmp", "-ffp-contract=off")


def cflags() -> tuple[str, ...]:
    """The compiler flags: CFLAGS, plus -DSCRATCHLM_PORTABLE when SCRATCHLM_KERNELS_PORTABLE=1."""
    portable = os.environ.get("SCRATCHLM_KERNELS_PORTABLE", "0").strip().lower() in ("1", "true", "on", "yes")
    return CFLAGS + (("-DSCRATCHLM_PORTABLE",) if portable else ())


def disabled() -> bool:
    """True when the environment turns the native kernels off (SCRATCHLM_KERNELS=0)."""
    return os.environ.get("SCRATCHLM_KERNELS", "1").strip().lower() in ("0", "false", "off", "no")


def cpu_signature() -> str:
    """A string that differs between CPUs that need different -march=native builds."""
    try:
        info = Path("/proc/cpuinfo").read_text()
        lines = [ln for ln in info.splitlines() if ln.startswith(("model name", "flags"))][:2]
        return "\n".join(lines)
    except OSError:
        return platform.processor() or platform.machine()


def build_name() -> str:
    """scratchlm_kernels_<hash of sources, flags, CPU>: one cached build per (code, machine)."""
    h = hashlib.sha256()
    for path in sorted(CSRC.iterdir()):
        h.update(path.name.encode() + path.read_bytes())
    h.update(" ".join(cflags()).encode())
    h.update(cpu_signature().encode())
    return "scratchlm_kernels_" + h.hexdigest()[:12]


@contextlib.contextmanager
def build_lock(build_dir: Path) -> Iterator[None]:
    """Hold an OS lock on `build_dir/scratchlm.lock` (released by the kernel when its process dies) and
    clear torch's own `lock` file under it.

    torch's `load` guards every build *and every load* with a plain file (`FileBaton`) that a killed build
    leaves behind; later processes would then wait on it forever. While we hold the flock no scratchlm
    process is building this name, so a `lock` file found then is stale and is removed.
    """
    build_dir.mkdir(parents=True, exist_ok=True)
    with open(build_dir / "scratchlm.lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            (build_dir / "lock").unlink(missing_ok=True)
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


# What native() found, for code that torch.compile traces (it must not call native(): that reads files).
LOADED = {"kernels": False, "bf16_dot": False}


@functools.cache
def native() -> ModuleType | None:
    """The compiled kernel module (built on first call), or None when disabled or no compiler works."""
    if disabled() or shutil.which(os.environ.get("CXX", "c++")) is None:
        return None
    try:
        import torch  # noqa: F401  (loads torch's OpenMP runtime first: the extension then shares it)
        from torch.utils.cpp_extension import _get_build_directory, load

        name = build_name()
        with build_lock(Path(_get_build_directory(name, False))):
            mod = load(name=name, sources=[str(CSRC / s) for s in SOURCES], extra_cflags=list(cflags()),
                       extra_ldflags=["-fopenmp"], verbose=False)
        LOADED.update(kernels=True, bf16_dot=bool(mod.has_bf16_dot()))
        return mod
    except Exception as exc:  # a missing compiler/ninja/headers: fall back to torch, say so once
        warnings.warn(f"scratchlm: native decode kernels unavailable ({type(exc).__name__}: {exc}); "
                      "using the pure-torch paths", RuntimeWarning, stacklevel=2)
        return None


def native_ready(feature: str = "kernels") -> bool:
    """The kernels are loaded ("kernels") / have AVX512-BF16 dot products ("bf16_dot"). Inside torch.compile's
    tracing this reads what an earlier eager native() call found and never loads or builds (a compiled caller
    calls native() first: train/loop.py, benchmarks/train_step.py); eagerly it loads them."""
    import torch

    if not torch.compiler.is_compiling():
        native()
    return LOADED[feature]


def main() -> int:
    """`python -m scratchlm.kernels.build`: build (or find cached) the kernels now and say where they are, so a
    first `generate` / test run does not spend its first ~90 s compiling. Exit 0 built or found, 1 unavailable."""
    mod = native()
    if mod is None:
        reason = "disabled by SCRATCHLM_KERNELS=0" if disabled() else "no working C++ compiler (see the warning)"
        print(f"scratchlm kernels: unavailable ({reason}); the pure-torch paths will be used")
        return 1
    print(f"scratchlm kernels: {build_name()} ({mod.simd()} inner loops) at {Path(mod.__file__).parent}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
