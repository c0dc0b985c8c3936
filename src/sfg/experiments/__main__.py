"""``python -m sfg.experiments run GRID.yaml --store S`` (same as ``sfg grid``)."""

import sys

from sfg.cli.grid import main

if __name__ == "__main__":
    sys.exit(main())
