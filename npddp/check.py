"""``python -m npddp.check``: the communicator contract, checked on any backend (see :mod:`npddp.tools.check`)."""

import sys

from npddp.tools.check import main

if __name__ == "__main__":
    sys.exit(main())
