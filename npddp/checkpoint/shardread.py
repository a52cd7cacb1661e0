"""Reading a sharded checkpoint (see :mod:`npddp.checkpoint.shardwrite`) into one process: the whole-model state.

:func:`assemble` checks every shard file against the size and CRC-32 its index records, then
copies each shard's chunks into the whole parameters and optimizer buffers by the shard's
layout rows; a missing, truncated, damaged or foreign shard is a :class:`ShardError` naming it.
The shard directory is the index's own file name plus the suffix the index stores, so a copy
of the index under another name reads its own copy of the directory (or is refused when there
is none); an index of the earlier layout names its files relative to the index's folder.
"""

from __future__ import annotations

import json
import os
import zlib

import numpy as np

SHARD_FORMAT = "npddp-checkpoint-shard"


class ShardError(ValueError):
    """A shard file that is missing, damaged, or does not belong to its index (one line naming it)."""



def _shard_problem(shard: str, size: int, crc: int) -> str | None:
    """What is wrong with a shard file against the index's size and CRC-32, or None."""
    try:
        have = os.stat(shard).st_size
    except FileNotFoundError:
        return "is missing"
    except OSError as exc:
        return f"cannot be read ({exc.strerror or exc})"
    if have != size:
        return f"is damaged or truncated: {have} bytes where the index records {size}"
    got = 0
    with open(shard, "rb") as f:
        while chunk := f.read(1 << 24):
            got = zlib.crc32(chunk, got)
    if got != crc:
        return "is damaged: its checksum does not match the index"
    return None


def _shard_folder(path: str, attrs) -> str:
    """The folder the index at ``path`` names its shard files in; ShardError when it does not exist."""
    suffix = attrs.get("directory")
    if suffix is None:                       # the earlier layout: "<index name>.step-N/<shard>" beside the index
        return os.path.dirname(path)
    suffix = suffix.decode() if isinstance(suffix, bytes) else str(suffix)
    if not suffix.startswith(".step-") or os.sep in suffix:
        raise ShardError(f"checkpoint {path!r} names its shard directory {suffix!r}; valid: a suffix .step-N-...")
    folder = path + suffix
    if not os.path.isdir(folder):
        raise ShardError(f"checkpoint {path!r}: its shard directory {folder!r} does not exist (a sharded "
                         "checkpoint is the index and that directory: copy or move both, the directory named "
                         "after the index)")
    return folder


def assemble(path, f, ckpt):
    """The whole-model Checkpoint of the sharded index ``f`` at ``path`` (``ckpt``: what the index holds)."""
    import h5py

    path = os.fspath(path)
    g, lay = f["shards"], f["layout"]
    files = json.loads(g.attrs["files"])
    sizes, crcs = g["sizes"][()], g["crc32"][()]
    names, order = json.loads(lay.attrs["names"]), json.loads(lay.attrs["order"])
    shapes, dtypes = json.loads(lay.attrs["shapes"]), json.loads(lay.attrs["dtypes"])
    buffers = json.loads(lay.attrs["buffers"])
    world = len(files)
    if world != ckpt.world_size or len(sizes) != world or len(crcs) != world:
        raise ShardError(f"checkpoint {path!r} lists {world} shard files for world size {ckpt.world_size}")
    folder = _shard_folder(path, g.attrs)
    full = [np.zeros(int(np.prod(s)), dtype=d) for s, d in zip(shapes, dtypes)]
    state_full = {b: [None] * len(full) for b in buffers}
    covered = [0] * len(full)
    for r, rel in enumerate(files):
        shard = os.path.join(folder, rel)
        where = f"checkpoint {path!r}: shard {shard!r} (rank {r} of {world})"
        problem = _shard_problem(shard, int(sizes[r]), int(crcs[r]))
        if problem:
            raise ShardError(f"{where} {problem}")
        try:
            with h5py.File(shard, "r") as sf:
                attrs = {k: sf.attrs[k] for k in ("format", "rank", "world_size", "step")}
                if (attrs["format"] != SHARD_FORMAT or int(attrs["rank"]) != r or int(attrs["world_size"]) != world
                        or int(attrs["step"]) != ckpt.step):
                    raise ShardError(f"{where} does not belong to this index (it says rank {attrs['rank']} "
                                     f"of {attrs['world_size']}, step {attrs['step']})")
                _place(sf, full, state_full, covered, buffers)
        except ShardError:
            raise
        except (OSError, KeyError, ValueError, IndexError) as exc:
            raise ShardError(f"{where} is damaged: {exc}") from None
    for i, n in enumerate(covered):
        if n != full[i].size or any(state_full[b][i] is None and full[i].size for b in buffers):
            raise ShardError(f"checkpoint {path!r}: the shards hold {n} of the {full[i].size} values of "
                             f"parameter {names[i]!r}")
    pos = {n: i for i, n in enumerate(names)}
    ckpt.params = {n: full[pos[n]].reshape(shapes[pos[n]]) for n in order}
    for b in buffers:
        for i, arr in enumerate(state_full[b]):
            ckpt.optimizer[f"{b}.{i}"] = (arr if arr is not None else np.zeros(0, full[i].dtype)).reshape(shapes[i])
    return ckpt


def _place(sf, full, state_full, covered, buffers) -> None:
    """Copy one open shard file's chunks into the whole parameters and optimizer buffers."""
    rows = sf["layout"][()]
    values = {k: ds[()] for k, ds in sf["params"].items()}
    chunks = {b: {k: ds[()] for k, ds in sf["optimizer"][b].items()} for b in buffers}
    for i, start, length, k, off in (tuple(int(v) for v in row) for row in rows):
        if not (0 <= i < len(full) and 0 <= start and start + length <= full[i].size and length > 0
                and str(k) in values and 0 <= off and off + length <= values[str(k)].size):
            raise ValueError(f"layout row {(i, start, length, k, off)} is out of range")
        full[i][start:start + length] = values[str(k)][off:off + length]
        for b in buffers:
            if state_full[b][i] is None:
                state_full[b][i] = np.zeros(full[i].size, dtype=chunks[b][str(k)].dtype)
            state_full[b][i][start:start + length] = chunks[b][str(k)][off:off + length]
        covered[i] += length
