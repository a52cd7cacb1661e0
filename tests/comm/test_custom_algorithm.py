"""A user's all-reduce through the public API: examples/custom_allreduce.py under the project's own tests.

The ``backend`` fixture is ``custom_ring`` here, and the all-reduce tests of
``tests/helpers/allreduce_cases`` are imported, so they run on it over COMM_SELF and the world, over MPI
and TCP (the suite runs tests/comm at N = 2, 3, 4 on both). Then the contract library on it,
``register_algorithm``'s own checks, ``auto`` considering a declared cost, and ``npddp.check``
naming the first failing case of a broken algorithm.
"""

import subprocess
import sys
from pathlib import Path

import pytest

import examples.custom_allreduce  # noqa: F401  registers custom_ring
from npddp.comm import backend_names, create, register_algorithm
from npddp.comm.algorithms.api import Cost
from npddp.comm.contract import PROPERTIES, run_contract
from npddp.comm.compose.costmodel import candidates, model_table, predict
from npddp.comm.algorithms import registry
from npddp.comm.algorithms.registry import load_plugins

from tests.helpers.allreduce_cases import (  # noqa: F401  collected again, on custom_ring
    test_allreduce_any_shape, test_allreduce_exact, test_float_cancellation_agrees_bitwise,
    test_iallreduce_interleaved_with_blocking_collectives, test_iallreduce_one_rank_completes_at_once,
    test_iallreduce_polled_then_waited_in_order, test_iallreduce_started_while_only_some_ranks_wait_on_an_earlier_one,
    test_iallreduce_waited_in_rank_dependent_order)

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(params=["custom_ring"], ids=lambda name: f"{name}-backend")
def backend(request):
    """The example's algorithm (overrides the suite's every-backend fixture in this module)."""
    return request.param


@pytest.mark.mpi
def test_contract_passes_on_custom_ring_and_ranks_agree(world, assert_all_ranks):
    comm = create("custom_ring", world.raw)
    outcomes = run_contract(comm)
    assert_all_ranks([o.name for o in outcomes] == list(PROPERTIES), str(outcomes))
    failures = [o.failure for o in outcomes if o.failure]
    assert_all_ranks(not failures, "; ".join(failures))


@pytest.mark.mpi(min_size=2)
def test_contract_names_the_first_failing_case(world, assert_all_ranks):
    load_plugins([str(ROOT / "tests/comm/_broken_algorithm.py")])
    comm = create("broken_twice", world.raw)
    outcomes = {o.name: o.failure for o in run_contract(comm, ["allreduce exact for every dtype, op and size",
                                                                "bad input raises before any message"])}
    first = outcomes["allreduce exact for every dtype, op and size"] or ""
    assert_all_ranks(first.startswith("allreduce dtype=float16 op=sum size=1 rank=0:"), first)
    assert_all_ranks(outcomes["bad input raises before any message"] is None, str(outcomes))


def test_register_algorithm_rejects_bad_input():
    def gen(peers, buf):
        yield
    cases = [("ring", gen, None, ValueError, "built in"), ("my-algo", gen, None, ValueError, "identifier"),
             ("ok_name", 42, None, TypeError, "int"), ("ok_name", gen, "fast", TypeError, "cost must be"),
             ("ok_name", type("NoStart", (), {}), None, TypeError, "start")]
    for name, fn, cost, kind, words in cases:
        with pytest.raises(kind, match=words):
            register_algorithm(name, fn, cost=cost)
    assert "ok_name" not in registry.names()
    with pytest.raises(ValueError, match="custom_ring"):  # the error lists registered names too
        create("no_such_algorithm")
    with pytest.raises(ValueError, match="cannot be imported"):
        load_plugins(["no.such.module_here"])


def test_declared_cost_puts_the_algorithm_before_auto_and_the_projection():
    assert "custom_ring" in backend_names() and "custom_ring" in candidates()
    for size in (2, 3, 4, 8):
        for nbytes in (8, 1 << 20, 1 << 26):
            assert predict("custom_ring", nbytes, size, 1e-5, 1e-9, 1e-10) == pytest.approx(
                predict("ring", nbytes, size, 1e-5, 1e-9, 1e-10, chunk_bytes=None))
    # a registered algorithm made cheap at every size wins the model's whole table
    register_algorithm("free_lunch", lambda peers, buf: iter(()), cost=lambda n, s, c=None: Cost(0, 0, 0))
    try:
        assert model_table("tcp", 4) == [[None, "free_lunch"]]
        from benchmarks import _costmodel as cm
        assert cm.modelled("custom_ring") and cm.terms("allreduce", 4, "custom_ring") == (6, 1.5)
    finally:
        registry.unregister("free_lunch")


