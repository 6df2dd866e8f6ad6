"""Shared test fixtures: the ../shared/data directory and deterministic seeding."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO_ROOT.parent / "shared" / "data"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """Path to ../shared/data (real corpora and GPT-2 tokenizer files); fails loudly if absent."""
    if not SHARED_DATA.is_dir():
        raise FileNotFoundError(f"tests need {SHARED_DATA} (the shared data folder beside the repo)")
    return SHARED_DATA


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)
