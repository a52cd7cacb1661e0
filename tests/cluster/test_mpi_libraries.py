"""``--launcher mpi`` per MPI library: the table's commands, host files and environments, and the probe's verdict."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from npddp.cluster import launch, probe
from npddp.cluster.topology import Cluster

#: watches the whole machine or times a job's end: never beside another test (run_all.sh: serial-alone)
pytestmark = pytest.mark.alone

#: MPI_Get_library_version's text of each library as its wheel reports it.
VERSIONS = {
    "MPICH": "MPICH Version:      5.0.2\nMPICH Release date: Fri Sep 25 2026\nMPICH ABI:          18:2:6\n",
    "Open MPI": "Open MPI v5.0.11, package: Open MPI user@localhost Distribution, ident: 5.0.11\x00",
    "Intel MPI": "Intel(R) MPI Library 2021.18.1 for Linux* OS\n",
}
#: The launcher's arguments before the program, for 2 nodes x 3 ranks (RUNTIME: the cluster's runtime directory).
COMMANDS = {
    "MPICH": ["mpiexec", "-f", "RUNTIME/hosts", "-launcher", "ssh", "-launcher-exec", "RUNTIME/ssh", "-n", "6"],
    "Open MPI": ["mpirun", "--hostfile", "RUNTIME/hosts", "-n", "6"],
    "Intel MPI": ["mpiexec.hydra", "-f", "RUNTIME/hosts", "-ppn", "3", "-n", "6"],
}
HOST_FILES = {"MPICH": "node0:3\nnode1:3\n", "Open MPI": "node0 slots=3\nnode1 slots=3\n",
              "Intel MPI": "node0\nnode1\n"}
#: What each library's environment must hold: the launcher's ssh is the stand-in, traffic between nodes on TCP.
ENVS = {
    "MPICH": {"UCX_TLS": "tcp,self", "FI_PROVIDER": "tcp"},
    "Open MPI": {"PRTE_MCA_plm_ssh_agent": "RUNTIME/ssh", "OMPI_MCA_pml": "ob1", "OMPI_MCA_btl": "tcp,sm,self",
                 "OMPI_MCA_btl_tcp_if_include": "eth0", "OMPI_ALLOW_RUN_AS_ROOT": "1",
                 "OMPI_MCA_btl_tcp_flags": "send,inplace", "OMPI_MCA_coll_libnbc_iallreduce_algorithm": "3"},
    "Intel MPI": {"I_MPI_HYDRA_BOOTSTRAP": "ssh", "I_MPI_HYDRA_BOOTSTRAP_EXEC": "RUNTIME/ssh",
                  "I_MPI_FABRICS": "shm:ofi", "FI_PROVIDER": "tcp"},
}
NAMES = list(VERSIONS)


@pytest.mark.parametrize("name", NAMES)
def test_each_library_is_found_from_its_version_string(name):
    assert launch.library_for(VERSIONS[name]).name == name


def test_an_unknown_library_is_refused_naming_the_known_ones():
    with pytest.raises(launch.LauncherError, match=r"'Other MPI 1\.0'; known: MPICH, Open MPI, Intel MPI"):
        launch.library_for("Other MPI 1.0\nmore")


@pytest.mark.parametrize("name", NAMES)
def test_each_library_gets_its_launchers_command_and_host_file(name, tmp_path):
    cluster = Cluster("abc123", 3)
    lib = launch.library_for(VERSIONS[name])
    argv = launch.mpi_command(cluster, lib, lib.launcher, str(tmp_path), 3, ["python", "job.py"], nodes=2)
    assert argv[:4] == ["ip", "netns", "exec", cluster.netns(0)]           # the launcher runs on node0
    start = argv.index(lib.launcher)
    assert [a.replace(str(tmp_path), "RUNTIME") for a in argv[start:-2]] == COMMANDS[name]
    assert argv[-2:] == ["python", "job.py"]
    assert (tmp_path / "hosts").read_text() == HOST_FILES[name]


@pytest.mark.parametrize("name", NAMES)
def test_the_probe_runs_one_rank_on_each_of_node0_and_node1_under_mpi4py(name, tmp_path):
    cluster = Cluster("abc123", 4, rate=1e9)
    lib = launch.library_for(VERSIONS[name])
    argv = launch.probe_command(cluster, lib, lib.launcher, str(tmp_path))
    assert argv[-7:] == [sys.executable, "-m", "mpi4py", "-m", "npddp.cluster.probe", "--rate", "1000000000.0"]
    assert (tmp_path / "probe-hosts").read_text() == HOST_FILES[name].replace("3", "1")
    expected = [{"RUNTIME/hosts": "RUNTIME/probe-hosts", "3": "1", "6": "2"}.get(a, a) for a in COMMANDS[name]]
    assert [a.replace(str(tmp_path), "RUNTIME") for a in argv[argv.index(lib.launcher):-7]] == expected


@pytest.mark.parametrize("name", NAMES)
def test_each_library_gets_its_bootstrap_and_network_environment(name, tmp_path):
    lib = launch.library_for(VERSIONS[name])
    env = launch.mpi_env(lib, str(tmp_path), {"PATH": "/bin"})
    assert {k: env[k].replace(str(tmp_path), "RUNTIME") for k in ENVS[name]} == ENVS[name]
    assert env["PATH"] == "/bin"


@pytest.mark.parametrize("name", NAMES)
def test_the_callers_network_choice_stands_but_the_launchers_ssh_is_always_the_stand_in(name, tmp_path):
    lib = launch.library_for(VERSIONS[name])
    mine = {key: "mine" for key in {**lib.network_env, **lib.speed_env, **lib.bootstrap_env}}
    env = launch.mpi_env(lib, str(tmp_path), mine)
    assert all(env[key] == "mine" for key in {**lib.network_env, **lib.speed_env})
    assert all(env[key] == value.format(stand_in=str(tmp_path / "ssh")) for key, value in lib.bootstrap_env.items())


def test_the_active_environments_library_and_its_launcher_are_found():
    lib = launch.active_library()
    path = launch.find_launcher(lib)
    out = subprocess.run([path, "--version"], capture_output=True, text=True)
    assert lib.launcher_marker in out.stdout + out.stderr


def test_a_launcher_of_another_library_beside_python_is_refused(tmp_path):
    fake = tmp_path / "bin"
    fake.mkdir()
    for tool in ("mpiexec", "mpirun", "mpiexec.hydra"):
        (fake / tool).write_text("#!/bin/sh\necho 'some other MPI 1.0'\n")
        (fake / tool).chmod(0o755)
    lib = launch.library_for(VERSIONS["Intel MPI"])
    old = os.environ["PATH"]
    try:
        os.environ["PATH"] = str(fake)
        with pytest.raises(launch.LauncherError, match=r"needs Intel MPI's mpiexec\.hydra"):
            launch.find_launcher(lib, python=str(fake / "python"))
    finally:
        os.environ["PATH"] = old


N = 6_250_000
ALLOWED = 2 * N * 8 / 1e9


@pytest.mark.parametrize("name", NAMES)
def test_probe_accepts_a_ping_pong_that_crossed_the_link(name):
    ok, line = probe.verdict(launch.library_for(VERSIONS[name]), ("node0", "node1"), N, 1.05 * ALLOWED, 1e9,
                             2 * N * probe.ROUNDS + 1000)
    assert ok and line.startswith(f"npddp.cluster: {name} between node0 and node1: 2 x {N} bytes took 105.0 ms")


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("seconds, carried, words", [
    (1.05 * ALLOWED, 0, "eth0 carried 0 of the 25000000 bytes"),      # shared memory, slow under load
    (0.5 * ALLOWED, None, "took 50.0 ms, the link allows no less than 100.0 ms"),
])
def test_probe_refuses_a_bypass_naming_the_library_and_what_to_set(name, seconds, carried, words):
    lib = launch.library_for(VERSIONS[name])
    ok, line = probe.verdict(lib, ("node0", "node1"), N, seconds, 1e9, carried)
    assert not ok and words in line and f"{name}'s traffic between node0 and node1 did not cross" in line
    assert "set " + " ".join(f"{k}={v}" for k, v in lib.network_env.items()) in line


def test_probe_refuses_both_ranks_on_one_host():
    ok, line = probe.verdict(launch.library_for(VERSIONS["Intel MPI"]), ("node0", "node0"), N, ALLOWED, 1e9, 4 * N)
    assert not ok and "Intel MPI's launcher put both probe ranks on node0" in line


def test_probe_on_an_unshaped_link_checks_the_bytes_only():
    lib = launch.library_for(VERSIONS["MPICH"])
    assert probe.verdict(lib, ("node0", "node1"), 1 << 20, 1e-4, None, 4 << 20)[0]
    assert not probe.verdict(lib, ("node0", "node1"), 1 << 20, 1e-4, None, 100)[0]
