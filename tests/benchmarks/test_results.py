"""Tests of benchmarks.results and benchmarks.columns: writing, checking and reading benchmark dumps.

Rows here are generated from each kind's declaration (so every kind is covered, including
kinds added later); the dumps the benchmarks really write are tested in
tests/benchmarks/test_dumps.py, and the report's refusal of malformed ones in
tests/benchmarks/test_bench_report.py.
"""

import os
import re
from pathlib import Path

import h5py
import numpy as np
import pytest

from benchmarks import results
from benchmarks.columns import FLOAT, INT, KINDS, STR

BENCHMARKS_PAGE = Path(__file__).resolve().parents[2] / "docs" / "guide" / "benchmarks.md"


def valid_row(kind: str, i: int = 0) -> dict:
    """A row that satisfies every declaration of ``kind`` (world size 1)."""
    row = {}
    for c in KINDS[kind].columns:
        if c.type == STR:
            row[c.name] = c.choices[i % len(c.choices)] if c.choices else f"{c.name}{i}"
        elif c.type == INT:
            row[c.name] = 1 if c.name == "world_size" else max(1, int(c.low or 0)) + i
        else:
            row[c.name] = 1.0 + 0.0 * i
    return row


def valid_attrs(kind: str) -> dict:
    """Values for the kind's required root attributes beyond kind, schema_version and world_size."""
    return {c.name: c.choices[0] if c.choices else "x" for c in KINDS[kind].attrs[3:]}


def write(path, kind, rows=None, **kwargs):
    """A dump of ``kind`` with two valid rows (or ``rows``)."""
    rows = rows if rows is not None else [valid_row(kind, 0), valid_row(kind, 1)]
    results.write_dump(path, kind, rows, world_size=1, attrs=valid_attrs(kind), **kwargs)
    return path


@pytest.mark.parametrize("kind", list(KINDS))
def test_a_dump_written_from_declared_rows_is_sound_and_reads_back(tmp_path, kind):
    rows = [valid_row(kind, 0), valid_row(kind, 1)]
    path = write(tmp_path / "d.h5", kind, rows)
    assert results.check(path) == []
    df = results.read_table(path)
    assert list(df.columns) == list(KINDS[kind].names)
    for c in KINDS[kind].columns:
        assert df[c.name].tolist() == [r[c.name] for r in rows], c.name
    assert os.listdir(tmp_path) == ["d.h5"]  # written atomically: no temporary file left


def test_every_column_and_attribute_is_declared_completely():
    for kind in KINDS.values():
        assert len(set(kind.names)) == len(kind.names), kind.name
        for c in kind.columns + kind.attrs:
            assert c.type in (STR, INT, FLOAT) and c.doc, (kind.name, c.name)
            assert (c.unit == "") == (c.type == STR), (kind.name, c.name)  # text has no unit, numbers have one
        for group in kind.ordered:
            assert all(name in kind.names for name in group)
        assert [a.name for a in kind.attrs][:3] == ["kind", "schema_version", "world_size"]


def test_writing_rows_that_break_the_column_list_names_the_columns(tmp_path):
    row = valid_row("weak_scaling")
    with pytest.raises(ValueError, match=r"missing columns \['efficiency'\], unknown columns \['eff'\]"):
        results.write_dump(tmp_path / "x.h5", "weak_scaling", [{**{k: v for k, v in row.items() if k != "efficiency"},
                                                                "eff": 1.0}], world_size=1)
    with pytest.raises(TypeError, match="column 'model': expected str values"):
        results.table_columns("weak_scaling", [{**row, "model": b"tiny"}])
    with pytest.raises(ValueError, match="unknown dump kind 'nope'; valid: allreduce_sweep"):
        results.table_columns("nope", [row])
    with pytest.raises(ValueError, match="no rows"):
        results.table_columns("weak_scaling", [])
    with pytest.raises(ValueError, match="unknown raw array 'x'"):
        write(tmp_path / "y.h5", "weak_scaling", raw={"x": np.zeros((2, 2))})
    assert not list(tmp_path.iterdir())


def test_files_that_are_not_dumps_are_refused_with_one_line(tmp_path):
    assert results.check(tmp_path / "missing.h5") == [f"{tmp_path / 'missing.h5'}: no such file"]
    assert results.check(tmp_path) == [f"{tmp_path}: not a regular file"]
    fifo = tmp_path / "fifo.h5"
    os.mkfifo(fifo)
    assert results.check(fifo) == [f"{fifo}: not a regular file"]  # never opened, so never blocks
    junk = tmp_path / "junk.h5"
    junk.write_bytes(b"\0not hdf5" * 100)
    [line] = results.check(junk)
    assert line.startswith(f"{junk}: not a readable HDF5 file (")
    foreign = tmp_path / "foreign.h5"
    with h5py.File(foreign, "w") as f:
        f["data"] = np.arange(3)
    assert results.check(foreign) == [f"{foreign}: attribute 'kind': expected one of {', '.join(KINDS)}, "
                                      "got nothing (not an npddp benchmark dump)"]
    with pytest.raises(results.DumpError, match="got nothing"):
        results.read_table(foreign)


