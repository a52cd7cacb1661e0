"""The Communicators of a rank's mesh groups: one small function, built on a split of the world.

Until every backend offers ``comm.split(color, key)``, a group is made from the raw world the
backends are built on: an mpi4py communicator (``Split(color, key)``) or a :class:`Transport`
(``split(colors)``), then ``npddp.comm.create(backend, group=...)``. Each split has a message
context of its own, so the groups' messages never meet. Collective: every rank of the world
calls it with the same mesh, in the same order.
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


def split_group(world, colors: list[int], backend: str, **create_args):
    """A Communicator of ``backend`` among the ranks of ``world`` whose color matches this rank's."""
    from npddp.comm import create
    from npddp.comm.transports.base import is_transport

    if is_transport(world):
        return create(backend, group=world.split(colors), **create_args)
    rank = world.Get_rank()
    return create(backend, group=world.Split(int(colors[rank]), rank), **create_args)


def mesh_groups(mesh: Mesh, world, backend: str, **create_args) -> MeshGroups:
    """Split ``world`` (mpi4py communicator or Transport of ``mesh.world_size`` ranks) along every mesh axis."""
    from npddp.comm.transports.base import is_transport

    size, rank = (world.size, world.rank) if is_transport(world) else (world.Get_size(), world.Get_rank())
    if size != mesh.world_size:
        raise ValueError(f"{mesh!r} needs a world of {mesh.world_size} ranks, got {size}")
    comms = {axis: split_group(world, mesh.colors(axis), backend, **create_args) for axis in AXES}
    return MeshGroups(mesh, rank, comms["data"], comms["pipeline"], comms["tensor"])
