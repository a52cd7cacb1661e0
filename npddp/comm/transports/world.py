"""This process's TCP world: the ranks its launcher describes (torchrun's variables, Slurm's, MPI's, or none),
connected once by the rendezvous (:mod:`~npddp.comm.transports.rendezvous`) and kept, as MPI keeps COMM_WORLD.

Every communicator ``create()`` builds over TCP takes a transport of its own over that world
(:func:`transport_from_env`); :func:`world_over_mpi` builds a new mesh among an mpi4py communicator's ranks.
"""

from __future__ import annotations

import os

from npddp.comm.transports.launch_env import LaunchEnv, env_from_mpi, env_from_slurm, launch_env
from npddp.comm.transports.rendezvous import connect
from npddp.comm.transports.tcp import TCPTransport, TCPWorld
from npddp.util import env as process_env


def world_over_mpi(mpi_comm, timeout: float) -> TCPWorld:
    """A new TCP mesh among the ranks of an mpi4py communicator (MPI carries rank 0's address)."""
    env = env_from_mpi(mpi_comm)
    socks, hosts = connect(env, timeout)
    return TCPWorld(env.rank, env.world_size, socks, hosts)


_WORLDS: dict = {}  # LaunchEnv -> TCPWorld: this process's connections, made once (like MPI_COMM_WORLD)


def transport_from_env(timeout: float, environ=None) -> TCPTransport:
    """A new transport over the launcher's world, in a message context of its own agreed by every rank.

    Collective: what ``create()`` calls on every rank for each communicator it builds.
    """
    return world_from_env(timeout, environ).world.agreed_transport(timeout)


def world_from_env(timeout: float, environ=None) -> TCPTransport:
    """The transport over every rank the launcher's environment describes; connects on first use.

    Under srun, Slurm's variables tell them (:func:`env_from_slurm`); inside another MPI job without those
    variables, MPI tells rank and size and carries rank 0's address; started by no launcher, a world of one.
    A world other than the launcher announced is a ValueError before any connection (:func:`~npddp.util.env.world_refusal`).
    """
    environ = os.environ if environ is None else environ
    task = process_env.slurm_task(environ)
    if task is not None:
        env = env_from_slurm(task, environ)
    elif process_env.launched_by_mpi(environ) and not all(v in environ for v in process_env.TCP_LAUNCHER_VARIABLES):
        env = _WORLDS.get("mpi") or env_from_mpi()
        _WORLDS["mpi"] = env
    elif process_env.launcher(environ) is None and not {"RANK", "WORLD_SIZE"} & set(environ):
        env = LaunchEnv(0, 1, "127.0.0.1", 0, 0, 1)      # started by no launcher: a world of one
    else:
        env = launch_env(environ)
    refusal = process_env.world_refusal(env.world_size, "the tcp rendezvous", environ)
    if refusal is not None:
        raise ValueError(refusal)
    world = _WORLDS.get(env)
    if world is None:
        process_env.mark_join("joining", env.rank, environ)
        socks, hosts = connect(env, timeout)
        process_env.mark_join("joined", env.rank, environ)
        world = _WORLDS[env] = TCPWorld(env.rank, env.world_size, socks, hosts)
        world.base = world.transport()
    return world.base
