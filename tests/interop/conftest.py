"""Interop tests use tiny models: one torch thread is fastest and keeps the 2 shared cores from thrashing."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread):
    """Every interop test runs on one torch thread (the shared fixture in tests/conftest.py)."""
    yield
