"""``benchmarks/ddp.py --trace``: the first combination's steps on a timeline (one rank)."""

import json

from mpi4py import MPI

from benchmarks import ddp as bd
from tests.helpers.bench import DDP_TINY as TINY
from tests.helpers.trace import nesting_problems, x_events


def test_the_sweep_traces_its_first_combination_in_the_chosen_steps(tmp_path, capsys):
    path = tmp_path / "b.json"
    argv = TINY + ["--syncs", "overlap", "--bucket-mb", "0.25", "--backends", "mpi", "--no-comm",
                   "--trace", str(path), "--trace-steps", "2:3"]
    assert bd.main(argv, mpi_comm=MPI.COMM_SELF) == 0
    doc = json.loads(path.read_text())
    events = x_events(doc)
    assert {e["args"]["step"] for e in events} == {2, 3}
    assert {e["name"] for e in events if e["args"]["step"] == 2} >= {"forward", "backward", "optimizer step"}
    assert doc["otherData"]["combination"]["backend"] == "mpi"        # the first combination, not 'none'
    assert len([e for e in events if e["name"] == "backward"]) == 2   # one DDP traced, not both
    assert nesting_problems(doc) == []
