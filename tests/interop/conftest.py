"""Interop tests use tiny models: one torch thread is fastest and keeps the 2 shared cores from thrashing."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
