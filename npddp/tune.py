"""``python -m npddp.tune``: the all-reduce tuner (see :mod:`npddp.tools.tune`)."""

import sys

from npddp.tools.tune import main

if __name__ == "__main__":
    sys.exit(main())
