"""Shared test fixtures: the ../shared/data directory and deterministic seeding."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from smollm2_fixture import locate_smollm2

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO_ROOT.parent / "shared" / "data"

if os.environ.get("PYTEST_XDIST_WORKER"):
    # the suite runs as 2 pytest-xdist workers (pyproject addopts), one per core: each worker's torch uses one
    # thread, so the two never oversubscribe the cores (2 x 2 OpenMP threads on 2 cores thrash)
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """Path to ../shared/data (real corpora and GPT-2 tokenizer files); fails loudly if absent."""
    if not SHARED_DATA.is_dir():
        raise FileNotFoundError(f"tests need {SHARED_DATA} (the shared data folder beside the repo)")
    return SHARED_DATA


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    """Path of SmolLM2-135M-Instruct.Q4_1.gguf (the real-model fixture); a missing package fails the test.

    The package is located without importing it (its module pulls in an unrelated CLI)."""
    return locate_smollm2()


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


@pytest.fixture(scope="session")
def kernels():
    """The compiled kernel module; skips the test where it cannot be built (no C++ compiler) or is switched off
    (SCRATCHLM_KERNELS=0): there the fast paths' `applies` is False and the torch paths run (tested on their own)."""
    from scratchlm.kernels.build import native

    mod = native()
    if mod is None:
        pytest.skip("no C++ compiler / SCRATCHLM_KERNELS=0: the native kernels are not built")
    return mod


@pytest.fixture
def one_torch_thread():
    """Run a test on one torch thread (tiny models are fastest so, and 2 shared cores do not thrash)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
