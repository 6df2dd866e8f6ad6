# Sourced by run.sh and test.sh: create .venv with the pinned CPU torch wheel if it is missing.
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
  .venv/bin/pip install -q --upgrade pip
  .venv/bin/pip install -q torch==2.13.0
fi
