"""``python -m npddp.cluster``: see :mod:`npddp.cluster.cli`."""

import sys

from npddp.cluster.cli import main

if __name__ == "__main__":
    sys.exit(main())
