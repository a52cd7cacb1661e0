"""Checking and reading benchmark dumps (the HDF5 files ``benchmarks/*.py --out`` write): the installed half.

Every reader checks the file first (:func:`check`): a dump that breaks its kind's declaration
in :mod:`npddp.results.columns` (a missing attribute or column, a wrong type or unit, NaN or
non-positive times, ...) raises :class:`DumpError` with one line per violation, each naming the
file, the field and what was expected. Version 1 dumps (nested groups, before flat tables) are
refused that way. Writing lives with the benchmarks (:mod:`benchmarks.results`).
"""

from __future__ import annotations

import math
from pathlib import Path

import h5py
import numpy as np

from npddp.results.columns import FLOAT, INT, KINDS, STR, Column, Kind
from npddp.util import runinfo

#: Version of the benchmark-dump layout (1: nested per-backend groups and /rows, before flat tables).
SCHEMA_VERSION = 2
#: The root attribute ``format`` of every dump.
FORMAT = "npddp-benchmark"


class DumpError(ValueError):
    """A dump that breaks its declaration; the message has one line per violation."""


def kind_of(name: str) -> Kind:
    """The declaration of the dump kind ``name``; ValueError naming the valid kinds otherwise."""
    if name not in KINDS:
        raise ValueError(f"unknown dump kind {name!r}; valid: {', '.join(KINDS)}")
    return KINDS[name]


# ----------------------------------------------------------------------------- checking

def check(path) -> list[str]:
    """Every way the dump at ``path`` breaks its declaration, one line each ([] when it is sound)."""
    path = Path(path)
    if not path.exists():
        return [f"{path}: no such file"]
    if not path.is_file():
        return [f"{path}: not a regular file"]
    try:
        f = h5py.File(path, "r")
    except OSError as e:
        return [f"{path}: not a readable HDF5 file ({_first_line(e)})"]
    with f:
        try:
            return _Checker(path, f).run()
        except (OSError, KeyError, ValueError, TypeError, RuntimeError) as e:  # damaged internals
            return [f"{path}: damaged HDF5 content ({_first_line(e)})"]


def _first_line(e: BaseException) -> str:
    """The first line of an exception's message, or its type name."""
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


