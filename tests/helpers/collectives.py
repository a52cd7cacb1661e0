"""Cases the collective tests share: element counts worth testing, one exact all-reduce checked, and where a
shared-memory backend's buffers may live."""

import numpy as np

#: (input, output): shared or private; output None: in place.
PLACEMENTS = (("shared", None), ("shared", "shared"), ("shared", "private"), ("private", "shared"),
              ("private", None))


#: How the large path moves private buffers: through staging, or by single-copy transfers
#: between the processes (cross-memory attach) at every size the large path takes.
PATHS = ("staged", "single-copy")


def sizes(k: int) -> list[int]:
    """Element counts worth testing with ``k`` ranks."""
    return sorted({0, 1, k - 1, k, k + 1, 1009})


def run_case(comm, values, n, dtype, op, inplace, shape=None):
    """One all-reduce of the exact inputs; returns (result, list of problems)."""
    x = values.rank(n, comm.rank, dtype, op)
    expected = values.expected(n, comm.size, dtype, op)
    if shape is not None:
        x, expected = x.reshape(shape), expected.reshape(shape)
    case = f"n={n} shape={x.shape} {np.dtype(dtype).name} {op} {'in place' if inplace else 'out='}"
    problems = []
    if inplace:
        got = comm.allreduce(x, op)
        if got is not x:
            problems.append(f"{case}: in-place call did not return buf")
    else:
        x.flags.writeable = False  # out= only reads the input
        before = x.copy()
        out = np.full_like(x, -7)
        got = comm.allreduce(x, op, out=out)
        if got is not out:
            problems.append(f"{case}: did not return out")
        if not np.array_equal(x, before):
            problems.append(f"{case}: input changed")
    if got.dtype != expected.dtype or got.shape != expected.shape or not np.array_equal(got, expected):
        problems.append(f"{case}: got {got.ravel()[:6]}, expected {expected.ravel()[:6]}")
    return got, problems
