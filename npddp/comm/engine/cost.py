"""An algorithm's alpha-beta-gamma cost: the one description ``auto``, the tuner and the report's projection read."""

from __future__ import annotations

from typing import NamedTuple


class Cost(NamedTuple):
    """One all-reduce's alpha-beta-gamma terms: ``time = steps * alpha + sent * beta + reduced * gamma``."""

    steps: float    # messages one after another on the critical path
    sent: float     # bytes the busiest rank sends on the critical path
    reduced: float  # bytes it reduces on the critical path

    def time(self, alpha: float, beta: float, gamma: float = 0.0) -> float:
        """Seconds, for alpha (s per message), beta (s per byte sent) and gamma (s per byte reduced)."""
        return self.steps * alpha + self.sent * beta + self.reduced * gamma

