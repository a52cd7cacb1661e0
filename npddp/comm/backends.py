"""The hand-written backends by name: which communicator runs a name over a transport (``create`` calls :func:`build`)."""

from __future__ import annotations

from functools import partial

from npddp.comm.communicators.naive import NaiveCommunicator
from npddp.comm.communicators.p2p import P2PCommunicator
from npddp.comm.compose.auto import AutoCommunicator
from npddp.comm.compose.hier import HierCommunicator
from npddp.comm.node.shm import ShmCommunicator
from npddp.comm.algorithms.registry import algorithm


def build(name: str, transport, timeout: float, tuning=None, shared_memory: bool = True, algorithms=None):
    """The hand-written backend ``name`` (an algorithm, ``auto``, ``shm`` or ``hier``) over ``transport``.

    ``shared_memory=False``: ``auto`` never uses shared memory (hier's group across nodes, whose
    ranks lie on different nodes even where ``NPDDP_RANKS_PER_NODE`` pretends so on one machine).
    ``algorithms``: {collective: algorithm name} for the other collectives (:mod:`npddp.comm.communicators.choice`).
    """
    if algorithms and name in ("naive", "hier"):
        raise ValueError(f"algorithms= does not apply to the {name} backend (it runs its own schedules); "
                         f"leave it out or pick a backend that runs one algorithm per collective")
    if name == "auto":
        return AutoCommunicator(transport, timeout, tuning, shared_memory, algorithms)
    if name == "shm":
        return ShmCommunicator(transport, timeout, algorithms=algorithms)
    if name == "hier":
        return HierCommunicator(transport, partial(AutoCommunicator, timeout=timeout, shared_memory=False), timeout)
    if name == "naive":
        return NaiveCommunicator(transport, algorithm(name), name, timeout)
    return P2PCommunicator(transport, algorithm(name), name, timeout, algorithms)
