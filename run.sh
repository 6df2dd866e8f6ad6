#!/usr/bin/env bash
# Main job: create .venv, install scratchlm (torch pinned to the CPU wheel), then run the default job.
set -euo pipefail
cd "$(dirname "$0")"
if [ ! -x .venv/bin/scratchlm ]; then
  python3 -m venv .venv
  .venv/bin/pip install -q --upgrade pip
  .venv/bin/pip install -q torch==2.13.0
  .venv/bin/pip install -q -e .
fi
.venv/bin/scratchlm info --preset llama-small "$@"