class _Checker:
    """Collects the violations of one open dump."""

    def __init__(self, path: Path, f):
        self.path, self.f, self.problems = path, f, []

    def bad(self, field: str, expected: str, got: str) -> None:
        """Record one violation."""
        self.problems.append(f"{self.path}: {field}: expected {expected}, got {got}")

    def run(self) -> list[str]:
        """Attributes, then columns, then the relations between them."""
        attrs = runinfo.read_attrs(self.f)
        kind = attrs.get("kind")
        if not isinstance(kind, str) or kind not in KINDS:
            got = "nothing (not an npddp benchmark dump)" if kind is None else repr(kind)
            self.bad("attribute 'kind'", "one of " + ", ".join(KINDS), got)
            return self.problems
        version = attrs.get("schema_version")
        if version != SCHEMA_VERSION or isinstance(version, bool):
            hint = " (the layout before flat tables: run the benchmark again)" if version == 1 else ""
            self.bad("attribute 'schema_version'", str(SCHEMA_VERSION), repr(version) + hint)
            return self.problems
        spec = KINDS[kind]
        for c in spec.attrs:
            self.attribute(c, attrs)
        table = self.f.get("table")
        if table is None or not hasattr(table, "keys"):
            self.bad("group '/table'", "the table group (one 1-D dataset per column)", "nothing")
            return self.problems
        data = {c.name: self.column(table, c) for c in spec.columns}
        data = {k: v for k, v in data.items() if v is not None}
        rows = self.lengths(table, spec, data)
        if rows is None:
            return self.problems
        for group in spec.ordered:
            self.ordered(group, data)
        size = attrs.get("world_size")
        if "world_size" in data and isinstance(size, int) and not isinstance(size, bool):
            over = data["world_size"] > size if spec.world_size == "at_most" else data["world_size"] != size
            if over.any():
                relation = "at most" if spec.world_size == "at_most" else "equal to"
                self.bad("column 'world_size'", f"values {relation} the world_size attribute ({size})",
                         f"{_show(data['world_size'][over][0])} in {_rows(over)}")
        for r in spec.raw:
            self.raw(r, rows)
        return self.problems

    def attribute(self, c: Column, attrs: dict) -> None:
        """Check one required root attribute."""
        field = f"attribute '{c.name}'"
        if c.name not in attrs:
            self.bad(field, c.expectation(), "nothing")
            return
        value = attrs[c.name]
        if c.type == STR:
            ok = isinstance(value, str) and value != "" and (not c.choices or value in c.choices)
        elif c.type == INT:
            ok = isinstance(value, int) and not isinstance(value, bool) and (c.low is None or value >= c.low)
        else:
            ok = (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
                  and (c.low is None or value >= c.low) and (not c.positive or value > 0))
        if not ok:
            self.bad(field, c.expectation(), repr(value))

    def column(self, table, c: Column):
        """Check one column's dataset, attributes and values; its values (decoded), or None if unusable."""
        field = f"column '{c.name}'"
        ds = table.get(c.name)
        want = {STR: "UTF-8 strings", INT: "int64", FLOAT: "float64"}[c.type]
        if ds is None or not hasattr(ds, "dtype"):
            self.bad(field, f"a 1-D dataset of {want}", "nothing")
            return None
        if ds.ndim != 1:
            self.bad(field, "a 1-D dataset", f"shape {ds.shape}")
            return None
        for key, expected in (("unit", c.unit), ("doc", None)):
            got = ds.attrs.get(key)
            got = got.decode("utf-8", "replace") if isinstance(got, bytes) else got
            if not isinstance(got, str) or (expected is not None and got != expected) or (key == "doc" and not got):
                self.bad(f"{field} attribute '{key}'", repr(expected) if expected is not None else "a description",
                         repr(got) if got is not None else "nothing")
        is_str = h5py.check_string_dtype(ds.dtype) is not None
        kind_ok = is_str if c.type == STR else ds.dtype.kind in ("iu" if c.type == INT else "f")
        if not kind_ok:
            self.bad(field, want, "text" if is_str else str(ds.dtype))
            return None
        if c.type == STR:
            try:
                values = np.array(ds.asstr()[()], dtype=object).reshape(-1)
            except UnicodeDecodeError:
                self.bad(field, "UTF-8 text", "bytes that are not UTF-8")
                return None
            wrong = np.array([v == "" or (bool(c.choices) and v not in c.choices) for v in values], dtype=bool)
        else:
            values = ds[()]
            wrong = self.numbers_wrong(c, values)
        if wrong.any():
            self.bad(field, c.expectation(), f"{_show(values[wrong][0])} in {_rows(wrong)}")
        return values

    @staticmethod
    def numbers_wrong(c: Column, values: np.ndarray) -> np.ndarray:
        """Mask of the values that break the column's range (NaN counts unless allowed)."""
        v = values.astype(np.float64)
        nan = np.isnan(v)
        wrong = np.isinf(v) | (nan & (not c.nan_ok))
        with np.errstate(invalid="ignore"):
            if c.low is not None:
                wrong |= v < c.low
            if c.positive:
                wrong |= v <= 0
        return wrong

    def lengths(self, table, spec: Kind, data: dict):
        """The row count all columns (declared and extra) share; None (after reporting) if they do not."""
        if not data:
            return None
        before = len(self.problems)
        first = next(iter(data))
        rows = len(data[first])
        for name, values in data.items():
            if len(values) != rows:
                self.bad(f"column '{name}'", f"{rows} rows like column '{first}'", f"{len(values)}")
        for name in table:
            ds = table[name]
            if name not in data and name not in spec.names and hasattr(ds, "shape") and ds.shape != (rows,):
                self.bad(f"column '{name}'", f"a 1-D dataset of {rows} rows like column '{first}'",
                         f"shape {ds.shape}")
        if rows == 0:
            self.bad("group '/table'", "at least one row", "0")
        return None if len(self.problems) > before else rows

    def ordered(self, group: tuple, data: dict) -> None:
        """Report the first adjacent pair of ``group`` that decreases in some row."""
        if not all(name in data for name in group):
            return
        for left, right in zip(group[:-1], group[1:]):
            with np.errstate(invalid="ignore"):
                wrong = data[left] > data[right]
            if wrong.any():
                i = int(np.flatnonzero(wrong)[0])
                self.bad(f"columns '{left}' and '{right}'", f"{left} <= {right} in every row",
                         f"{_show(data[left][i])} > {_show(data[right][i])} in {_rows(wrong)}")
                return

    def raw(self, r, rows: int) -> None:
        """Check an optional raw array's shape, type and unit."""
        ds = self.f.get(f"raw/{r.name}")
        if ds is None:
            return
        field = f"dataset '/raw/{r.name}'"
        if not hasattr(ds, "dtype") or ds.ndim != 2 or ds.dtype.kind != "f" or ds.shape[r.row_axis] != rows:
            axis = "first" if r.row_axis == 0 else "second"
            got = f"shape {ds.shape}, {ds.dtype}" if hasattr(ds, "dtype") else "a group"
            self.bad(field, f"a 2-D float array with the table's {rows} rows along its {axis} axis", got)
        elif ds.attrs.get("unit") != r.unit:
            self.bad(f"{field} attribute 'unit'", repr(r.unit), repr(ds.attrs.get("unit")))


