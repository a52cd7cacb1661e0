"""``python -m npddp.generate CHECKPOINT --prompt TEXT``: sample text from a GPT (see :mod:`npddp.train.generate`)."""

import sys

from npddp.train.generate import main

if __name__ == "__main__":
    sys.exit(main())
