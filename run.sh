#!/usr/bin/env bash
# Main job: create .venv, install scratchlm (torch pinned to the CPU wheel), then run the quickstart:
# default corpus (Python stdlib sources + pydoc topics) -> BPE tokenizer -> a tiny llama trained for
# a few minutes -> validation loss, samples, runs/quickstart/{checkpoint,loss.png}.
# Extra arguments go to `scratchlm quickstart` (e.g. ./run.sh --data my.txt --minutes 10).
set -euo pipefail
cd "$(dirname "$0")"
. scripts/ensure_venv.sh
.venv/bin/pip install -q -e .
.venv/bin/scratchlm quickstart --overwrite "$@"
