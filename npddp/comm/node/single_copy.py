"""Whether the ranks of a node may copy straight between their private memories (cross-memory attach).

Once per node group, at set-up: :func:`agree_on_single_copy` checks that this process may read
every peer's memory (:mod:`npddp.comm.node.cma`), by reading a probe word each peer published,
and the node's ranks agree on one verdict, so either all of them move private buffers by single
copies or all of them stage.
"""

from __future__ import annotations

import os
import sys

import numpy as np

from npddp.comm.node import cma
from npddp.comm.node.memory import LINE, PID, SIZE_WORDS
from npddp.util import variables

#: The probe borrows the size words: it ends with a node barrier, and no call writes them before every
#: rank of the node has passed it.
_PROBE, _VERDICT = SIZE_WORDS
_PROBE_MAGIC = 0x6E70646470726F62


def agree_on_single_copy(group, call) -> str:
    """Agree with the node's ranks whether every one can read every other's memory; "" if so, else why not.

    Two node barriers: each rank publishes the address of a probe word and reads every
    peer's; then each publishes its verdict, and single copy is on only if all say yes.
    """
    why = cma.why_not()
    if not why:
        cma.allow_peers()
    probe = np.array([_PROBE_MAGIC, os.getpid()], dtype=np.int64)
    words, me, line = group.sync.words, group.li, group.li * LINE
    words[line + _PROBE] = probe.ctypes.data
    seq = group.reserve(2)
    group.sync.arrive(seq)
    group.wait(call, seq)
    got = np.zeros(2, dtype=np.int64)
    for i in group.sync.others:
        if why:
            break
        pid = group.sync.word(i, PID)
        try:
            cma.read(pid, group.sync.word(i, _PROBE), got)
        except ConnectionError as exc:
            why = f"reading a peer's memory failed ({exc})"
        else:
            if got[0] != _PROBE_MAGIC or got[1] != pid:
                why = "a peer's memory read back wrong (address spaces differ?)"
    words[line + _VERDICT] = 0 if why else 1
    group.sync.arrive(seq + 1)
    group.wait(call, seq + 1)
    del probe  # every peer has read it: they arrived after reading
    if not why and any(group.sync.word(i, _VERDICT) != 1 for i in group.sync.others):
        why = "a peer on this node cannot read the others' memory"
    if why and me == 0 and not why.startswith(variables.SINGLE_COPY.name):
        print(f"npddp: single-copy transfers of private buffers are off: {why}; staging them instead",
              file=sys.stderr, flush=True)
    return why
