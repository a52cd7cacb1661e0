"""What the fuzzer may meet and not fail on: bugs being fixed now (KNOWN_OPEN), limits the docs state (LIMITS).

A rule names the perturbations it covers. ``KNOWN_OPEN`` entries are open bugs: a finding they
cover is reported as known, and ``--known-open skip`` (the default) does not even run the programs
they cover. Remove an entry once its fix is merged: the fuzzer then fails on what it covered.
``LIMITS`` are the cases docs/guide/comm.md lists as not caught by the argument check ("Not caught"):
there a perturbed program may end in ``TimeoutError`` instead of the mismatch error, on every rank
(never in a silent difference); ``--limits skip`` (the default) does not run them.
"""

from __future__ import annotations

from dataclasses import dataclass

from npddp.comm import BACKENDS

from tests.fuzz.program import NONBLOCKING, Program, is_outstanding_at

#: The hand-written backends (every one but MPI's own collectives).
HAND_WRITTEN = tuple(b for b in BACKENDS if b != "mpi")
#: Backends whose all-reduce on one node goes through shared memory and its size word.
SHARED_MEMORY = ("shm", "hier", "auto")


@dataclass(frozen=True)
class Rule:
    """A set of perturbed programs: by the perturbation's field, the perturbed op's kind, backend, transport, mode."""

    name: str
    what: str
    fields: tuple
    kinds: tuple = ()            # the perturbed op's blocking kind; () any
    backends: tuple = ()         # () any
    transports: tuple = ()       # () any
    modes: tuple = ()            # plain, debug, thread; () any
    empty: bool = False          # only where an op involved (of ``kinds``) has no elements
    overlapping: bool = False    # only where a non-blocking call is still open when the perturbed op starts
    nonblocking: bool = False    # only where a non-blocking call starts at or before the perturbed op
    polled: bool = False         # only where a non-blocking call is finished by a loop of test()
    behind: bool = False         # any program (perturbed or not) polling a call started after another still open

    def covers(self, program: Program, transport: str | None = None) -> bool:
        """True when ``program``'s perturbation is one of this rule's (any transport when ``transport`` is None)."""
        if self.behind:
            return (not self.backends or program.backend in self.backends) and _polls_behind(program)
        p = program.perturbation
        if p is None or p.field not in self.fields:
            return False
        involved = program.ops[p.index:p.index + 2] if p.field == "order" else (program.ops[p.index], p.op)
        if self.kinds:
            involved = [op for op in involved if op.base in self.kinds]
            if not involved:
                return False
        if (self.backends and program.backend not in self.backends) or (self.modes and program.mode not in self.modes):
            return False
        if transport is not None and self.transports and transport not in self.transports:
            return False
        if self.empty and all(op.count for op in involved):
            return False
        if self.nonblocking and not any(op.kind in NONBLOCKING for op in program.ops[:p.index + 2]):
            return False
        if self.polled and not any(op.kind == "wait" and op.place == "poll" for op in program.ops):
            return False
        return not self.overlapping or is_outstanding_at(program, p.index)


#: Every field a perturbation of a collective changes.
COLLECTIVE_FIELDS = ("dtype", "count", "op", "root", "order")

#: Open bugs: issue #44's items being fixed now, and what the fuzzer found since; each entry goes once its fix is merged.
KNOWN_OPEN: tuple = ()

#: What docs/guide/comm.md ("The argument check", "Not caught") says still ends in the timeout; NPDDP_DEBUG=1 checks them.
LIMITS = (
    Rule("overlapping", "an indexed call whose peer's mismatched message sits behind another unreceived message "
         "(non-blocking calls that overlap)", ("dtype", "count", "op", "root", "order"),
         modes=("plain", "thread"), overlapping=True),
    Rule("never-reach", "a rank that calls a collective whose messages never reach a rank that would check them "
         "(gather against scatter): two calls swapped, one of them rooted", ("order",),
         kinds=("broadcast", "gather", "scatter"), modes=("plain", "thread")),
    Rule("p2p-dtype-mpi", "MPI's messages carry no type: a point-to-point message of another dtype with the same "
         "byte count is received as its bytes (docs/guide/comm.md, point-to-point; TCP frames carry the dtype and refuse it)",
         ("p2p-dtype",), transports=("mpi",)),
)


def _polls_behind(program: Program) -> bool:
    """True when a loop of test() finishes a non-blocking call while one started before it on its communicator is open."""
    waited_at = {op.handle: i for i, op in enumerate(program.ops) if op.kind == "wait"}
    for i, op in enumerate(program.ops):
        if op.kind == "wait" and op.place == "poll":
            h = op.handle
            if any(o.kind in NONBLOCKING and o.comm == program.ops[h].comm and waited_at.get(j, len(program.ops)) > i
                   for j, o in enumerate(program.ops[:h])):
                return True
    return False


def is_open(name: str) -> bool:
    """True while a ``KNOWN_OPEN`` rule of that name is listed."""
    return any(r.name == name for r in KNOWN_OPEN)


def matching(rules, program: Program, transport: str | None = None):
    """The first rule of ``rules`` covering ``program`` (None if none)."""
    return next((r for r in rules if r.covers(program, transport)), None)
