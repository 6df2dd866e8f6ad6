#!/usr/bin/env bash
# Tests: install scratchlm with its test extra into .venv and run the whole suite.
set -euo pipefail
cd "$(dirname "$0")"
. scripts/ensure_venv.sh
.venv/bin/pip install -q -e ".[test]"
.venv/bin/python -m scratchlm.kernels.build || true  # compile the C++ kernels once, before the suite
.venv/bin/python -m pytest tests -q -n 2 "$@"
