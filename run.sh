#!/usr/bin/env bash
# Main job: create .venv, install scratchlm (torch pinned to the CPU wheel), then run the quickstart:
# default corpus (Python stdlib sources + pydoc topics) -> BPE tokenizer -> a tiny llama trained for
# a few minutes -> validation loss, samples, runs/quickstart/{checkpoint,loss.png}.
# Extra arguments go to `scratchlm quickstart` (e.g. ./run.sh --data my.txt --minutes 10).
set -euo pipefail
cd "$(dirname "$0")"
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
  .venv/bin/pip install -q --upgrade pip
  .venv/bin/pip install -q torch==2.13.0
fi
.venv/bin/pip install -q -e .
.venv/bin/scratchlm quickstart --overwrite "$@"
