"""A kernel build killed mid-way leaves torch's `lock` file behind: later processes must still load."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from torch.utils.cpp_extension import _get_build_directory

from scratchlm.kernels.build import build_name

LOAD = "import sys; from scratchlm.kernels.build import native; sys.exit(0 if native() is not None else 3)"


def test_a_stale_torch_build_lock_does_not_hang_the_next_process() -> None:
    build_dir = Path(_get_build_directory(build_name(), False))
    build_dir.mkdir(parents=True, exist_ok=True)
    (build_dir / "lock").write_text("")  # what a SIGKILLed build leaves (torch's FileBaton never expires)
    env = {k: v for k, v in os.environ.items() if k != "SCRATCHLM_KERNELS"}
    # the timeout only guards against the hang (torch waits on the file forever); a build takes < 2 min
    done = subprocess.run([sys.executable, "-c", LOAD], env=env, timeout=600, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert not (build_dir / "lock").exists()
