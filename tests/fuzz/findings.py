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
    Finding(280155983271, 2, "mpi", "auto", False, "poll-behind", "the same at N = 2: both ranks still polling"),
    Finding(990948307448, 4, "tcp", "auto", False, "poll-behind", "auto over TCP: every rank still polling 95 s "
            "later (NPDDP_TIMEOUT=60)"),
    Finding(500746381172, 2, "tcp", "shm", False, "poll-behind", "shm over TCP: both ranks still polling"),
    Finding(201335299568, 2, "mpi", "naive", True, "test-ignores-abort", "rank 0 raises the mismatch, rank 1's "
            "test() loop is still False 20 s later"),
    Finding(428865193223, 3, "mpi", "rd", True, "test-ignores-abort", "ranks 0, 1 raise, rank 2 polls on"),
    Finding(776918719850, 2, "tcp", "naive", True, "thread-abort", "progress thread: rank 0 raises, rank 1's "
            "test() loop never ends"),
    Finding(147284064081, 3, "tcp", "rd", True, "thread-abort", "progress thread: ranks 1, 2 raise, rank 0 times "
            "out in wait ('rd iallreduce did not complete', whatever the call)"),
    Finding(700881884110, 4, "tcp", "tree", True, "root-unchecked", "scatter with rank 2's root changed: every rank "
            "ends without an error (#44 item 1)"),
    Finding(374351776941, 3, "mpi", "ring", True, "root-unchecked", "root changed: every rank times out (#44 item 1)"),
    Finding(82610879166, 2, "mpi", "rd", True, "p2p-unchecked", "a longer message than the receive: MPICH ends the "
            "receiving process (a C backtrace, exit 1) (#44 item 5)"),
    Finding(1041102075541, 2, "mpi", "ring", True, "p2p-unchecked", "a longer message: mpi4py.MPI.Exception "
            "'Message truncated' (#44 item 5)"),
    Finding(727381638114, 3, "mpi", "auto", True, "shm-vs-messages", "rank 1 swaps reduce_scatter(int32, 45) and "
            "allreduce(float16, 4997): every rank times out"),
    Finding(741983791491, 3, "tcp", "auto", True, "shm-vs-messages", "rank 0 swaps allreduce(int64, 3) and a barrier: "
            "every rank times out"),
)
