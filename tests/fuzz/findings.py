"""Every program the fuzzer found failing, kept as a regression seed: ``tests/fuzz/test_fuzz.py`` runs each again.

An entry is what the finding's reproducer names: ``python -m tests.fuzz --program SEED --backends
BACKEND --nproc N --transport T --perturb on|off``, and the ``known.KNOWN_OPEN`` rule it belongs to.
While that rule is listed the test skips the entry (naming the rule); once the rule is gone the
entry must pass. Seeds hold for the generator as it is (tests/fuzz/program.py): a change to it that
draws differently makes new programs of them, so find the programs again (``--known-open fail``).
"""

from __future__ import annotations

from typing import NamedTuple


class Finding(NamedTuple):
    """One failing program, its rule, and what it showed."""

    seed: int
    nproc: int
    transport: str
    backend: str
    perturbed: bool
    rule: str
    what: str


FINDINGS = (
    Finding(509219159649, 4, "mpi", "auto", False, "poll-behind", "iallgather then iallreduce open; a test() loop on "
            "the iallreduce: every rank still polling 20 s later (NPDDP_TIMEOUT=10)"),
    Finding(727381638114, 3, "mpi", "auto", True, "shm-vs-messages", "rank 1 swaps reduce_scatter(int32, 45) and "
            "allreduce(float16, 4997): every rank times out"),
    Finding(741983791491, 3, "tcp", "auto", True, "shm-vs-messages", "rank 0 swaps allreduce(int64, 3) and a barrier: "
            "every rank times out"),
)
