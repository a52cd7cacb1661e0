"""``python -m npddp.run``: the torchrun-style launcher (see :mod:`npddp.process.spawn`)."""

import sys

from npddp.process.spawn import main

if __name__ == "__main__":
    sys.exit(main())
