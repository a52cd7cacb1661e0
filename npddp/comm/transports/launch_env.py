"""Where a TCP rank stands: its rank, the world size and rank 0's address, as its launcher tells them.

Every rank reads ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT`` (and
``LOCAL_RANK``/``LOCAL_WORLD_SIZE`` when set); under srun, Slurm's variables stand for them
(:class:`~npddp.util.env.SlurmTask`); inside an MPI job, MPI tells rank and size and carries rank
0's address. :mod:`~npddp.comm.transports.rendezvous` forms the world from the :class:`LaunchEnv`.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field

import numpy as np

from npddp.comm.transports import handshake
from npddp.util import env as process_env

NAME_BYTES = 64                                               # bytes for an address or a host name


@dataclass(frozen=True)
class LaunchEnv:
    """Where this rank stands, from the launcher's environment variables."""

    rank: int
    world_size: int
    master_addr: str
    master_port: int
    local_rank: int
    local_world_size: int
    secret: bytes = field(default=b"", repr=False)   # NPDDP_JOB_SECRET: the key of the handshake
    job: str = ""     # the job's identity (npddp.util.env.job_identity): a rank of another job is refused


def _int_var(environ, name: str, low: int, high: int | None = None, default=None) -> int:
    raw = environ.get(name)
    if raw is None or raw.strip() == "":
        if default is not None:
            return default
        raise ValueError(f"{name} is not set; the tcp transport needs RANK, WORLD_SIZE, MASTER_ADDR and "
                         "MASTER_PORT (python -m npddp.run sets them)")
    try:
        value = int(raw)
    except ValueError:
        value = None
    if value is None or value < low or (high is not None and value > high):
        valid = f"{low}..{high}" if high is not None else f"an integer >= {low}"
        raise ValueError(f"{name}={raw!r} is out of range; valid: {valid}")
    return value


def launch_env(environ=None) -> LaunchEnv:
    """Parse the launcher's variables; ValueError naming the bad variable and its valid range."""
    environ = os.environ if environ is None else environ
    size = _int_var(environ, "WORLD_SIZE", 1)
    rank = _int_var(environ, "RANK", 0, size - 1)
    port = _int_var(environ, "MASTER_PORT", 1, 65535, default=0 if size == 1 else None)
    addr = environ.get("MASTER_ADDR", "").strip() or "127.0.0.1"
    local_size = _int_var(environ, "LOCAL_WORLD_SIZE", 1, size, default=size)
    local_rank = _int_var(environ, "LOCAL_RANK", 0, local_size - 1, default=rank % local_size)
    return LaunchEnv(rank, size, addr, port, local_rank, local_size, handshake.secret_from_env(environ),
                     process_env.job_identity(environ))


def env_from_slurm(task: process_env.SlurmTask, environ) -> LaunchEnv:
    """For a TCP world under srun: rank and size from Slurm; rank 0 at ``MASTER_ADDR:MASTER_PORT`` when given,
    else on the step's first node (loopback on one node) at a port derived from the job and step ids."""
    addr = environ.get("MASTER_ADDR", "").strip() or task.master_addr
    port = _int_var(environ, "MASTER_PORT", 1, 65535, default=task.master_port)
    return LaunchEnv(task.rank, task.size, addr, port, task.local_rank, task.local_size,
                     handshake.secret_from_env(environ), process_env.job_identity(environ))


def env_from_mpi(mpi_comm=None) -> LaunchEnv:
    """For a TCP world inside an MPI job: rank and size from MPI, rank 0's address and a free port broadcast.

    This lets one ``mpirun`` job put the TCP transport beside MPI's (the benchmarks do).
    """
    from npddp.comm.transports.mpi import mpi_world
    comm = mpi_world() if mpi_comm is None else mpi_comm
    rank, size = comm.Get_rank(), comm.Get_size()
    names = np.zeros((size, NAME_BYTES // 8), dtype=np.int64)  # every rank's host name, to see if they share one
    mine = np.zeros(NAME_BYTES // 8, dtype=np.int64)
    host = encode_name(socket.gethostname())
    mine.view(np.uint8)[:len(host)] = np.frombuffer(host, np.uint8)
    comm.Allgather(mine, names)
    one_host = bool((names == names[0]).all())
    table = np.zeros(1 + NAME_BYTES // 8, dtype=np.int64)       # port, then rank 0's address
    if rank == 0:
        addr = "127.0.0.1" if one_host else socket.gethostbyname(socket.gethostname())
        with socket.socket() as probe:
            probe.bind((addr, 0))
            table[0] = probe.getsockname()[1]
        table[1:].view(np.uint8)[:len(addr)] = np.frombuffer(addr.encode(), np.uint8)
    comm.Bcast(table, root=0)
    addr = table[1:].view(np.uint8).tobytes().rstrip(b"\0").decode()
    local = int((names == mine).all(axis=1).sum())
    key = np.frombuffer(handshake.new_secret().encode(), np.uint8).copy()   # MPI carries rank 0's key
    comm.Bcast(key, root=0)
    return LaunchEnv(rank, size, addr, int(table[0]), rank % local, local, key.tobytes(), "an mpi job")


def encode_name(text: str) -> bytes:
    """``text`` as bytes for a name field; ValueError when longer than NAME_BYTES."""
    raw = text.encode()
    if len(raw) > NAME_BYTES:
        raise ValueError(f"address or host name {text!r} is longer than {NAME_BYTES} bytes")
    return raw
