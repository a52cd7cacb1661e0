"""PowerSGD (Vogels et al., 2019) as a DDP comm hook, with the semantics of PyTorch's ``powerSGD_hook``.

For each bucket, after ``start_iter`` steps of plain all-reduce:

1. Add the bucket's carried error (error feedback) and keep a copy of the sum.
2. View each gradient as a matrix ``M`` (first dimension by the rest). Matrices with
   ``(n + m) r * min_compression_rate >= n m`` (all 1-D tensors among them) go uncompressed:
   packed into one buffer, all-reduced and averaged.
3. For the others, with ``Q`` (m x r, orthonormal columns: random from a seed shared by all ranks at
   the first compressed step, else last step's ``Q``: warm start): ``P = M Q``; all-reduce all
   Ps in one call; orthogonalise each ``P``; ``Q = M^T P``; all-reduce all Qs in one call and
   divide by the size; ``M ~ P Q^T``.
4. The new error is the copy from step 1 minus the result.

Rank ``r`` of an n x m matrix is ``min(n, m, rank)``. Orthogonalisation is Gram-Schmidt for
rank <= 2 and a QR factorisation otherwise, as in PyTorch. The step counter advances when the
last bucket of a step is processed.
"""

from __future__ import annotations

import numpy as np

from npddp.parallel.hooks import GradBucket, Handle, HookState, allreduce_hook
from npddp.util.shown import shown

__all__ = ["PowerSGDState", "orthogonalize", "powersgd_hook"]


