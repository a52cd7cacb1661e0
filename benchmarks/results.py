"""Writing benchmark dumps: one flat table per HDF5 file, by the columns of :mod:`npddp.results.columns`.

The layout, and reading a dump back (``from npddp.results import read_table, read_meta``, which
works anywhere npddp is installed), are in :mod:`npddp.results`. This module writes: every
benchmark calls :func:`write_dump` (and :func:`write_csv` for ``--csv``). The readers are
re-exported here for the benchmark scripts and their tests.
"""

from __future__ import annotations

import sys
from pathlib import Path

if not __package__:  # run by path: the repository root stands in for this folder, so `benchmarks` imports as a package
    sys.path[0] = str(Path(__file__).resolve().parents[1])

import csv

import h5py
import numpy as np

from npddp.results import (FORMAT, KINDS, SCHEMA_VERSION, DumpError, check, describe, kind_of,  # noqa: F401
                           read_meta, read_raw, read_table)
from npddp.results.columns import INT, STR
from npddp.util import runinfo
from npddp.util.atomicfile import atomic_h5


# ----------------------------------------------------------------------------- writing

def table_columns(kind: str, rows: list[dict]) -> dict:
    """Rows (dicts keyed by exactly the kind's column names) as {name: 1-D array} in declared order."""
    spec = kind_of(kind)
    if not rows:
        raise ValueError(f"{kind}: no rows to write")
    for i, row in enumerate(rows):
        missing = [n for n in spec.names if n not in row]
        extra = [n for n in row if n not in spec.names]
        if missing or extra:
            raise ValueError(f"{kind} row {i}: missing columns {missing}, unknown columns {extra}; "
                             f"declared: {', '.join(spec.names)}")
    out = {}
    for c in spec.columns:
        values = [row[c.name] for row in rows]
        if c.type == STR:
            if not all(isinstance(v, str) for v in values):
                raise TypeError(f"{kind} column {c.name!r}: expected str values, got {values!r}")
            out[c.name] = np.array(values, dtype=object)
        else:
            out[c.name] = np.array(values, dtype=np.int64 if c.type == INT else np.float64)
    return out


def write_dump(path, kind: str, rows: list[dict], *, world_size: int, backends=None, attrs=None,
               raw=None) -> None:
    """Write ``rows`` as a ``kind`` dump at ``path`` atomically (layout in the module docstring).

    ``attrs``: producer attributes (argv, config, ...) stored after the environment; ``raw``:
    {name: 2-D array} for the kind's raw arrays.
    """
    spec = kind_of(kind)
    table = table_columns(kind, rows)
    raws = {r.name: r for r in spec.raw}
    for name in raw or {}:
        if name not in raws:
            raise ValueError(f"{kind}: unknown raw array {name!r}; declared: {', '.join(raws) or 'none'}")
    with atomic_h5(path) as f:
        runinfo.write_attrs(f, runinfo.environment(world_size=world_size, backend=backends))
        runinfo.write_attrs(f, dict(attrs or {}))
        runinfo.write_attrs(f, {"format": FORMAT, "kind": kind, "schema_version": SCHEMA_VERSION})
        g = f.create_group("table", track_order=True)
        g.attrs["columns"] = np.array(spec.names, dtype=h5py.string_dtype())
        for c in spec.columns:
            data = table[c.name]
            ds = g.create_dataset(c.name, data=data, dtype=h5py.string_dtype() if c.type == STR else data.dtype)
            ds.attrs.update({"doc": c.doc, "unit": c.unit})
        for name, values in (raw or {}).items():
            ds = f.require_group("raw").create_dataset(name, data=np.asarray(values, dtype=np.float64))
            ds.attrs.update({"doc": raws[name].doc, "unit": raws[name].unit})


def write_csv(path, kind: str, rows: list[dict]) -> None:
    """Write ``rows`` as CSV with a header of the kind's column names, in declared order."""
    table = table_columns(kind, rows)
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(list(table))
        for i in range(len(rows)):
            w.writerow([_csv_cell(values[i]) for values in table.values()])


def _csv_cell(value):
    """A CSV cell: floats in full precision (repr), the rest as str."""
    return repr(float(value)) if isinstance(value, (float, np.floating)) else value


if __name__ == "__main__":  # python -m benchmarks.results: the columns of every kind of dump
    for _name, _kind in KINDS.items():
        print(f"### {_name}\n\n{_kind.doc}.\n\n{describe(_name)}\n")
