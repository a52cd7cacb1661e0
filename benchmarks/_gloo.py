"""PyTorch's gloo (torch.distributed over TCP) as a contender beside npddp: start it from an MPI job, all-reduce.

torch is optional: :func:`import_torch` returns None without it, and nothing in npddp imports it.
"""

from __future__ import annotations

import datetime
import socket

import numpy as np

#: Exit status of a benchmark asked to compare against PyTorch when PyTorch is missing.
EXIT_NO_TORCH = 3


def import_torch():
    """The torch module with torch.distributed available, or None."""
    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        return None
    return torch if dist.is_available() else None


def free_port(addr: str) -> int:
    """A TCP port that was free on ``addr`` a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((addr, 0))
        return s.getsockname()[1]


def init_gloo(dist, world, master_addr: str = "127.0.0.1", timeout_s: float = 120) -> None:
    """Start torch.distributed (gloo) with an mpi4py communicator's rank and size; rank 0 picks the port."""
    port = np.zeros(1, dtype=np.int64)
    if world.Get_rank() == 0:
        port[0] = free_port(master_addr)
    world.Bcast(port, root=0)
    dist.init_process_group("gloo", init_method=f"tcp://{master_addr}:{int(port[0])}", rank=world.Get_rank(),
                            world_size=world.Get_size(), timeout=datetime.timedelta(seconds=timeout_s))


class GlooComm:
    """gloo's all-reduce behind npddp's ``allreduce(buf, op, out)`` (a contender in the sweep, not a backend)."""

    name = "gloo"

    def __init__(self, world, master_addr: str = "127.0.0.1"):
        import torch
        import torch.distributed as dist
        torch.set_num_threads(1)
        if not dist.is_initialized():
            init_gloo(dist, world, master_addr)
        self._torch, self._dist = torch, dist
        self._ops = {"sum": dist.ReduceOp.SUM, "prod": dist.ReduceOp.PRODUCT, "max": dist.ReduceOp.MAX,
                     "min": dist.ReduceOp.MIN}
        self.rank, self.size = world.Get_rank(), world.Get_size()

    def allreduce(self, buf: np.ndarray, op: str = "sum", out: np.ndarray | None = None) -> np.ndarray:
        """gloo all-reduce of ``buf`` (into ``out``), sharing the NumPy memory (no copy in place)."""
        target = buf
        if out is not None and out is not buf:
            np.copyto(out, buf)
            target = out
        self._dist.all_reduce(self._torch.from_numpy(target.reshape(-1)), op=self._ops.get(op, self._ops["sum"]))
        if op == "avg":  # gloo has no average: sum, then scale
            np.multiply(target, 1.0 / self.size, out=target)
        return target