class PowerSGDState(HookState):
    """PowerSGD's settings and memory: per-bucket error, P and Q, the step counter and the seed stream."""

    __slots__ = ("comm", "rank", "start_iter", "min_compression_rate", "use_error_feedback", "warm_start",
                 "epsilon", "iter", "rng", "errors", "p_memory", "q_memory")

    def __init__(self, comm, rank: int = 1, start_iter: int = 1000, min_compression_rate: float = 2.0,
                 use_error_feedback: bool = True, warm_start: bool = True, epsilon: float = 0.0, seed: int = 0):
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
            raise ValueError(f"PowerSGD rank must be an int >= 1, got {shown(rank)}")
        if isinstance(start_iter, bool) or not isinstance(start_iter, int) or start_iter < 0:
            raise ValueError(f"PowerSGD start_iter must be an int >= 0, got {shown(start_iter)}")
        if (use_error_feedback or warm_start) and start_iter <= 1:
            raise ValueError(f"PowerSGD start_iter must be > 1 with error feedback or warm start, got {start_iter}")
        self.comm, self.rank, self.start_iter = comm, rank, start_iter
        self.min_compression_rate, self.epsilon = float(min_compression_rate), float(epsilon)
        self.use_error_feedback, self.warm_start = bool(use_error_feedback), bool(warm_start)
        self.iter = 0
        self.rng = np.random.RandomState(seed)      # draws the seed of each fresh Q, the same on every rank
        self.errors: dict[int, np.ndarray] = {}     # bucket index -> (n,) local error
        self.p_memory: dict[int, np.ndarray] = {}   # bucket index -> all Ps of the bucket, flat
        self.q_memory: dict[int, np.ndarray] = {}   # bucket index -> all Qs of the bucket, flat

    def maybe_increase_iter(self, bucket: GradBucket) -> None:
        """Count a step when its last bucket is done."""
        if bucket.is_last:
            self.iter += 1

    def state_dict(self) -> dict:
        """Arrays a checkpoint holds to resume bit-exactly: step, seed stream, errors, Ps and Qs."""
        name, keys, pos, has_gauss, gauss = self.rng.get_state()
        out = {"iter": np.array([self.iter], dtype=np.int64), "rng_keys": keys.astype(np.int64),
               "rng_pos": np.array([pos, has_gauss], dtype=np.int64), "rng_gauss": np.array([gauss])}
        for label, table in (("error", self.errors), ("p", self.p_memory), ("q", self.q_memory)):
            out.update({f"{label}.{i}": a.copy() for i, a in table.items()})
        return out

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`."""
        self.iter = int(state["iter"][0])
        pos, has_gauss = (int(v) for v in state["rng_pos"])
        self.rng.set_state(("MT19937", np.asarray(state["rng_keys"], dtype=np.uint32), pos, has_gauss,
                            float(state["rng_gauss"][0])))
        tables = {"error": {}, "p": {}, "q": {}}
        for key, value in state.items():
            label, _, index = key.partition(".")
            if label in tables and index:
                tables[label][int(index)] = np.array(value)
        self.errors, self.p_memory, self.q_memory = tables["error"], tables["p"], tables["q"]


def orthogonalize(matrix: np.ndarray, epsilon: float = 0.0) -> None:
    """Make the columns of ``matrix`` (n x r) orthonormal in place: Gram-Schmidt for r <= 2, else QR."""
    r = matrix.shape[1]
    if r > 2 and matrix.dtype != np.float16:
        matrix[...] = np.linalg.qr(matrix)[0]
        return
    for i in range(r):
        col = matrix[:, i:i + 1]
        col /= np.sqrt(np.sum(col * col, axis=0, keepdims=True)) + epsilon
        if i + 1 < r:
            rest = matrix[:, i + 1:]
            rest -= np.sum(col * rest, axis=0, keepdims=True) * col


def powersgd_hook(state: PowerSGDState, bucket: GradBucket) -> Handle:
    """PowerSGD on one bucket (see the module docstring); plain all-reduce before ``start_iter``."""
    comm, buf, index = state.comm, bucket.buffer, bucket.index
    if state.iter < state.start_iter:
        state.maybe_increase_iter(bucket)
        return allreduce_hook(comm, bucket)
    if state.use_error_feedback:
        error = state.errors.get(index)
        if error is not None:
            buf += error
        kept = buf.copy()                                       # (n,) gradient + error before compression
    compress, plain = [], []
    for g in bucket.gradients():
        m = g.reshape(g.shape[0], -1) if g.ndim else g.reshape(1, 1)
        n, k = m.shape
        r = min(n, k, state.rank)
        (compress if (n + k) * r * state.min_compression_rate < n * k else plain).append((m, r))
    flat = np.concatenate([m.reshape(-1) for m, _ in plain]) if plain else np.empty(0, buf.dtype)
    fresh = not state.warm_start or index not in state.p_memory
    if fresh:
        state.p_memory[index] = np.empty(sum(m.shape[0] * r for m, r in compress), dtype=buf.dtype)
        state.q_memory[index] = np.empty(sum(m.shape[1] * r for m, r in compress), dtype=buf.dtype)
    ps, qs = _views(state.p_memory[index], state.q_memory[index], compress)
    if fresh:
        seeded = np.random.RandomState(state.rng.randint(1_000_000_000))
        for q in qs:
            q[...] = seeded.standard_normal(q.shape)
            orthogonalize(q, state.epsilon)
    else:
        for q in qs:
            orthogonalize(q, state.epsilon)
    for (m, _), p, q in zip(compress, ps, qs):
        np.matmul(m, q, out=p)
    works = [comm.iallreduce(flat), comm.iallreduce(state.p_memory[index])]

    def finish() -> np.ndarray:
        np.divide(flat, comm.size, out=flat, casting="same_kind")
        offset = 0
        for m, _ in plain:
            m.reshape(-1)[...] = flat[offset:offset + m.size]
            offset += m.size
        for (m, _), p, q in zip(compress, ps, qs):
            orthogonalize(p, state.epsilon)
            np.matmul(m.T, p, out=q)
        comm.allreduce(state.q_memory[index])
        np.divide(state.q_memory[index], comm.size, out=state.q_memory[index], casting="same_kind")
        for (m, _), p, q in zip(compress, ps, qs):
            np.matmul(p, q.T, out=m)
        if state.use_error_feedback:
            state.errors[index] = kept - buf
        if not state.warm_start:
            state.p_memory.clear()
            state.q_memory.clear()
        state.maybe_increase_iter(bucket)
        return buf

    nbytes = flat.nbytes + state.p_memory[index].nbytes + state.q_memory[index].nbytes
    return Handle(works, finish, nbytes)


def _views(p_flat: np.ndarray, q_flat: np.ndarray, compress: list) -> tuple[list, list]:
    """Each matrix's P (n x r) and Q (m x r) as views of the bucket's flat P and Q memory."""
    ps, qs, i, j = [], [], 0, 0
    for m, r in compress:
        n, k = m.shape
        ps.append(p_flat[i:i + n * r].reshape(n, r))
        qs.append(q_flat[j:j + k * r].reshape(k, r))
        i, j = i + n * r, j + k * r
    return ps, qs
