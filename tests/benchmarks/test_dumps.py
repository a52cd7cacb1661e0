"""Every kind of benchmark dump, as its producer writes it, read back with benchmarks.results.

The dumps come from the ``dumps`` fixture (each producer run on one rank, or its own row
builder for the PyTorch comparison). For each kind: the table's columns are the declared ones
in the declared order, with their declared dtypes and units; no value is ``bytes``; the same
table comes back without pandas (a dict of arrays), and ``--csv`` writes the same rows.
"""

import csv
import math
import sys

import h5py
import numpy as np
import pytest

from benchmarks import results
from benchmarks.columns import FLOAT, INT, KINDS, STR
from npddp.comm import ALGORITHMS, BACKENDS

PANDAS_DTYPE = {INT: "int64", FLOAT: "float64"}


@pytest.mark.parametrize("kind", list(KINDS))
def test_read_table_gives_the_declared_columns_in_order_with_dtypes_and_units(dumps, kind):
    spec = KINDS[kind]
    df = results.read_table(dumps[kind])
    assert list(df.columns) == list(spec.names)
    assert len(df) >= 2
    for c in spec.columns:
        values = df[c.name].tolist()
        if c.type == STR:
            assert all(type(v) is str and v for v in values), (c.name, values)
        else:
            assert str(df[c.name].dtype) == PANDAS_DTYPE[c.type], (c.name, df[c.name].dtype)
        assert not any(isinstance(v, bytes) for v in values)
    with h5py.File(dumps[kind], "r") as f:
        table = f["table"]
        assert list(table) == list(spec.names)  # plain h5py lists them in order too
        assert [str(v) for v in table.attrs["columns"]] == list(spec.names)
        for c in spec.columns:
            assert table[c.name].attrs["unit"] == c.unit and table[c.name].attrs["doc"] == c.doc
            assert h5py.check_string_dtype(table[c.name].dtype) is not None if c.type == STR else \
                table[c.name].dtype == (np.int64 if c.type == INT else np.float64)
        assert f.attrs["kind"] == kind and f.attrs["schema_version"] == results.SCHEMA_VERSION
    meta = results.read_meta(dumps[kind])
    assert meta["kind"] == kind and meta["world_size"] == 1 and meta["format"] == results.FORMAT
    assert meta["host"] and meta["time_utc"] and meta["mpi_library"]


@pytest.mark.parametrize("kind", list(KINDS))
def test_without_pandas_the_table_is_a_dict_of_arrays(dumps, kind, monkeypatch):
    monkeypatch.setitem(sys.modules, "pandas", None)  # import pandas now raises ImportError
    table = results.read_table(dumps[kind])
    assert isinstance(table, dict) and list(table) == list(KINDS[kind].names)
    lengths = {len(v) for v in table.values()}
    assert len(lengths) == 1
    for c in KINDS[kind].columns:
        values = table[c.name]
        assert values.ndim == 1
        if c.type == STR:
            assert all(type(v) is str for v in values)
        else:
            assert values.dtype == (np.int64 if c.type == INT else np.float64)


def test_each_producer_fills_its_own_columns(dumps):
    sweep = results.read_table(dumps["allreduce_sweep"])
    picks = sweep["backend"] == "auto"  # the one backend that chooses its algorithm per call
    assert (sweep["algorithm"][~picks] == sweep["backend"][~picks]).all() and (sweep["transport"] == "mpi").all()
    assert sweep["algorithm"][picks].isin((set(ALGORITHMS) | set(BACKENDS)) - {"auto"}).all()
    assert set(sweep["place"]) == {"inplace", "outofplace"} and (sweep["wrong"] == 0).all()
    raw = results.read_raw(dumps["allreduce_sweep"], "time_s")
    assert raw.shape[0] == len(sweep)
    assert np.allclose(np.nanmedian(raw, axis=1), sweep["time_median_s"])
    ddp = results.read_table(dumps["ddp_breakdown"])
    none = ddp[ddp["backend"] == "none"]
    assert len(none) == 2 and (none["ddp_efficiency"] == 1.0).all() and (none["transport"] == "none").all()
    scaling = results.read_table(dumps["weak_scaling"])
    assert sorted(set(scaling["repeat"])) == [0, 1] and set(scaling["backend"]) == {"mpi", "ring", "none"}


def test_csv_has_the_same_rows_as_the_dump(dumps, tmp_path):
    from mpi4py import MPI

    from benchmarks import ddp as bd
    path, sheet = tmp_path / "ddp.h5", tmp_path / "ddp.csv"
    argv = ["--models", "tiny", "--batch", "2", "--steps", "1", "--warmup", "0", "--syncs", "flat", "--backends",
            "mpi", "--no-comm", "--out", str(path), "--csv", str(sheet)]
    assert bd.main(argv, mpi_comm=MPI.COMM_SELF) == 0
    df = results.read_table(path)
    with open(sheet, newline="", encoding="utf-8") as f:
        rows = list(csv.reader(f))
    assert rows[0] == list(KINDS["ddp_breakdown"].names) and len(rows) == len(df) + 1
    for line, (_, want) in zip(rows[1:], df.iterrows()):
        for cell, column in zip(line, rows[0]):
            value = want[column]
            assert (cell == value) if isinstance(value, str) else (
                math.isnan(float(cell)) if value != value else float(cell) == value), (column, cell, value)
