"""Every program the fuzzer found failing, kept as a regression seed: ``tests/fuzz/test_fuzz.py`` runs each again.

An entry is what the finding's reproducer names: ``python -m tests.fuzz --program SEED --backends
BACKEND --nproc N --transport T --perturb on|off``. While a ``known.KNOWN_OPEN`` rule covers an
entry the test skips it (naming the rule); once the rule is gone the entry must pass.
"""

from __future__ import annotations

from typing import NamedTuple


class Finding(NamedTuple):
    """One failing program and what it showed."""

    seed: int
    nproc: int
    transport: str
    backend: str
    perturbed: bool
    what: str


FINDINGS = (
    Finding(590172847789, 3, "tcp", "ring", True, "progress thread: iallgather count 1 vs 0; rank 1 times out "
            "(10 s, 'ring iallreduce did not complete', though the call is an iallgather) while 0 and 2 raise"),
    Finding(564985076427, 4, "mpi", "rd", True, "progress thread: ranks 0 and 1 time out in a wait, 2 and 3 raise"),
    Finding(390030966363, 4, "mpi", "shm", True, "shm iallreduce, rank 2's buffer empty, the others 4991 float32: "
            "ranks 0, 1, 3 raise the mismatch, rank 2 ends the program without an error"),
    Finding(48221022731, 2, "tcp", "hier", True, "an empty scatter (0 elements) with root's dtype changed: "
            "no rank raises (#44 item 2)"),
    Finding(336200228320, 4, "mpi", "naive", True, "rank 3 swaps an empty gather and a barrier: timeouts (#44 item 2)"),
)
