"""The protection the first ``create`` gives a user's script: settings, reports, thread share, segment removal."""

import importlib.util
import json
import os
import subprocess
import sys
import uuid

import pytest

from npddp.util import guard
from npddp.util.threads import available_cpus


@pytest.mark.parametrize("raw, value", [("", True), ("1", True), ("on", True), ("YES", True), ("0", False),
                                        ("off", False), ("false", False), (" no ", False)])
def test_the_abort_switch_reads_every_spelling(raw, value):
    assert guard.abort_enabled({guard.ABORT_VARIABLE: raw}) is value
    assert guard.abort_enabled({}) is True


@pytest.mark.parametrize("raw, value", [("", "auto"), ("auto", "auto"), ("3", 3), ("1", 1), ("off", None),
                                        ("0", None)])
def test_the_threads_switch_reads_auto_a_number_or_off(raw, value):
    assert guard.threads_setting({guard.THREADS_VARIABLE: raw}) == value


@pytest.mark.parametrize("name, raw", [(guard.ABORT_VARIABLE, "maybe"), (guard.THREADS_VARIABLE, "-2"),
                                       (guard.THREADS_VARIABLE, "many")])
def test_a_malformed_switch_is_a_value_error_naming_it_and_the_valid_values(name, raw):
    with pytest.raises(ValueError, match=name) as info:
        (guard.abort_enabled if name == guard.ABORT_VARIABLE else guard.threads_setting)({name: raw})
    assert "valid" in str(info.value) and repr(raw) in str(info.value)


def _raise(exc):
    try:
        raise exc
    except BaseException as caught:  # noqa: BLE001
        return type(caught), caught, caught.__traceback__


@pytest.mark.parametrize("rank, size", [(0, 2), (1, 2), (3, 4)])
def test_reports_name_the_rank_once_and_give_the_exit_status(rank, size):
    code, text = guard.report(*_raise(KeyboardInterrupt()), rank, size)
    assert (code, text) == (130, f"[rank {rank}] interrupted, aborting all {size} ranks\n")
    code, text = guard.report(*_raise(ValueError("boom")), rank, size, "ending")
    assert code == 1 and text.startswith(f"[rank {rank}] unhandled exception, ending all {size} ranks:\n")
    assert text.rstrip().endswith("ValueError: boom") and text.count(f"[rank {rank}]") == 1


def test_a_connection_error_of_the_library_is_one_line_and_anyone_elses_keeps_its_traceback(tmp_path):
    own = _raise(ConnectionError("refused by my web server"))
    code, text = guard.report(*own, 0, 2)
    assert code == 1 and "Traceback" in text and "unhandled exception" in text
    assert not guard.peer_gone(*_raise(ConnectionResetError("x"))[1:])
    # a ConnectionError raised by a function whose file lies in an npddp/comm folder: a peer that ended
    folder = tmp_path / "npddp" / "comm"
    folder.mkdir(parents=True)
    (folder / "fake_transport.py").write_text(
        "def broken():\n    raise ConnectionError('[rank 0] ring allreduce: the connection to rank 1 broke')\n")
    spec = importlib.util.spec_from_file_location("fake_transport", folder / "fake_transport.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    exc_type, exc, tb = _raise_call(module.broken)
    assert guard.peer_gone(exc, tb)
    assert guard.report(exc_type, exc, tb, 0, 2) == (1, "[rank 0] ending: ring allreduce: the connection to rank 1 broke\n")


def _raise_call(f):
    try:
        f()
    except BaseException as caught:  # noqa: BLE001
        return type(caught), caught, caught.__traceback__


def test_only_the_mpi_segments_this_process_maps_are_removed(tmp_path):
    tag = uuid.uuid4().hex[:8]
    mine, other = f"{guard.env.SHM_DIR}/mpich_shm_test{tag}", f"{guard.env.SHM_DIR}/npddp_test_keep{tag}"
    for path in (mine, other):
        open(path, "wb").close()
    maps = tmp_path / "maps"
    maps.write_text("".join(f"7f00-7f01 rw-s 00000000 00:1a 123 {p}\n" for p in (mine, other)) +
                    "7f02-7f03 r-xp 00000000 08:01 9 /usr/lib/libc.so.6\n")
    try:
        assert guard.remove_mapped_segments(maps=str(maps)) == [mine]
        assert not os.path.exists(mine) and os.path.exists(other)
    finally:
        for path in (mine, other):
            if os.path.exists(path):
                os.unlink(path)


PROBE = """
import json, sys
import numpy as np
from threadpoolctl import threadpool_info
from npddp.util import guard
guard.install()
print(json.dumps({"threads": sorted({i["num_threads"] for i in threadpool_info()}),
                  "hook": getattr(sys.excepthook, guard.MARK, False)}))
"""


def _probe(**extra) -> dict:
    skip = ("PMI_", "OMPI_", "NPDDP_", "OMP_", "OPENBLAS_", "MKL_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(skip)
           and k not in ("LOCAL_WORLD_SIZE", "MPI_LOCALNRANKS", "RANK", "WORLD_SIZE")}
    env.update(extra)
    done = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.parametrize("ranks", [2, 3, 64])
def test_each_rank_gets_its_share_of_the_cores_when_no_thread_variable_is_set(ranks):
    got = _probe(LOCAL_WORLD_SIZE=str(ranks))
    assert got == {"threads": [max(1, available_cpus() // ranks)], "hook": True}


def test_the_users_thread_variables_and_the_off_switches_are_respected():
    alone = _probe()["threads"]                            # one rank: BLAS keeps its own default
    chosen = _probe(LOCAL_WORLD_SIZE="1", OMP_NUM_THREADS="3")["threads"]
    assert _probe(LOCAL_WORLD_SIZE="64", OMP_NUM_THREADS="3")["threads"] == chosen
    assert _probe(LOCAL_WORLD_SIZE="64", NPDDP_THREADS="off")["threads"] == alone
    assert _probe(LOCAL_WORLD_SIZE="1", NPDDP_THREADS="1")["threads"] == [1]
    assert _probe(NPDDP_ABORT_ON_EXCEPTION="0")["hook"] is False
