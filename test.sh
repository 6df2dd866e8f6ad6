#!/usr/bin/env bash
# Tests: install scratchlm with its test extra into .venv and run the whole suite.
set -euo pipefail
cd "$(dirname "$0")"
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
  .venv/bin/pip install -q --upgrade pip
  .venv/bin/pip install -q torch==2.13.0
fi
.venv/bin/pip install -q -e ".[test]"
.venv/bin/python -m pytest tests -q "$@"
