"""The Communicators of a rank's mesh groups: one ``comm.split`` per mesh axis.

Each group is ``comm.split(color, key)`` of a communicator over the whole mesh: the same backend and
settings, and a message context of its own, so the groups' messages never meet. Collective: every rank
of the world calls it with the same mesh, in the same order.
"""

from __future__ import annotations

from dataclasses import dataclass

from npddp.parallel.model.mesh import AXES, Mesh


@dataclass(frozen=True)
class MeshGroups:
    """This rank's coordinates and a Communicator for each of its groups."""

    mesh: Mesh
    rank: int
    data: object
    pipeline: object
    tensor: object


def split_group(comm, colors: list[int]):
    """The communicator among the ranks of ``comm`` whose color matches this rank's, in ``comm``'s rank order."""
    return comm.split(int(colors[comm.rank]), comm.rank)


def world_communicator(world, backend: str | None, **create_args):
    """``world`` itself when it is a Communicator; else ``backend`` built over the raw world (mpi4py communicator
    or Transport, used as it is)."""
    from npddp.comm import create
    from npddp.comm.transports.base import is_transport

    if callable(getattr(world, "split", None)) and callable(getattr(world, "allreduce", None)):
        return world
    if backend is None:
        kind = "a Transport" if is_transport(world) else "an mpi4py communicator"
        raise ValueError(f"mesh_groups over {kind} needs the backend to build its groups with; got backend=None")
    return create(backend, group=world, **create_args)


def mesh_groups(mesh: Mesh, world, backend: str | None = None, **create_args) -> MeshGroups:
    """Split ``world`` along every mesh axis: a Communicator of ``mesh.world_size`` ranks (its groups are its own
    backend), or a raw world (mpi4py communicator or Transport) over which ``backend`` is built first."""
    comm = world_communicator(world, backend, **create_args)
    if comm.size != mesh.world_size:
        raise ValueError(f"{mesh!r} needs a world of {mesh.world_size} ranks, got {comm.size}")
    groups = {axis: split_group(comm, mesh.colors(axis)) for axis in AXES}
    return MeshGroups(mesh, comm.rank, groups["data"], groups["pipeline"], groups["tensor"])
