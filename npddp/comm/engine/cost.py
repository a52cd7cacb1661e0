"""The one cost model: an algorithm's alpha-beta-gamma terms, and the constants ``auto`` prices them with.

Convention, everywhere in npddp (``auto``, the tuner, the benchmarks' fit and projection): alpha in
seconds per message on the critical path, beta in seconds per byte sent, gamma in seconds per byte
reduced; ``time = steps * alpha + sent * beta + reduced * gamma`` (:meth:`Cost.time`). A link of
``B`` bytes/s has ``beta = 1 / B``.
"""

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


#: Cost-model constants per transport: alpha (s per step), beta (s per byte sent), gamma (s per byte reduced).
MODEL = {
    "mpi": (12e-6, 1 / 6.0e9, 1 / 4.0e9),
    "tcp": (40e-6, 1 / 2.5e9, 1 / 4.0e9),
}
#: Across nodes (ranks on different hosts, joined by a network): alpha and beta of a 1 Gbit/s TCP link, gamma
#: as on a node. Measured on emulated nodes (docs/results/2026-11-25-cluster-links.md): there an exchange of a
#: whole block larger than a chunk does not overlap its send with its receive (2.0x the ring at 16 MiB over
#: MPICH's TCP path, 1.2x over npddp's sockets), while the ring's pipelined chunks keep the link busy both ways; so beyond one chunk
#: the model charges the others' bytes twice (:func:`npddp.comm.compose.costmodel.network_time`).
NETWORK = (50e-6, 8e-9, 1 / 4.0e9)
