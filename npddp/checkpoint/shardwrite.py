"""Sharded checkpoints for ``--zero 1..3``: every rank writes its own shard file, rank 0 writes the index last.

Layout, for ``--checkpoint run.h5`` saved at step 12 on 2 ranks::

    run.h5                              the index: a checkpoint file (same root attributes, /optimizer
                                        scalars, /rng, /ddp, /progress, checksums) with ``sharded`` true,
                                        no parameters, and /shards (directory, files, sizes, crc32, stage)
                                        and /layout (parameter names, shapes, dtypes, optimizer buffers)
    run.h5.step-00000012-9f3a61c0/      this save's generation: step and a token drawn by rank 0
        rank-00000-of-00002.h5          rank 0's chunks: /params/<k>, /optimizer/<buffer>/<k>, and
        rank-00001-of-00002.h5          /layout rows (parameter, start, length, chunk k, offset in chunk)

The index stores its directory as a suffix of its own file name (``.step-00000012-9f3a61c0``),
so a copy ``backup.h5`` reads ``backup.h5.step-00000012-9f3a61c0/``, never the original's.
A shard file carries its rank, world size, stage and step. Every save writes a new directory,
so no file the current index names is touched: each shard is written atomically, the index
naming every shard's size and whole-file CRC-32 replaces the previous index only after all
shards are on disk, and only then are the other step directories of this index removed (the
previous generation, one a crash left without an index, or one of another world size), so a
crash or a failed write at any moment leaves a complete set. Indexes of the earlier layout
(``run.h5.step-00000012/`` named in ``files``) are still read, and replaced by the next save. :func:`npddp.checkpoint.fileformat.read` assembles the whole-model
state from the shards (so resume at any world size or stage, ``npddp.evaluate`` and
``load_model`` take it as any checkpoint); a missing or damaged shard is a CheckpointError naming it.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import zlib

import numpy as np

from npddp.parallel.zero import ZeroRedundancyOptimizer
from npddp.checkpoint import fileformat, state
from npddp.process.agree import agree, share_text
from npddp.checkpoint.shardread import SHARD_FORMAT
from npddp.checkpoint.stateful import ModelState, RunInfo, TrainState
from npddp.util.atomicfile import atomic_h5
from npddp.util.runinfo import SCHEMA_VERSION

_ROW = 5                                      # layout row: parameter, start, length, chunk, offset


#: The name of a step directory after its index's name: the step, then (this layout) a generation token.
_STEP_DIR = re.compile(r"\.step-\d{8}(-[0-9a-f]{8})?")


def step_dir(path, step: int, generation: str = "") -> str:
    """The directory of the shard files of ``step`` (of save ``generation``) beside the index ``path``."""
    return f"{os.fspath(path)}.step-{step:08d}" + (f"-{generation}" if generation else "")


def shard_name(rank: int, size: int) -> str:
    """A shard file's name inside its step directory."""
    return f"rank-{rank:05d}-of-{size:05d}.h5"


def _is_buffer(key: str, buffers) -> bool:
    head, _, tail = key.rpartition(".")
    return head in buffers and tail.isdigit()


def local_chunks(comm, engine, optimizer):
    """This rank's (layout rows, parameter chunks, {buffer: chunks}, optimizer scalars, buffers)."""
    sharded = optimizer.sharded
    local = sharded.optim.state_dict()
    buffers = tuple(sharded.optim.buffers)
    scalars = {k: v for k, v in local.items() if not _is_buffer(k, buffers)}
    params = engine.parameters()
    rows, values, chunks = [], [], {b: [] for b in buffers}
    if isinstance(sharded, ZeroRedundancyOptimizer):       # stage 1: whole parameters per rank
        for k, i in enumerate(sharded.partition[comm.rank]):
            rows.append((i, 0, params[i].data.size, k, 0))
            values.append(np.ascontiguousarray(params[i].data).reshape(-1))
            for b in buffers:
                chunks[b].append(np.asarray(local[f"{b}.{k}"]).reshape(-1))
    else:                                                  # stages 2 and 3: a slice of each flat group
        index = {id(p): i for i, p in enumerate(params)}
        for k, g in enumerate(engine.buckets):
            lo_r = comm.rank * g.shard_size
            for p, lo in zip(g.params, g.offsets):
                a, z = max(lo, lo_r), min(lo + p.data.size, lo_r + g.shard_size)
                if a < z:
                    rows.append((index[id(p)], a - lo, z - a, k, a - lo_r))
            values.append(np.asarray(g.shard.data).reshape(-1))
            for b in buffers:
                chunks[b].append(np.asarray(local[f"{b}.{k}"]).reshape(-1))
    return rows, values, chunks, scalars, buffers


