"""The tuning file ``python -m npddp.tune`` writes and ``auto`` reads: its format and its check.

Tuning file (JSON)::

    {"format": "npddp-allreduce-tuning", "version": 1, "transport": "mpi", "world_size": 4,
     "table": {"*": [[65536, "rd"], [4194304, "rabenseifner"], [null, "ring"]],
               "float16": [[null, "ring"]]}}

Each list maps a dtype (``*``: any other) to ``[max_bytes, algorithm]`` steps in increasing
order; a call of ``n`` bytes uses the first step with ``n <= max_bytes`` (``null``: no bound).
An algorithm is a hand-written one, ``shm`` (every rank on one node), ``hier`` (as many ranks, more
than one, on every node) or ``mpi``, MPI's own all-reduce (over the MPI transport only).
"""

from __future__ import annotations

from npddp.comm import checks as c
from npddp.comm.algorithms.registry import ALGORITHMS, LIBRARY, NODE_ALGORITHMS, costed

FORMAT = "npddp-allreduce-tuning"
VERSION = 1


def check_table(data, transport: str, size: int, node: bool = False, hier: bool = False, library: bool = False) -> dict:
    """The ``table`` of a parsed tuning file, validated for this job; ValueError naming what is wrong."""
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"not an npddp tuning file (format is not {FORMAT!r})")
    if data.get("version") != VERSION:
        raise ValueError(f"version {data.get('version')!r}; this npddp reads version {VERSION}")
    if data.get("world_size") != size:
        raise ValueError(f"it was measured on {data.get('world_size')} ranks, this job has {size}")
    if data.get("transport") != transport:
        raise ValueError(f"it was measured over transport {data.get('transport')!r}, this job uses {transport!r}")
    table = data.get("table")
    if not isinstance(table, dict) or "*" not in table:
        raise ValueError("its table has no '*' entry (the default for every dtype)")
    for dtype, steps in table.items():
        if dtype != "*" and dtype not in c.DTYPES:
            raise ValueError(f"table entry for unknown dtype {dtype!r}; valid: *, {', '.join(c.DTYPES)}")
        if not isinstance(steps, list) or not steps or steps[-1][0] is not None:
            raise ValueError(f"steps for {dtype!r} must be a non-empty list ending with [null, algorithm]")
        bounds = [s[0] for s in steps[:-1]]
        if any(not isinstance(b, int) or b < 0 for b in bounds) or bounds != sorted(bounds):
            raise ValueError(f"steps for {dtype!r}: max_bytes must be increasing integers")
        valid = [*ALGORITHMS, *costed(), *(NODE_ALGORITHMS if node else ()), *(("hier",) if hier else ()),
                 *((LIBRARY,) if library else ())]
        unknown = [s[1] for s in steps if s[1] not in valid]
        if unknown:
            raise ValueError(f"steps for {dtype!r} name algorithms {unknown} this job cannot run; valid: "
                             f"{', '.join(valid)}" + ("" if node else " (shm needs every rank on one node)")
                             + (f" ({LIBRARY} is MPI's own all-reduce: over the MPI transport only)"
                                if LIBRARY in unknown else ""))
    return table
