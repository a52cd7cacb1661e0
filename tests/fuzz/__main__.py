"""``python -m tests.fuzz``: see :mod:`tests.fuzz.driver`."""

import sys

from tests.fuzz.driver import main

sys.exit(main())
