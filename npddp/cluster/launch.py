"""Starting a job across the nodes: ``--launcher tcp`` (``python -m npddp.run`` on every node) or ``mpi`` (MPICH's Hydra).

TCP: node ``i`` runs ``python -m npddp.run --nnodes K --node-rank i --nproc R`` with rank 0's
address on node0; every byte between nodes crosses the emulated links.

MPI: ``mpiexec`` runs on node0 with a host file of the nodes and ``-launcher ssh -launcher-exec
STAND_IN``, where the stand-in (a small script written per cluster) takes Hydra's ``ssh``
arguments and runs the proxy on the named node instead. MPICH's UCX netmod would otherwise
reach the other "nodes" through shared memory (the same machine), so ``UCX_TLS=tcp,self`` (and
``FI_PROVIDER=tcp`` for the libfabric netmod) keep its traffic between nodes on TCP, hence on
the links; on-node traffic keeps MPICH's shared memory, as on a real cluster. :func:`probe_command`
checks this at start-up: a ping-pong between node0 and node1 must take at least what the rate allows.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

from npddp.cluster.topology import Cluster

#: Where rank 0's rendezvous listens (namespaces are fresh: any port is free).
MASTER_PORT = 29500
#: Environment that keeps MPICH's traffic between nodes on TCP sockets (see the module's notes).
MPI_NETWORK_ENV = {"UCX_TLS": "tcp,self", "FI_PROVIDER": "tcp"}


def tcp_program(cmd: list[str]) -> list[str]:
    """``python -m MOD ...`` or ``python SCRIPT ...`` as ``npddp.run`` takes it; ValueError for anything else."""
    rest = cmd[1:] if cmd and os.path.basename(cmd[0]).startswith("python") else list(cmd)
    if rest and (rest[0] == "-m" and len(rest) > 1 or not rest[0].startswith("-")):
        return rest
    raise ValueError(f"command {' '.join(cmd)!r} is not valid for --launcher tcp; valid: "
                     "python -m MODULE [args] or python SCRIPT [args] (or --launcher mpi for any program)")


def tcp_commands(cluster: Cluster, ranks_per_node: int, cmd: list[str], grace: float) -> list[list[str]]:
    """One ``python -m npddp.run`` per node, each inside its node."""
    program = tcp_program(cmd)
    return [cluster.node_command(i, [sys.executable, "-m", "npddp.run", "--nnodes", str(cluster.nodes),
                                     "--node-rank", str(i), "--nproc", str(ranks_per_node),
                                     "--master-addr", cluster.address(0), "--master-port", str(MASTER_PORT),
                                     "--grace", str(grace), *program])
            for i in range(cluster.nodes)]


def find_mpiexec() -> str | None:
    """MPICH's ``mpiexec`` (Hydra): beside this Python first, then on PATH; None when there is no Hydra."""
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    for path in (here, shutil.which("mpiexec")):
        if path and os.access(path, os.X_OK):
            out = subprocess.run([path, "--version"], capture_output=True, text=True)
            if "HYDRA" in out.stdout + out.stderr:
                return path
    return None


def write_stand_in(cluster: Cluster, runtime: str) -> str:
    """The ``ssh`` stand-in for Hydra: ``STAND_IN [-x ...] HOST COMMAND`` runs COMMAND on node HOST."""
    cases = "".join(f"  {cluster.host(i)}) ns={cluster.netns(i)} ;;\n" for i in range(cluster.nodes))
    path = os.path.join(runtime, "ssh")
    with open(path, "w") as f:
        f.write("#!/bin/sh\n# Hydra's ssh, for emulated nodes: skip ssh's options, run the command on the node.\n"
                'while [ $# -gt 0 ]; do case "$1" in -*) shift ;; *) break ;; esac; done\n'
                'host=$1; shift\ncase "$host" in\n' + cases +
                '  *) echo "npddp.cluster: no emulated node named $host" >&2; exit 255 ;;\nesac\n'
                'exec ip netns exec "$ns" unshare --uts sh -c \'hostname "$0" && exec sh -c "$1"\' "$host" "$*"\n')
    os.chmod(path, 0o755)
    return path


def write_hostfile(cluster: Cluster, runtime: str, ranks_per_node: int, name: str = "hosts") -> str:
    path = os.path.join(runtime, name)
    with open(path, "w") as f:
        f.write("".join(f"{cluster.host(i)}:{ranks_per_node}\n" for i in range(cluster.nodes)))
    return path


def mpi_env(environ=None) -> dict:
    """The job's environment: the caller's, with :data:`MPI_NETWORK_ENV` where the caller chose nothing."""
    env = dict(os.environ if environ is None else environ)
    for name, value in MPI_NETWORK_ENV.items():
        env.setdefault(name, value)
    return env


def mpi_command(cluster: Cluster, mpiexec: str, runtime: str, ranks: int, hostfile: str,
                cmd: list[str]) -> list[str]:
    """Hydra on node0, starting ``ranks`` ranks on the nodes of ``hostfile`` through the stand-in."""
    stand_in = os.path.join(runtime, "ssh")
    return cluster.node_command(0, [mpiexec, "-f", hostfile, "-launcher", "ssh", "-launcher-exec", stand_in,
                                    "-n", str(ranks), *cmd])


def probe_command(cluster: Cluster, mpiexec: str, runtime: str) -> list[str]:
    """One rank on node0 and one on node1 timing a ping-pong against the link rate (:mod:`npddp.cluster.probe`)."""
    hostfile = os.path.join(runtime, "probe-hosts")
    with open(hostfile, "w") as f:
        f.write(f"{cluster.host(0)}:1\n{cluster.host(1)}:1\n")
    return mpi_command(cluster, mpiexec, runtime, 2, hostfile,
                       [sys.executable, "-m", "npddp.cluster.probe", "--rate", str(cluster.rate)])
