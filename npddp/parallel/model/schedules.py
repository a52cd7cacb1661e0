"""Pipeline schedules: for one stage, the ordered list of what it does with each micro-batch.

An operation is ``(kind, micro_batch)`` with kind one of ``recv_act`` (from the previous
stage), ``fwd``, ``send_act`` (to the next stage), ``recv_grad`` (from the next stage),
``bwd`` and ``send_grad`` (to the previous stage). The first stage neither receives
activations nor sends gradients; the last neither sends activations nor receives gradients.

* ``gpipe``: every forward, then every backward (micro-batches in order both times).
* ``1f1b``: stage ``s`` of ``K`` runs ``min(K - s - 1, M)`` warm-up forwards, then alternates
  one forward and one backward, then finishes the remaining backwards; at most ``K - s``
  micro-batches are in flight on a stage, against ``M`` under GPipe.

Both run the backwards in micro-batch order, so a stage accumulates its gradients in the same
order under either schedule (same bits). Sends and receives are blocking, so where a stage
both sends to and receives from one neighbour in a row of the 1F1B steady state, the lower
stage sends first and the higher receives first: every such pair meets, and no cycle of
stages waiting on each other can form (``tests/parallel/model/test_mesh.py`` plays each schedule
against blocking, unbuffered sends for many K and M).
"""

from __future__ import annotations

#: The pipeline schedules by name (``--pp-schedule``).
SCHEDULES = ("gpipe", "1f1b")


def _forward(stage: int, stages: int, i: int) -> list[tuple[str, int]]:
    """Receive, run and send micro-batch ``i`` forward."""
    return ([("recv_act", i)] if stage else []) + [("fwd", i)] + ([("send_act", i)] if stage < stages - 1 else [])


def _backward(stage: int, stages: int, i: int) -> list[tuple[str, int]]:
    """Receive the gradient of, run and send micro-batch ``i`` backward."""
    return (([("recv_grad", i)] if stage < stages - 1 else []) + [("bwd", i)]
            + ([("send_grad", i)] if stage else []))


def schedule(name: str, stage: int, stages: int, micro_batches: int) -> list[tuple[str, int]]:
    """The operations of ``stage`` (of ``stages``) for ``micro_batches`` micro-batches under schedule ``name``."""
    if name not in SCHEDULES:
        raise ValueError(f"unknown pipeline schedule {name!r}; valid: {', '.join(SCHEDULES)}")
    for what, value, low in (("stages", stages, 1), ("micro_batches", micro_batches, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{what} must be an integer >= {low}, got {value!r}")
    if isinstance(stage, bool) or not isinstance(stage, int) or not 0 <= stage < stages:
        raise ValueError(f"stage must be an integer in [0, {stages}), got {stage!r}")
    m, last = micro_batches, stage == stages - 1
    if name == "gpipe":
        return ([op for i in range(m) for op in _forward(stage, stages, i)]
                + [op for i in range(m) for op in _backward(stage, stages, i)])
    warmup = min(stages - stage - 1, m)
    ops = [op for i in range(warmup) for op in _forward(stage, stages, i)]
    if warmup < m and stage:
        ops.append(("recv_act", warmup))
    for k in range(m - warmup):
        i = warmup + k                                   # forward of i, then backward of k
        ops.append(("fwd", i))
        if not last:
            ops += [("send_act", i), ("recv_grad", k)]   # lower stage of the pair: send first
        ops.append(("bwd", k))
        if stage:
            if i + 1 < m:
                ops += [("recv_act", i + 1), ("send_grad", k)]   # higher stage: receive first
            else:
                ops.append(("send_grad", k))
    for k in range(m - warmup, m):
        ops += _backward(stage, stages, k)
    return ops


def ideal_bubble(stages: int, micro_batches: int) -> float:
    """The idle share of a step when every micro-batch takes the same time on every stage: (K-1)/(M+K-1)."""
    return (stages - 1) / (micro_batches + stages - 1)