def _show(value) -> str:
    """repr of a value, NumPy scalars as the Python value they hold."""
    return repr(value.item() if isinstance(value, np.generic) else value)


def _rows(mask: np.ndarray) -> str:
    """'row 3' or 'row 3 (and 4 more rows)' for the True entries of ``mask``."""
    bad = np.flatnonzero(mask)
    more = f" (and {bad.size - 1} more row{'s' if bad.size > 2 else ''})" if bad.size > 1 else ""
    return f"row {int(bad[0])}{more}"


# ----------------------------------------------------------------------------- reading

def _open_checked(path):
    """An open h5py.File of a dump that passed :func:`check`; DumpError otherwise."""
    problems = check(path)
    if problems:
        raise DumpError("\n".join(problems))
    return h5py.File(path, "r")


def read_table(path):
    """The dump's table: a pandas DataFrame (a dict of 1-D arrays without pandas), columns in order.

    Text columns hold ``str``, ints are int64, floats float64. DumpError if the dump is unsound.
    """
    with _open_checked(path) as f:
        g = f["table"]
        kind = KINDS[runinfo.read_attrs(f)["kind"]]
        names = list(kind.names) + [n for n in g if n not in kind.names]
        data = {}
        for name in names:
            ds = g[name]
            if h5py.check_string_dtype(ds.dtype) is not None:
                data[name] = np.array(ds.asstr()[()], dtype=object)
            else:
                data[name] = ds[()]
    try:
        import pandas as pd
    except ImportError:
        return data
    return pd.DataFrame(data)


def read_meta(path) -> dict:
    """The dump's root attributes (kind, world_size, environment, config, ...) as plain values."""
    with _open_checked(path) as f:
        return runinfo.read_attrs(f)


def read_raw(path, name: str) -> np.ndarray:
    """The raw array ``/raw/<name>`` of the dump; KeyError if it has none."""
    with _open_checked(path) as f:
        if f"raw/{name}" not in f:
            raise KeyError(f"{path}: no raw array {name!r}")
        return f[f"raw/{name}"][()]


# ----------------------------------------------------------------------------- documentation

def describe(kind: str) -> str:
    """A Markdown table of the kind's columns: name, type, unit, meaning."""
    spec = kind_of(kind)
    lines = ["| column | type | unit | meaning |", "|---|---|---|---|"]
    lines += [f"| `{c.name}` | {c.type} | {c.unit or '-'} | {c.doc} |" for c in spec.columns]
    return "\n".join(lines)
