"""Starting a job across the nodes: ``--launcher tcp`` (``python -m npddp.run`` on every node) or ``mpi``.

TCP: node ``i`` runs ``python -m npddp.run --nnodes K --node-rank i --nproc R`` with rank 0's
address on node0; every byte between nodes crosses the emulated links.

MPI: the launcher of the MPI library mpi4py loads (:data:`LIBRARIES`: MPICH's and Intel MPI's
Hydra, Open MPI's ``mpirun``) runs on node0 with a host file of the nodes, its ``ssh`` pointed at
a stand-in (a small script written per cluster) that runs the launcher's daemon on the named node
instead. Each library would otherwise reach the other "nodes" through shared memory (they are one
machine), so its network variables keep traffic between nodes on TCP, hence on the links, while
on-node traffic keeps the library's shared memory, as on a real cluster. :func:`probe_command`
checks this at start-up (:mod:`npddp.cluster.probe`: two hosts, the bytes on node0's link, the time).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field

from npddp.cluster.topology import DEVICE, Cluster
from npddp.util.runinfo import library_name

#: Where rank 0's rendezvous listens (namespaces are fresh: any port is free).
MASTER_PORT = 29500
#: The exit code of :mod:`npddp.cluster.probe` when MPI's traffic did not cross the links (it printed why).
PROBE_REFUSED = 3


@dataclass(frozen=True)
class MpiLibrary:
    """How one MPI library starts ranks on the emulated nodes and keeps their traffic between nodes on the links."""

    name: str
    version_prefix: str       # how the first line of MPI_Get_library_version starts
    launcher: str             # the launcher's program, beside python or on PATH
    launcher_marker: str      # a word of the launcher's --version that names this library
    args: tuple               # the launcher's arguments before the program: {hostfile} {stand_in} {per_node} {ranks}
    host_line: str            # one line of the host file: {host} {slots}
    bootstrap_env: dict       # the launcher's ssh pointed at the stand-in, and what it needs to start (always set)
    network_env: dict         # traffic between nodes on TCP (set where the caller chose nothing)
    speed_env: dict = field(default_factory=dict)   # what it takes to reach the links' rate (likewise)


#: The libraries ``--launcher mpi`` knows; everything that differs between them is here.
LIBRARIES = (
    MpiLibrary("MPICH", "MPICH", "mpiexec", "HYDRA",
               ("-f", "{hostfile}", "-launcher", "ssh", "-launcher-exec", "{stand_in}", "-n", "{ranks}"),
               "{host}:{slots}", {},
               {"UCX_TLS": "tcp,self", "FI_PROVIDER": "tcp"}),
    MpiLibrary("Open MPI", "Open MPI", "mpirun", "Open MPI",
               ("--hostfile", "{hostfile}", "-n", "{ranks}"),
               "{host} slots={slots}",
               {"PRTE_MCA_plm_ssh_agent": "{stand_in}", "OMPI_ALLOW_RUN_AS_ROOT": "1",
                "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"},
               {"OMPI_MCA_pml": "ob1", "OMPI_MCA_btl": "tcp,sm,self", "OMPI_MCA_btl_tcp_if_include": DEVICE},
               # the tcp BTL's emulated put makes a large message wait for a control message queued behind
               # the peer's own data on their one connection; libnbc's in-place Iallreduce is reduce + bcast
               {"OMPI_MCA_btl_tcp_flags": "send,inplace", "OMPI_MCA_coll_libnbc_iallreduce_algorithm": "3"}),
    MpiLibrary("Intel MPI", "Intel(R) MPI", "mpiexec.hydra", "Intel(R) MPI",
               ("-f", "{hostfile}", "-ppn", "{per_node}", "-n", "{ranks}"),
               "{host}",
               {"I_MPI_HYDRA_BOOTSTRAP": "ssh", "I_MPI_HYDRA_BOOTSTRAP_EXEC": "{stand_in}"},
               {"I_MPI_FABRICS": "shm:ofi", "FI_PROVIDER": "tcp"}),
)


class LauncherError(RuntimeError):
    """No usable MPI launcher in this environment; the message is one line saying what to install."""


def tcp_program(cmd: list[str]) -> list[str]:
    """``python -m MOD ...`` or ``python SCRIPT ...`` as ``npddp.run`` takes it; ValueError for anything else
    (a program such as ``hostname``, or a script that is not there, failed on every rank with ``can't open file``)."""
    rest = cmd[1:] if cmd and os.path.basename(cmd[0]).startswith("python") else list(cmd)
    if rest and (rest[0] == "-m" and len(rest) > 1 or not rest[0].startswith("-") and os.path.isfile(rest[0])):
        return rest
    raise ValueError(f"command {' '.join(cmd)!r} is not valid for --launcher tcp, which runs a Python module or "
                     "script on every rank (python -m npddp.run): python -m MODULE [args] or python SCRIPT [args] "
                     "with SCRIPT a file; --launcher mpi runs any program")


def tcp_commands(cluster: Cluster, ranks_per_node: int, cmd: list[str], grace: float) -> list[list[str]]:
    """One ``python -m npddp.run`` per node, each inside its node."""
    program = tcp_program(cmd)
    return [cluster.node_command(i, [sys.executable, "-m", "npddp.run", "--nnodes", str(cluster.nodes),
                                     "--node-rank", str(i), "--nproc", str(ranks_per_node),
                                     "--master-addr", cluster.address(0), "--master-port", str(MASTER_PORT),
                                     "--grace", str(grace), *program])
            for i in range(cluster.nodes)]


def library_for(version: str) -> MpiLibrary:
    """The entry of :data:`LIBRARIES` for an MPI_Get_library_version string; LauncherError naming the known ones."""
    first = library_name(version)
    for lib in LIBRARIES:
        if first.startswith(lib.version_prefix):
            return lib
    raise LauncherError(f"--launcher mpi does not know the MPI library {first!r}; "
                        f"known: {', '.join(lib.name for lib in LIBRARIES)}")


_VERSION_CODE = "import mpi4py; mpi4py.rc.initialize = False; from mpi4py import MPI; print(MPI.Get_library_version())"


def active_library(python: str = sys.executable) -> MpiLibrary:
    """The library mpi4py loads under ``python``, asked in a subprocess that does not initialise MPI."""
    done = subprocess.run([python, "-c", _VERSION_CODE], capture_output=True, text=True, timeout=60)
    if done.returncode:
        reason = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        raise LauncherError(f"--launcher mpi needs mpi4py and an MPI library in this environment ({reason})")
    return library_for(done.stdout)


def find_launcher(lib: MpiLibrary, python: str = sys.executable) -> str:
    """``lib``'s launcher beside ``python`` first, then on PATH, whose --version names ``lib``; else LauncherError."""
    here = os.path.join(os.path.dirname(python), lib.launcher)
    for path in (here, shutil.which(lib.launcher)):
        if path and os.access(path, os.X_OK):
            out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60)
            if lib.launcher_marker in out.stdout + out.stderr:
                return path
    raise LauncherError(f"--launcher mpi needs {lib.name}'s {lib.launcher} (mpi4py here uses {lib.name}) "
                        "beside this Python or on PATH")


