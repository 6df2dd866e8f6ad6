"""Make tests/generate/gen_helpers.py importable as `gen_helpers`."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
