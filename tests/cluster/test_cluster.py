"""The harness ``python -m npddp.cluster``: bad input, privileges, nodes and links, and nothing left behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from npddp.cluster import launch, shaping
from tests.helpers.cluster import JOB, needs_namespaces
from tests.helpers.jobs import ROOT

#: watches the whole machine or times a job's end: never beside another test (run_all.sh: serial-alone)
pytestmark = pytest.mark.alone

#: Seconds from a rank's death (or Ctrl-C) to the harness's exit that count as "promptly".
PROMPTLY = 30.0
# Ids must not be the bare word "mpi": pytest-mpi skips any test with that keyword unless --with-mpi.
LAUNCHERS = ("tcp", "mpi")


@pytest.mark.parametrize("args, words", [
    (["--rate", "1gbt"], "rate '1gbt' is not valid"),
    (["--rate=-3mbit"], "valid: a positive number"),
    (["--rate", "0"], "rate '0' is not valid; valid: a positive number with a unit"),
    (["--rate", ""], "rate '' is not valid"),
    (["--rate", "0gbit"], "rate '0gbit' is not valid"),
    (["--nodes", "0"], "--nodes 0 is out of range"),
    (["--mtu", "100"], "--mtu 100 is out of range"),
    (["--delay", "5"], "delay '5' is not valid"),
    (["--ranks-per-node", "0"], "--ranks-per-node 0 is out of range"),
    (["--launcher", "tcp", "--", "python", "-c", "pass"], "not valid for --launcher tcp"),
    (["--launcher", "tcp", "--", "hostname"], "command 'hostname' is not valid for --launcher tcp, which runs a "
                                              "Python module or script on every rank"),
    ([], "no command given"),
])
def test_bad_flags_exit_2_with_one_error_line_before_anything_is_made(cluster, own_namespaces, args, words):
    done = cluster(*args, *([] if "--" in args else ["--", "python", JOB, "nodes"]) if args else [])
    assert done.returncode == 2, done.stderr
    assert words in done.stderr.splitlines()[-1], done.stderr
    assert not own_namespaces()


@pytest.mark.parametrize("text, bits", [("1gbit", 1e9), ("100mbit", 1e8), ("125mbps", 1e9), ("2.5gbit", 2.5e9),
                                        ("none", None)])
def test_rates_use_tc_units(text, bits):
    assert shaping.parse_rate(text) == bits


@pytest.mark.parametrize("text", ["1gbit", "100mbit", "2.5gbit", "10gbit", "1tbit", "64kbit", "none"])
def test_a_rate_is_shown_in_the_words_it_was_given(text):
    assert shaping.format_rate(shaping.parse_rate(text)) == text
    assert shaping.format_rate(shaping.parse_rate("125mbps")) == "1gbit"


def test_status_shows_each_clusters_rate_as_tc_words(cluster, cluster_env, monkeypatch):
    from npddp.cluster.state import Record
    monkeypatch.setenv("NPDDP_CLUSTER_STATE", cluster_env["NPDDP_CLUSTER_STATE"])   # records go to the test's own
    os.makedirs(cluster_env["NPDDP_CLUSTER_STATE"])
    for cid, rate in (("c1", 1e9), ("c2", None)):
        Record(cid, [f"npddp-{cid}-node0"], [], "/nonexistent", info={"nodes": 2, "rate": rate}).save()
    done = cluster("status")
    lines = sorted(done.stdout.splitlines())
    assert done.returncode == 0 and lines[0].startswith("c1: 2 nodes, rate 1gbit, made by up"), done.stdout
    assert lines[1].startswith("c2: 2 nodes, rate none, made by up"), done.stdout


def test_without_cap_net_admin_one_line_and_exit_2(cluster_env, tmp_path):
    if subprocess.run(["setpriv", "--version"], capture_output=True).returncode:
        pytest.skip("setpriv is missing: cannot drop CAP_NET_ADMIN")
    tools = tmp_path / "bin"   # stand-ins for ip, tc and unshare: only the missing privilege is under test here
    tools.mkdir()
    for tool in ("ip", "tc", "unshare"):
        (tools / tool).write_text("#!/bin/sh\nexit 1\n")
        (tools / tool).chmod(0o755)
    env = {**cluster_env, "PATH": os.pathsep.join([str(tools), cluster_env.get("PATH", os.defpath)])}
    done = subprocess.run(["setpriv", "--inh-caps=-net_admin", "--bounding-set=-net_admin", sys.executable, "-m",
                           "npddp.cluster", "--", "python", JOB, "nodes"], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=60)
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr
    assert "CAP_NET_ADMIN" in done.stderr


@needs_namespaces
def test_delay_needs_netem_and_is_never_ignored(cluster, own_namespaces):
    done = cluster("--delay", "1ms", "--", "python", JOB, "shaped", "4000")
    if done.returncode == 2:  # this kernel has no netem: one line naming it, nothing left
        assert "netem" in done.stderr.splitlines()[-1] and len(done.stderr.splitlines()) == 1, done.stderr
    else:                     # netem exists: the job ran with the delay
        assert done.returncode == 0 and "SECONDS" in done.stdout, done.stderr
    assert not own_namespaces()


@needs_namespaces
@pytest.mark.parametrize("launcher", LAUNCHERS, ids=lambda name: f"{name}-launcher")
@pytest.mark.slow
def test_each_node_has_its_host_name_and_npddp_sees_two_nodes_for_hier_and_auto(cluster, own_namespaces, launcher):
    done = cluster("--nodes", 2, "--ranks-per-node", 2, "--rate", "none", "--launcher", launcher, "--",
                   "python", JOB, "nodes")
    assert done.returncode == 0, done.stderr
    rows = sorted(line.split()[1:] for line in done.stdout.splitlines() if line.startswith("RESULT"))
    assert rows == [[str(r), f"node{r // 2}", "0,0,1,1", "1", "True", "hier"] for r in range(4)], done.stdout
    assert not own_namespaces()


@needs_namespaces
@pytest.mark.parametrize("launcher", LAUNCHERS, ids=lambda name: f"{name}-launcher")
@pytest.mark.slow
def test_traffic_between_nodes_takes_what_the_rate_allows(cluster, launcher):
    nbytes, rate = 2_000_000, 100e6
    done = cluster("--nodes", 2, "--rate", "100mbit", "--launcher", launcher, "--", "python", JOB, "shaped", nbytes)
    assert done.returncode == 0, done.stderr
    seconds = float(next(line.split()[1] for line in done.stdout.splitlines() if line.startswith("SECONDS")))
    allowed = 2 * (2 - 1) / 2 * nbytes * 8 / rate             # a ring's bytes on each link / the rate
    assert seconds >= 0.9 * allowed, f"{seconds:.3f} s is faster than the link allows ({allowed:.3f} s)"


#: A setting that makes each library reach the other node through shared memory (this Open MPI has none).
BYPASS = {"MPICH": {"UCX_TLS": "all"}, "Intel MPI": {"FI_PROVIDER": "shm"}}


@needs_namespaces
@pytest.mark.parametrize("rate", ["1gbit", "none"])
def test_mpi_start_up_check_names_a_bypass_of_the_links(cluster, own_namespaces, rate):
    lib = launch.active_library()
    if lib.name not in BYPASS:
        pytest.skip(f"no setting known that makes {lib.name} bypass the links")
    done = cluster("--nodes", 2, "--rate", rate, "--launcher", "mpi", "--", "python", JOB, "shaped", 4000,
                   env=BYPASS[lib.name])
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"{lib.name}'s traffic between node0 and node1 did not cross the emulated link" in done.stderr
    assert "SECONDS" not in done.stdout and not own_namespaces()


@needs_namespaces
@pytest.mark.slow
@pytest.mark.parametrize("per_node", [1, 2])
def test_check_and_hier_training_across_nodes_with_this_mpi(cluster, own_namespaces, per_node):
    lib = launch.active_library()
    jobs = [["-m", "npddp.check", "--backend", "ring"], ["-m", "npddp.check", "--backend", "mpi"],
            ["-m", "npddp.train", "--epochs", "1", "--train-samples", "4096", "--backend", "hier"]]
    for job in jobs:
        done = cluster("--nodes", 2, "--ranks-per-node", per_node, "--rate", "1gbit", "--launcher", "mpi", "--",
                       "python", *job, timeout=300)
        assert done.returncode == 0, f"{lib.name}, {job}: {done.stdout[-2000:]}{done.stderr[-2000:]}"
        assert f"npddp.cluster: {lib.name} between node0 and node1: " in done.stderr
        assert ("7 passed, 0 failed" if job[1] == "npddp.check" else "done: epoch 1/1") in done.stdout, done.stdout
    assert not own_namespaces()


@needs_namespaces
@pytest.mark.parametrize("launcher", LAUNCHERS, ids=lambda name: f"{name}-launcher")
@pytest.mark.slow
def test_a_rank_killed_on_one_node_ends_the_job_promptly(cluster, own_namespaces, launcher):
    from npddp.process.cleanup import SHM, in_use
    before = set(os.listdir(SHM))
    t = time.monotonic()
    done = cluster("--nodes", 2, "--ranks-per-node", 2, "--rate", "none", "--launcher", launcher, "--",
                   "python", JOB, "kill", 3)
    assert done.returncode != 0 and time.monotonic() - t < PROMPTLY, done.stderr
    if launcher == "tcp":
        assert done.returncode == 128 + signal.SIGKILL, done.stderr
    assert not own_namespaces()
    left = {f"{SHM}/{name}" for name in set(os.listdir(SHM)) - before} - in_use()
    assert not left, f"the killed job left {sorted(left)} in {SHM}"


def _start_sleeping_job(cluster_env, pid_dir, launcher="tcp"):
    os.makedirs(pid_dir)
    proc = subprocess.Popen([sys.executable, "-m", "npddp.cluster", "--nodes", "2", "--rate", "none",
                             "--launcher", launcher, "--", "python", JOB, "sleep", str(pid_dir)],
                            env=cluster_env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while len([f for f in os.listdir(pid_dir) if f.endswith(".pid")]) < 2 and time.monotonic() < deadline:
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.05)
        pids = [int(open(os.path.join(pid_dir, f)).read()) for f in os.listdir(pid_dir) if f.endswith(".pid")]
        assert len(pids) == 2, f"pid files: {os.listdir(pid_dir)}"
    except BaseException:
        proc.send_signal(signal.SIGINT)     # the harness removes its cluster before the failure is reported
        proc.communicate(timeout=PROMPTLY)
        raise
    return proc, pids


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


@needs_namespaces
@pytest.mark.parametrize("launcher", LAUNCHERS, ids=lambda name: f"{name}-launcher")
@pytest.mark.slow
def test_ctrl_c_stops_every_rank_and_removes_the_cluster(cluster_env, own_namespaces, tmp_path, launcher):
    proc, pids = _start_sleeping_job(cluster_env, tmp_path / "pids", launcher)
    assert len(own_namespaces()) == 3
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=PROMPTLY)
    assert proc.returncode == 128 + signal.SIGINT, err
    assert not own_namespaces() and not any(_alive(p) for p in pids), err
    assert not os.listdir(cluster_env["NPDDP_CLUSTER_STATE"])


@needs_namespaces
@pytest.mark.slow
def test_after_a_sigkilled_harness_the_next_run_removes_what_it_left(cluster, cluster_env, own_namespaces, tmp_path):
    proc, pids = _start_sleeping_job(cluster_env, tmp_path / "pids")
    left = own_namespaces()
    proc.kill()
    proc.communicate()
    assert own_namespaces() == left and len(left) == 3      # the namespaces outlive a SIGKILLed harness
    done = cluster("--nodes", 2, "--rate", "none", "--", "python", JOB, "nodes")
    assert done.returncode == 0, done.stderr
    line = next(x for x in done.stderr.splitlines() if "removed leftovers" in x)
    assert all(ns in line for ns in left), line
    assert not own_namespaces() and not any(_alive(p) for p in pids)
    assert not os.listdir(cluster_env["NPDDP_CLUSTER_STATE"])


@needs_namespaces
@pytest.mark.slow
def test_up_exec_status_down(cluster, own_namespaces):
    made = cluster("up", "--nodes", 2, "--rate", "10gbit")
    assert made.returncode == 0 and made.stdout.startswith("cluster "), made.stderr
    cid = made.stdout.split()[1]
    try:
        assert f"{cid}: 2 nodes" in cluster("status").stdout
        ran = cluster("exec", "--node", 1, "--", "hostname")
        assert ran.returncode == 0 and ran.stdout.strip() == "node1", ran.stderr
        assert cluster("exec", "--node", 5, "--", "hostname").returncode == 2
        routes = cluster("exec", "--node", 1, "--", "ip", "-4", "route").stdout.splitlines()
        assert len(routes) == 1 and routes[0].startswith("10.77.0.0/24 dev eth0"), routes  # no way out of the cluster
    finally:
        gone = cluster("down")
    assert gone.returncode == 0 and cid in gone.stdout and not own_namespaces()


@needs_namespaces
@pytest.mark.slow
def test_training_across_nodes_gives_the_parameters_of_one_process(cluster, cluster_env, tmp_path):
    from npddp.checkpoint import fileformat
    flags = ["-m", "npddp.train", "--dtype", "float64", "--hidden", "16", "--train-samples", "256",
             "--val-samples", "64", "--batch-size", "32", "--epochs", "1", "--quiet"]
    one = subprocess.run([sys.executable, *flags, "--backend", "ring", "--checkpoint", str(tmp_path / "one.h5")],
                         env=cluster_env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert one.returncode == 0, one.stderr
    reference = fileformat.read(tmp_path / "one.h5").params
    # 2 nodes x 1 over both launchers (ring); 2 nodes x 2 with auto, which composes hier there
    for launcher, per_node, backend in (("tcp", 1, "ring"), ("mpi", 1, "ring"), ("tcp", 2, "auto")):
        path = tmp_path / f"{launcher}{per_node}.h5"
        done = cluster("--nodes", 2, "--ranks-per-node", per_node, "--rate", "none", "--launcher", launcher, "--",
                       "python", *flags, "--backend", backend, "--checkpoint", path)
        assert done.returncode == 0, done.stderr
        params = fileformat.read(path).params
        assert list(params) == list(reference)
        for name, value in params.items():
            np.testing.assert_allclose(value, reference[name], rtol=0, atol=1e-12,
                                       err_msg=f"{launcher}, {per_node} per node, {backend}: {name}")


def test_the_tcp_launcher_takes_a_python_module_or_an_existing_script_only(tmp_path):
    script = tmp_path / "job.py"
    script.write_text("")
    assert launch.tcp_program(["python", "-m", "npddp.train", "--epochs", "1"]) == ["-m", "npddp.train", "--epochs",
                                                                                  "1"]
    assert launch.tcp_program([sys.executable, str(script), "x"]) == [str(script), "x"]
    assert launch.tcp_program([str(script)]) == [str(script)]
    for bad in (["hostname"], ["python", str(tmp_path / "missing.py")], ["python", "-c", "pass"]):
        with pytest.raises(ValueError, match=r"runs a Python module or script on every rank .*--launcher mpi runs any"):
            launch.tcp_program(bad)
