"""The files a run writes (``--checkpoint``, ``--metrics``): checked before training, tidied after crashes.

:func:`check_outputs` refuses, before any rank trains, a path that is a directory, sits in a
missing or read-only directory, is not a regular file (a FIFO would block the first read or
write), or is a file that is not an npddp file of the same kind (so nothing foreign is
replaced). :func:`remove_stale` deletes the temporary files a crashed writer left beside
them (see :mod:`npddp.util.atomicfile`). Both run on rank 0 only.
"""

from __future__ import annotations

import os

from npddp.util.atomicfile import remove_stale_temps, target_problem
from npddp.checkpoint.fileformat import FORMAT as CHECKPOINT_FORMAT
from npddp.train.console.metrics import FORMAT as METRICS_FORMAT
from npddp.train.console.printer import format_bytes

#: field name -> the ``format`` attribute a file there must already have to be replaced.
KINDS = {"checkpoint": CHECKPOINT_FORMAT, "metrics": METRICS_FORMAT}


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _format_of(path: str) -> str | None:
    """The ``format`` attribute of a regular HDF5 file, or None (not HDF5, unreadable, no such attribute)."""
    import h5py

    try:
        with h5py.File(path, "r") as f:
            value = f.attrs.get("format")
    except (OSError, RuntimeError, ValueError):
        return None
    return value.decode() if isinstance(value, bytes) else value


def check_output(name: str, path: str | None, resuming: bool = False, overwrite: bool = True) -> str | None:
    """Why the file ``path`` given to ``--<name>`` cannot be written, or None.

    ``overwrite=False``: an existing npddp file there is refused too (a new run's checkpoint).
    """
    if path is None:
        return None
    where = f"{_flag(name)} {path!r}"
    problem = target_problem(where, path)
    if problem:
        return problem
    exists = os.path.lexists(path)
    if exists and not resuming and _format_of(path) != KINDS[name]:
        return (f"{where} exists and is not an npddp {name} file; refusing to replace it (move it "
                "away or choose another path)")
    if exists and not resuming and not overwrite:
        return (f"{where} already holds a {name} (of an earlier run, perhaps of another model); refusing "
                f"to overwrite it: pass --resume to continue it, --overwrite to replace it, or choose "
                "another path")
    return None


def check_outputs(checkpoint: str | None, metrics: str | None, resuming: bool, overwrite: bool = True) -> str | None:
    """The first problem with the checkpoint or metrics path, or None (``--resume`` reads the checkpoint itself).

    ``overwrite=False`` refuses an existing checkpoint or metrics file unless ``resuming``.
    """
    return check_output("checkpoint", checkpoint, resuming, overwrite) or \
        check_output("metrics", metrics, resuming, overwrite)


def remove_stale(paths) -> list[str]:
    """Remove temporary files crashed writers left beside ``paths``; one line per path that had some."""
    lines = []
    for path in paths:
        if path is None:
            continue
        count, freed = remove_stale_temps(path)
        if count:
            lines.append(f"removed {count} stale temporary file{'s' * (count > 1)} of {path} "
                         f"({format_bytes(freed)}) left by an earlier run that crashed while writing it")
    return lines
