"""Serial checks of model parallelism's pure parts: the mesh, the stage cut, the schedules, row-aligned dropout."""

import numpy as np
import pytest

from npddp.nn import Dropout, Sequential
from npddp.parallel.model import Mesh, RowAlignedDropout, balanced_cut, schedule


def test_tensor_is_innermost_and_groups_partition_the_world():
    mesh = Mesh(8, tp=2, pp=2)
    assert mesh.dp == 2
    assert [tuple(vars(mesh.coords(r)).values()) for r in range(8)] == [
        (0, 0, 0), (0, 0, 1), (0, 1, 0), (0, 1, 1), (1, 0, 0), (1, 0, 1), (1, 1, 0), (1, 1, 1)]
    assert mesh.group("tensor", 5) == [4, 5]
    assert mesh.group("pipeline", 5) == [5, 7]
    assert mesh.group("data", 5) == [1, 5]
    for r in range(8):
        c = mesh.coords(r)
        assert mesh.rank_of(c.dp, c.pp, c.tp) == r
        assert mesh.group("tensor", r).index(r) == c.tp and mesh.group("pipeline", r).index(r) == c.pp
        assert mesh.group("data", r).index(r) == c.dp


@pytest.mark.parametrize("args,message", [
    ((4, 3, 1), r"world size 4 is not divisible by tp \* pp = 3 \* 1 = 3; tp \* pp must be one of \[1, 2, 4\]"),
    ((6, 2, 2), r"world size 6 is not divisible by tp \* pp = 2 \* 2 = 4"),
    ((4, 0, 1), r"tp must be an integer >= 1, got 0"),
    ((4, 1, -2), r"pp must be an integer >= 1, got -2"),
    ((0, 1, 1), r"world_size must be an integer >= 1, got 0"),
])
def test_bad_mesh_is_one_value_error(args, message):
    with pytest.raises(ValueError, match=message):
        Mesh(*args)


def test_bad_coordinates_and_axis_are_named():
    mesh = Mesh(4, tp=2)
    with pytest.raises(ValueError, match=r"rank must be an integer in \[0, 4\), got 4"):
        mesh.coords(4)
    with pytest.raises(ValueError, match=r"unknown mesh axis 'model'; valid: data, pipeline, tensor"):
        mesh.colors("model")


def test_cut_balances_parameters_and_gives_every_stage_some():
    assert balanced_cut([136, 532, 532, 104], 3) == [0, 1, 2]          # {e}, {b0}, {b1, head}: largest 636
    assert balanced_cut([10, 0, 0, 10, 0, 10], 2) == [0, 1]              # a tie (20 either way): the earliest cut
    assert balanced_cut([72, 0, 0, 78, 0, 0, 28], 3) == [0, 1, 4]       # activations follow their Linear
    with pytest.raises(ValueError, match=r"3 of them with parameters, into 4 pipeline stages; "
                                         r"stages must be an integer in \[1, 3\]"):
        balanced_cut([72, 0, 0, 78, 0, 0, 28], 4)


def play(ops_by_stage) -> bool:
    """Run the stages' operations with blocking, unbuffered sends (a send waits for its receive): True if all finish."""
    pos = [0] * len(ops_by_stage)
    partner = {"send_act": ("recv_act", 1), "send_grad": ("recv_grad", -1)}
    while True:
        moved = False
        for s, ops in enumerate(ops_by_stage):
            if pos[s] == len(ops):
                continue
            kind, i = ops[pos[s]]
            if kind in ("fwd", "bwd"):
                pos[s] += 1
                moved = True
            elif kind in partner:
                want, step = partner[kind]
                peer = ops_by_stage[s + step]
                if pos[s + step] < len(peer) and peer[pos[s + step]] == (want, i):
                    pos[s] += 1
                    pos[s + step] += 1
                    moved = True
        if all(p == len(ops) for p, ops in zip(pos, ops_by_stage)):
            return True
        if not moved:
            return False


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
def test_schedules_finish_with_blocking_sends_and_run_each_micro_batch_once(name):
    for stages in range(1, 7):
        for m in range(1, 10):
            ops = [schedule(name, s, stages, m) for s in range(stages)]
            assert play(ops), f"{name} deadlocks at K={stages}, M={m}"
            for s in range(stages):
                assert [i for k, i in ops[s] if k == "fwd"] == list(range(m))
                assert [i for k, i in ops[s] if k == "bwd"] == list(range(m))   # same gradient order in both


def test_1f1b_keeps_at_most_k_minus_s_micro_batches_in_flight():
    for s in range(4):
        live = peak = 0
        for kind, _ in schedule("1f1b", s, 4, 8):
            live += {"fwd": 1, "bwd": -1}.get(kind, 0)
            peak = max(peak, live)
        assert peak == 4 - s


def test_a_stage_that_sends_before_it_receives_would_deadlock():
    """The higher stage of a steady-state pair receives first; sending first would hang (the player sees it)."""
    ops = [schedule("1f1b", s, 2, 4) for s in range(2)]
    swapped = []
    for a, b in zip(ops[1], ops[1][1:] + [None]):
        if a[0] == "recv_act" and b is not None and b[0] == "send_grad":
            swapped.append(b)
            swapped.append(a)
        elif not (swapped and swapped[-1] is a):
            swapped.append(a)
    assert swapped != ops[1] and not play([ops[0], swapped])


def test_bad_schedule_arguments_are_named():
    with pytest.raises(ValueError, match=r"unknown pipeline schedule 'zb'; valid: gpipe, 1f1b"):
        schedule("zb", 0, 2, 4)
    with pytest.raises(ValueError, match=r"micro_batches must be an integer >= 1, got 0"):
        schedule("1f1b", 0, 2, 0)
    with pytest.raises(ValueError, match=r"stage must be an integer in \[0, 2\), got 2"):
        schedule("gpipe", 2, 2, 4)


@pytest.mark.parametrize("drawn_before", [0, 3])      # 3: the stream holds half a 64-bit output
@pytest.mark.parametrize("rows", [10, 9])
def test_row_aligned_dropout_gives_each_slice_the_one_process_bits(drawn_before, rows):
    whole, split = Dropout(0.3, seed=5), Dropout(0.3, seed=5)
    for layer in (whole, split):
        layer.forward(np.ones((1, drawn_before))) if drawn_before else None
    x = np.ones((rows, 7))
    want = whole.forward(x)
    aligned = RowAlignedDropout(Sequential(split))
    aligned.begin_step()
    parts = []
    for lo, hi in [(4, rows), (0, 3), (3, 4)]:                 # any order: each slice is placed by its rows
        aligned.at_rows(lo)
        parts.append((lo, split.forward(x[lo:hi])))
    aligned.at_rows(4)
    again = split.forward(x[4:rows])                           # a recomputed forward draws the same bits
    aligned.end_step(rows)
    got = np.concatenate([p for _, p in sorted(parts, key=lambda t: t[0])])
    assert np.array_equal(got, want) and np.array_equal(again, parts[0][1])
    assert np.array_equal(split.get_rng_state(), whole.get_rng_state())   # the next step starts alike
