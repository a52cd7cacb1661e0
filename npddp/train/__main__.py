"""``python -m npddp.train``: the training CLI."""

import sys

from npddp.train.cli.main import main

sys.exit(main())
