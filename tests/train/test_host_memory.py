"""train/host_memory.py: after keep_host_memory() a freed block is reused without new page faults.

Run in a fresh Python process (the setting is process-wide and one-way): five "steps" that each allocate, write and
free 40 + 36 + 36 MB of tensors, counting minor page faults (getrusage) with and without the call. glibc's
default serves blocks above 32 MB (its largest dynamic mmap threshold) with fresh mmaps, so every step touches
~28,700 pages anew; with the setting the heap keeps and reuses them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from scratchlm.train import host_memory

PROBE = r"""
import json, resource, torch
from scratchlm.train.host_memory import keep_host_memory

def faults():
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(5):
        a = torch.ones(10 * 2**20)  # 40 MB, every page written
        b = torch.ones(9 * 2**20)
        c = a[: 9 * 2**20] + b
        del a, b, c
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0

before = faults()
kept = keep_host_memory()
faults()  # the first step after the switch grows the heap once
print(json.dumps({"before": before, "kept": kept, "after": faults(), "again": keep_host_memory()}))
"""


def run_probe(env_value: str | None) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "SCRATCHLM_KEEP_HOST_MEMORY"}
    if env_value is not None:
        env["SCRATCHLM_KEEP_HOST_MEMORY"] = env_value
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_freed_blocks_are_reused_without_page_faults() -> None:
    if host_memory._glibc() is None:
        pytest.skip("not glibc: keep_host_memory does nothing here")
    pages = 28 * 2**20 * 4 // 4096  # 28,672 per step
    r = run_probe(None)
    assert r["kept"] and r["again"]
    assert r["before"] > 4 * pages  # glibc's default: every allocation faults its pages in again
    assert r["after"] < pages  # kept: the same heap memory (at most a block re-placed once in five steps)


def test_switch_off_keeps_glibc_defaults() -> None:
    if host_memory._glibc() is None:
        pytest.skip("not glibc: keep_host_memory does nothing here")
    r = run_probe("0")
    assert not r["kept"] and not r["again"]
    assert r["after"] > 4 * 28 * 2**20 * 4 // 4096  # the control: glibc's default faults them in every step