def write_stand_in(cluster: Cluster, runtime: str) -> str:
    """The launchers' ``ssh`` stand-in: ``STAND_IN [-x ...] HOST COMMAND`` runs COMMAND on node HOST."""
    cases = "".join(f"  {cluster.host(i)}) ns={cluster.netns(i)} ;;\n" for i in range(cluster.nodes))
    path = os.path.join(runtime, "ssh")
    with open(path, "w") as f:
        f.write("#!/bin/sh\n# An MPI launcher's ssh, for emulated nodes: skip ssh's options, run the command there.\n"
                'while [ $# -gt 0 ]; do case "$1" in -*) shift ;; *) break ;; esac; done\n'
                'host=$1; shift\ncase "$host" in\n' + cases +
                '  *) echo "npddp.cluster: no emulated node named $host" >&2; exit 255 ;;\nesac\n'
                'exec ip netns exec "$ns" unshare --uts sh -c \'hostname "$0" && exec sh -c "$1"\' "$host" "$*"\n')
    os.chmod(path, 0o755)
    return path


def write_hostfile(cluster: Cluster, lib: MpiLibrary, runtime: str, per_node: int, nodes: int, name: str) -> str:
    """The host file of the first ``nodes`` nodes, ``per_node`` slots each, in ``lib``'s form."""
    path = os.path.join(runtime, name)
    with open(path, "w") as f:
        f.write("".join(lib.host_line.format(host=cluster.host(i), slots=per_node) + "\n" for i in range(nodes)))
    return path


def mpi_env(lib: MpiLibrary, runtime: str, environ=None) -> dict:
    """The job's environment: the caller's, ``lib``'s bootstrap variables, its network and speed ones unless set."""
    env = dict(os.environ if environ is None else environ)
    for name, value in {**lib.network_env, **lib.speed_env}.items():
        env.setdefault(name, value)
    stand_in = os.path.join(runtime, "ssh")
    env.update({name: value.format(stand_in=stand_in) for name, value in lib.bootstrap_env.items()})
    return env


def mpi_command(cluster: Cluster, lib: MpiLibrary, launcher: str, runtime: str, per_node: int, cmd: list[str],
                nodes: int | None = None, name: str = "hosts") -> list[str]:
    """``lib``'s launcher on node0: ``per_node`` ranks on each of the first ``nodes`` nodes (default: all)."""
    nodes = cluster.nodes if nodes is None else nodes
    fields = {"hostfile": write_hostfile(cluster, lib, runtime, per_node, nodes, name),
              "stand_in": os.path.join(runtime, "ssh"), "per_node": per_node, "ranks": nodes * per_node}
    return cluster.node_command(0, [launcher, *(arg.format(**fields) for arg in lib.args), *cmd])


def probe_command(cluster: Cluster, lib: MpiLibrary, launcher: str, runtime: str) -> list[str]:
    """One rank on node0 and one on node1 timing a ping-pong against the link rate (:mod:`npddp.cluster.probe`).

    Under ``python -m mpi4py``, so an error on one rank aborts both instead of leaving the other waiting.
    """
    return mpi_command(cluster, lib, launcher, runtime, 1,
                       [sys.executable, "-m", "mpi4py", "-m", "npddp.cluster.probe", "--rate",
                        "none" if cluster.rate is None else str(cluster.rate)],
                       nodes=2, name="probe-hosts")
