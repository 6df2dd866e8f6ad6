"""`python -m scratchlm ...`: the same program as the `scratchlm` console script."""

import sys

from scratchlm.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
