"""``python -m npddp.train``: the training CLI."""

import sys

from npddp.train.cli import main

sys.exit(main())
