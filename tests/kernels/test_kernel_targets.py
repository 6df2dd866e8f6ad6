"""The kernels' C++ compiles for every instruction-set branch, not only this machine's.

The module is built with -march=native, so CI compiles one branch of each `#if defined(SCRATCHLM_AVX512 / AVX2 /
FIXED24 / VNNI / __GFNI__)`; a name used on one branch and defined on another broke the portable build once (a CPU
without AVX2, or SCRATCHLM_KERNELS_PORTABLE=1). Here g++ compiles module.cpp (-O0 to /dev/null: every template the
module instantiates, and each intrinsic checked against the target's instruction sets, which -fsyntax-only skips)
for the portable loop, a generic x86-64, AVX2 (haswell), AVX-512 without VNNI / VBMI (skylake-avx512) and AVX-512
with VNNI but no GFNI (cascadelake; icelake-server with -mno-gfni): gemv_fixed24.h's f24_take falls back to rotates.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig

import pytest
from torch.utils.cpp_extension import include_paths

from scratchlm.kernels.build import CSRC

TARGETS = {"portable": ["-march=x86-64", "-DSCRATCHLM_PORTABLE"], "x86-64": ["-march=x86-64"],
           "avx2": ["-march=haswell"], "avx512-no-vnni": ["-march=skylake-avx512"],
           # VNNI without GFNI (Cascade Lake: gemv_fixed24.h's K-quants), and VBMI / BITALG without it (the b32 types)
           "avx512-vnni-no-gfni": ["-march=cascadelake"], "icelake-no-gfni": ["-march=icelake-server", "-mno-gfni"]}


@pytest.mark.skipif(shutil.which("g++") is None or not sys.platform.startswith("linux"), reason="no g++ here")
@pytest.mark.parametrize("target", sorted(TARGETS))
def test_module_compiles_for_every_target(target: str) -> None:
    cmd = ["g++", "-std=c++17", "-O0", "-c", "-o", os.devnull, "-fopenmp", *TARGETS[target], *(f"-I{p}" for p in include_paths()),
           f"-I{sysconfig.get_paths()['include']}", "-DTORCH_EXTENSION_NAME=scratchlm_check", str(CSRC / "module.cpp")]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