def write_shard(target, *, rank: int, size: int, stage: int, step: int, rows, values, chunks) -> tuple[int, int]:
    """Write one shard file atomically; (its size in bytes, its whole-file CRC-32)."""
    written = {}

    def finish(image: bytes) -> bytes:
        data = fileformat._with_header(image)
        written["size"], written["crc"] = len(data), zlib.crc32(data)
        return data

    with atomic_h5(target, finish=finish, userblock_size=fileformat._BLOCK) as f:
        f.attrs.update({"format": SHARD_FORMAT, "schema_version": SCHEMA_VERSION, "rank": rank,
                        "world_size": size, "stage": stage, "step": step})
        f.create_dataset("layout", data=np.array(rows, dtype=np.int64).reshape(-1, _ROW))
        g = f.create_group("params")
        for k, v in enumerate(values):
            g.create_dataset(str(k), data=v)
        g = f.create_group("optimizer")
        for b, arrays in chunks.items():
            gb = g.create_group(b)
            for k, v in enumerate(arrays):
                gb.create_dataset(str(k), data=v)
        fileformat._seal(f)
    return written["size"], written["crc"]


class _Scalars:
    """Stands in for the optimizer when :func:`state.collect` gathers the rest of the state."""

    def __init__(self, scalars: dict):
        self.scalars = scalars

    def state_dict(self) -> dict:
        return dict(self.scalars)


def save(comm, path, model: ModelState, optim, train: TrainState, info: RunInfo) -> None:
    """Collective: write this step's sharded checkpoint at ``path``; OSError on every rank when a write fails.

    ``model.engine`` holds the parameters (ZeRO-2/3: flat groups sharded over the ranks), ``optim``
    is a :class:`~npddp.checkpoint.stateful.CheckpointedOptimizer` over ZeRO's optimizer.
    """
    path, named_params, engine = os.fspath(path), model.named, model.engine
    step = int(train.step)
    stage = 1 if isinstance(optim.sharded, ZeroRedundancyOptimizer) else engine.stage
    directory = step_dir(path, step, share_text(comm, secrets.token_hex(4) if comm.rank == 0 else ""))
    name = shard_name(comm.rank, comm.size)
    rows, values, chunks, scalars, buffers = local_chunks(comm, engine, optim)
    rest = ModelState([], model.dropouts, engine)              # everything but the parameters, stored once
    meta = state.collect(comm, rest, _Scalars(scalars), train, info)
    written, message = np.zeros(2, dtype=np.int64), None
    target = os.path.join(directory, name)
    try:
        os.makedirs(directory, exist_ok=True)
        written[:] = write_shard(target, rank=comm.rank, size=comm.size, stage=stage, step=step, rows=rows,
                              values=values, chunks=chunks)
    except OSError as exc:
        message = f"cannot write {target}: {exc.strerror or exc}; the previous checkpoint is kept"
    message = agree(comm, message)
    if message:
        if comm.rank == 0:                                 # the incomplete new set; the index names the old one
            shutil.rmtree(directory, ignore_errors=True)
        raise OSError(message)
    table = comm.gather(written, root=0)                      # (size, 2) on rank 0
    if comm.rank == 0:
        try:
            params = engine.parameters()
            names = {id(p): n for n, p in named_params}
            layout = {"names": [names[id(p)] for p in params], "order": [n for n, _ in named_params],
                      "shapes": [list(p.data.shape) for p in params],
                      "dtypes": [p.data.dtype.name for p in params], "buffers": list(buffers)}
            files = [shard_name(r, comm.size) for r in range(comm.size)]
            _write_index(path, meta, stage=stage, directory=directory[len(path):], files=files,
                         table=np.asarray(table), layout=layout)
        except OSError as exc:
            message = f"cannot write {path}: {exc.strerror or exc}; the previous checkpoint is kept"
        if message is None:
            remove_old_steps(path, keep=directory)
        else:
            shutil.rmtree(directory, ignore_errors=True)
    message = agree(comm, message)
    if message:
        raise OSError(message)


def _write_index(path: str, meta, *, stage: int, directory: str, files: list, table: np.ndarray,
                 layout: dict) -> None:
    """Rank 0: the index file, written atomically once every shard is on disk.

    ``directory``: the shard directory as a suffix of the index's file name; ``files``: names in it.
    """

    def extra(f) -> None:
        f.attrs["sharded"] = True
        g = f.create_group("shards")
        g.attrs["directory"] = directory
        g.attrs["files"] = json.dumps(files)
        g.attrs["stage"] = int(stage)
        g.create_dataset("sizes", data=table[:, 0].astype(np.int64))
        g.create_dataset("crc32", data=table[:, 1].astype(np.int64))
        g = f.create_group("layout")
        for key, value in layout.items():
            g.attrs[key] = json.dumps(value)

    fileformat.write(path, meta, extra=extra)


def remove_old_steps(path, keep: str) -> None:
    """Remove the step directories of ``path`` other than ``keep`` (after the index naming ``keep`` is in place).

    Only directories named as this index's step directories are removed (either layout).
    """
    path = os.fspath(path)
    parent, head = os.path.dirname(path) or ".", os.path.basename(path)
    for entry in os.scandir(parent):
        if (entry.name.startswith(head) and _STEP_DIR.fullmatch(entry.name[len(head):])
                and entry.name != os.path.basename(keep) and entry.is_dir(follow_symlinks=False)):
            shutil.rmtree(entry.path, ignore_errors=True)