@pytest.mark.slow
def test_check_cli_exits_1_naming_the_failing_case():
    cmd = [sys.executable, "-m", "npddp.run", "--nproc", "2", "-m", "npddp.check", "--backend", "broken_twice",
           "--plugin", "tests/comm/_broken_algorithm.py", "--timeout", "30"]
    run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "FAIL  allreduce exact for every dtype, op and size" in run.stdout
    assert "PASS  out= fills out, input unchanged" in run.stdout
    assert "first failure: allreduce dtype=float16 op=sum size=1 rank=0:" in run.stdout
    ok = subprocess.run([*cmd[:7], "--backend", "custom_ring", "--plugin", "examples.custom_allreduce"],
                        cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0 and "7 passed, 0 failed" in ok.stdout, ok.stdout + ok.stderr


def test_check_cli_rejects_unknown_backend(capsys):
    from npddp.tools.check import parse_args
    with pytest.raises(SystemExit) as exc:
        parse_args(["--backend", "nope"])
    assert exc.value.code == 2 and "'nope' is unknown" in capsys.readouterr().err


def test_check_in_one_process_passes(capsys):
    from npddp.tools.check import main
    assert main(["--backend", "custom_ring", "--plugin", "examples.custom_allreduce"]) == 0
    assert "7 passed, 0 failed" in capsys.readouterr().out


def test_benchmarks_take_a_plugin_backend_by_name():
    from benchmarks import collectives as allreduce, ddp
    args = ["--plugin", "tests/comm/_broken_algorithm.py"]
    assert ddp.parse_config([*args, "--backends", "ring,broken_twice"], verbose=False).backends == ("ring", "broken_twice")
    assert allreduce.parse_config([*args, "--backends", "broken_twice"], verbose=False).backends == ("broken_twice",)
    with pytest.raises(SystemExit):
        ddp.parse_config(["--plugin", "no.such.plugin_mod", "--backends", "ring"], verbose=False)


def test_installed_packages_register_through_the_entry_point_group(monkeypatch):
    from importlib import metadata
    class EntryPoint:
        name, value = "broken_twice", "tests.comm._broken_algorithm"

        def load(self):
            load_plugins([str(ROOT / "tests/comm/_broken_algorithm.py")])

    class Silent(EntryPoint):
        name = "never_registered"

        def load(self):
            pass

    if "broken_twice" in registry.names():
        registry.unregister("broken_twice")
    monkeypatch.setattr(registry, "_discovered", [])
    monkeypatch.setattr(metadata, "entry_points", lambda group: [EntryPoint()] if group == registry.ENTRY_POINT_GROUP
                        else [])
    assert "broken_twice" in backend_names()
    monkeypatch.setattr(registry, "_discovered", [])
    monkeypatch.setattr(metadata, "entry_points", lambda group: [Silent()])
    with pytest.raises(ValueError, match="registered no algorithm called 'never_registered'"):
        backend_names()


@pytest.mark.slow
def test_training_cli_trains_and_resumes_on_a_plugin_backend(tmp_path):
    """Under mpirun: on --resume the checkpoint's backend and plugin replace the defaults."""
    cmd = [str(ROOT / "mpi_run.sh"), "-n", "2", sys.executable, "-m", "npddp.train", "--hidden", "8", "--epochs", "2",
           "--train-samples", "256", "--val-samples", "64", "--batch-size", "32", "--progress", "none",
           "--checkpoint", str(tmp_path / "c.h5")]
    first = subprocess.run([*cmd, "--backend", "custom_ring", "--plugin", "examples.custom_allreduce", "--max-steps", "5"],
                           cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0 and "backend custom_ring" in first.stdout, first.stdout + first.stderr
    again = subprocess.run([*cmd, "--resume"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and "done: epoch 2/2" in again.stdout, again.stdout + again.stderr
    assert "backend custom_ring" in again.stdout, again.stdout


def test_an_unknown_backend_says_a_plugin_registers_more_in_the_benchmarks(capsys):
    from benchmarks import collectives as allreduce, ddp
    for parse in (ddp.parse_config, allreduce.parse_config):
        with pytest.raises(SystemExit):
            parse(["--backends", "ring,not_registered"], verbose=True)
        err = capsys.readouterr().err
        assert "'not_registered'" in err and "--plugin MODULE registers it" in err, err


def test_check_cli_under_mpirun_prints_a_bad_backend_once_and_every_rank_exits_2():
    from tests.helpers.cli import clean_env, mpirun_path
    run = subprocess.run([mpirun_path(), "-n", "2", sys.executable, "-m", "npddp.check", "--backend", "nosuch"],
                         cwd=ROOT, env=clean_env(), capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and run.stdout == "", run.stdout + run.stderr
    assert run.stderr.count("usage: python -m npddp.check") == 1, run.stderr
    assert run.stderr.count("error: --backend 'nosuch' is unknown") == 1, run.stderr