def test_version_1_dumps_are_refused_with_a_hint(tmp_path):
    path = tmp_path / "old.h5"
    with h5py.File(path, "w") as f:
        f.attrs.update({"kind": "ddp_breakdown", "schema_version": 1, "world_size": 2})
        f.create_group("rows")["model_size"] = np.array([b"tiny"])
    assert results.check(path) == [f"{path}: attribute 'schema_version': expected {results.SCHEMA_VERSION}, got 1 "
                                   "(the layout before flat tables: run the benchmark again)"]


def test_every_violation_is_one_line_naming_the_file_and_field(tmp_path):
    path = write(tmp_path / "d.h5", "allreduce_sweep")
    with h5py.File(path, "a") as f:
        f.attrs["world_size"] = "two"
        del f["table/wrong"]
        f["table/wrong"] = np.array([0.0, np.nan])
        f["table/wrong"].attrs.update({"unit": "elements", "doc": "x"})
        f["table/time_p90_s"][...] = [0.5, 0.5]  # below the median of 1.0
        f["table/time_max_s"].attrs["unit"] = "ms"
    lines = results.check(path)
    assert lines == [
        f"{path}: attribute 'world_size': expected an int >= 1, got 'two'",
        f"{path}: column 'time_max_s' attribute 'unit': expected 's', got 'ms'",
        f"{path}: column 'wrong': expected int64, got float64",
        f"{path}: columns 'time_median_s' and 'time_p90_s': expected time_median_s <= time_p90_s in every row, "
        "got 1.0 > 0.5 in row 0 (and 1 more row)",
    ]
    with pytest.raises(results.DumpError) as e:
        results.read_meta(path)
    assert str(e.value).splitlines() == lines


def test_the_benchmarks_page_lists_every_kinds_columns_in_order():
    text = BENCHMARKS_PAGE.read_text(encoding="utf-8")
    for name, kind in KINDS.items():
        listed = re.search(rf"^{name}: (.+)$", text, re.MULTILINE)
        assert listed, f"docs/guide/benchmarks.md has no line '{name}: <columns>'"
        assert listed.group(1).split(", ") == list(kind.names), name


def test_describe_prints_one_line_per_column():
    for name, kind in KINDS.items():
        lines = results.describe(name).splitlines()
        assert len(lines) == 2 + len(kind.columns)
        assert [line.split("`")[1] for line in lines[2:]] == list(kind.names)


OUTSIDE = """
import sys
import npddp
from npddp.results import check, read_meta, read_table
assert "pandas" not in sys.modules and "matplotlib" not in sys.modules, "imported at import time"
table = read_table(sys.argv[1])
print(read_meta(sys.argv[1])["kind"], list(table)[:2], check(sys.argv[1]))
try:
    import benchmarks
except ImportError:
    print("no benchmarks package here")
"""


@pytest.mark.parametrize("kind", ["allreduce_sweep", "ddp_breakdown"])
def test_a_dump_reads_from_a_directory_outside_the_checkout(tmp_path, kind):
    """``from npddp.results import read_table`` needs the installed package only, not the repository root."""
    import subprocess
    import sys

    path = write(tmp_path / "d.h5", kind)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-c", OUTSIDE, str(path)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    names = list(KINDS[kind].names)[:2]
    assert done.stdout.splitlines() == [f"{kind} {names} []", "no benchmarks package here"]


def test_the_installed_reader_is_the_benchmarks_reader():
    import npddp.results

    assert results.read_table is npddp.results.read_table and results.check is npddp.results.check
    assert npddp.results.KINDS is KINDS


def test_the_analysis_example_prints_a_dumps_table(tmp_path):
    """examples/analyse_dumps.py, given a dump, runs outside the checkout and prints its table."""
    import subprocess
    import sys

    path = write(tmp_path / "ar.h5", "allreduce_sweep")
    example = Path(__file__).resolve().parents[2] / "examples" / "analyse_dumps.py"
    done = subprocess.run([sys.executable, str(example), str(path)], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("ar.h5: allreduce_sweep on 1 rank(s)") and lines[1].startswith("2 rows; columns: collective")
    header = lines[2].split()
    assert header[0] == "bytes" and header[1:] == sorted({valid_row("allreduce_sweep", i)["backend"] for i in (0, 1)})
