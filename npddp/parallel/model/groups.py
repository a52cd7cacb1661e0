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


def mesh_groups(mesh: Mesh, world, backend: str | None = None, **create_args) -> MeshGroups:
    """Split ``world`` along every mesh axis: a Communicator of ``mesh.world_size`` ranks (its groups are its own
    backend), or a raw world (mpi4py communicator or Transport) over which ``backend`` is built first, on a copy
    with a message context of its own (sharing the world's, its calls could interleave with those in flight there)."""
    from npddp.comm import create
    from npddp.comm.transports.base import is_transport

    raw = not (callable(getattr(world, "split", None)) and callable(getattr(world, "allreduce", None)))
    size = (world.size if is_transport(world) else world.Get_size()) if raw else world.size
    if size != mesh.world_size:
        raise ValueError(f"{mesh!r} needs a world of {mesh.world_size} ranks, got {size}")
    if raw and backend is None:
        raise ValueError("mesh_groups over a raw world (mpi4py communicator or Transport) needs the backend to "
                         "build its groups with; got backend=None")
    own = None if not raw else world.split([0] * size) if is_transport(world) else world.Dup()
    comm = create(backend, group=own, **create_args) if raw else world
    groups = {axis: split_group(comm, mesh.colors(axis)) for axis in AXES}
    if raw and not is_transport(own):
        own.Free()   # the groups are splits of it, each of its own; nothing else uses the copy
    return MeshGroups(mesh, comm.rank, groups["data"], groups["pipeline"], groups["tensor"])
