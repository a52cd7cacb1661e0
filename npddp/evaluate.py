"""``python -m npddp.evaluate CHECKPOINT``: loss and accuracy of a saved model (see :mod:`npddp.train.evaluate`)."""

import sys

from npddp.train.evaluate import main

if __name__ == "__main__":
    sys.exit(main())
