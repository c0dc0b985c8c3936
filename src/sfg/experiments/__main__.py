"""``python -m sfg.experiments run GRID.yaml --store S`` (same as ``sfg grid``)."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
