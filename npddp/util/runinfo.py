"""Run metadata for HDF5 files: the environment as flat attributes (crash-safe writes: :mod:`npddp.util.atomicfile`).

* :func:`environment` returns the run's environment as a flat dict of HDF5-friendly
  scalars and strings (schema version, world size, backend, MPI library, package versions,
  host, CPU, threads per rank, UTC time, load average when written, git commit when known).
* :func:`write_attrs` stores a mapping (or a dataclass, or an ``argparse.Namespace``) as
  attributes; :func:`read_attrs` reads them back as plain Python values.

Importing this module does not import mpi4py (and so does not initialise MPI).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from npddp.util import env

#: Version of the attribute and dataset layout of the metrics and checkpoint files (benchmark dumps
#: have their own: benchmarks.results.SCHEMA_VERSION).
SCHEMA_VERSION = 1

_PACKAGE_DIR = Path(__file__).resolve().parent


def environment(world_size: int | None = None, backend: str | Sequence[str] | None = None,
                mpi: bool = True) -> dict:
    """The run's environment as a flat dict of str/int values, ready for :func:`write_attrs`.

    ``world_size`` defaults to ``MPI.COMM_WORLD``'s size (1 when MPI is not initialised);
    ``backend`` (a name or a sequence of names) is stored comma-joined. Keys whose value
    cannot be found (``git_commit`` outside a git checkout) are left out. ``mpi=False`` (a job
    over TCP) leaves MPI out unless mpi4py.MPI is already loaded, so nothing initialises it.
    """
    info: dict = {"schema_version": SCHEMA_VERSION}
    mpi, mpi_world_size = _mpi_info() if mpi or "mpi4py.MPI" in sys.modules else ({}, 1)
    if world_size is None:
        world_size = mpi_world_size
    if isinstance(world_size, bool) or not isinstance(world_size, (int, np.integer)) or world_size < 1:
        raise ValueError(f"world_size must be a positive int, got {world_size!r}")
    info["world_size"] = int(world_size)
    if backend is not None:
        names = [backend] if isinstance(backend, str) else list(backend)
        if not all(isinstance(n, str) for n in names):
            raise TypeError(f"backend must be a str or a sequence of str, got {backend!r}")
        info["backend"] = ",".join(names)
    info.update(mpi)
    info.update(_versions())
    info["python_version"] = platform.python_version()
    info["host"] = socket.gethostname()
    info["cpu_model"] = _cpu_model()
    info["logical_cores"] = os.cpu_count() or 0
    info["threads_per_rank"] = _threads_per_rank()
    info["time_utc"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    load = _load_average()
    if load:
        info["load_average"] = load
    commit = _git_commit()
    if commit:
        info["git_commit"] = commit
    return info


def _mpi_info() -> tuple[dict, int]:
    """({mpi_library: first line of its version string, mpi_version}, COMM_WORLD size or 1)."""
    try:
        from mpi4py import MPI
    except ImportError:
        return {}, 1
    info = {"mpi_library": library_name(MPI.Get_library_version()),
            "mpi_version": "{}.{}".format(*MPI.Get_version())}
    return info, (MPI.COMM_WORLD.Get_size() if env.mpi_live() is not None else 1)


def library_name(version: str) -> str:
    """The first line of an MPI library's version string, white space folded and any NUL dropped (Open MPI ends it with one)."""
    text = version.split("\x00", 1)[0]
    lines = text.splitlines()
    return " ".join(lines[0].split()) if lines else ""


def library_short(name: str) -> str:
    """A library name for one-line headers: up to its first comma (Open MPI's packager and build date go)."""
    return name.split(",", 1)[0]


def _versions() -> dict:
    """Versions of numpy, mpi4py, h5py and npddp ("" for one that is not installed)."""
    out = {"numpy_version": np.__version__}
    for name in ("mpi4py", "h5py", "npddp"):
        try:
            out[f"{name}_version"] = str(__import__(name).__version__)
        except (ImportError, AttributeError):
            out[f"{name}_version"] = ""
    return out


def _cpu_model() -> str:
    """'model name' from /proc/cpuinfo, else ``platform.processor()``, else ""."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, sep, value = line.partition(":")
                if sep and key.strip() == "model name":
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or ""


def _load_average() -> str:
    """The 1-, 5- and 15-minute load averages as "a b c" ("" where the OS does not tell)."""
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except (AttributeError, OSError):
        return ""


def _threads_per_rank() -> int:
    """The first of OMP/OPENBLAS/MKL_NUM_THREADS that is a positive int; 0 when none is set."""
    setting = env.thread_setting()
    return 0 if setting is None else setting[0]


def _git_commit() -> str:
    """HEAD of the git checkout that tracks this package's source; "" when there is none."""
    def git(*args: str) -> str:
        done = subprocess.run(["git", "-C", str(_PACKAGE_DIR), *args], capture_output=True,
                              text=True, timeout=10, check=True)
        return done.stdout.strip()
    try:
        git("ls-files", "--error-unmatch", "__init__.py")  # the package is tracked, not just nested
        return git("rev-parse", "HEAD")
    except (OSError, subprocess.SubprocessError):
        return ""


# ----------------------------------------------------------------------------- attributes

def write_attrs(h5obj, mapping, prefix: str = "") -> None:
    """Store ``mapping`` as attributes of ``h5obj`` (a File, Group or Dataset).

    ``mapping`` is a Mapping, a dataclass instance or an ``argparse.Namespace``. Values:
    None -> "None"; str, bytes, bool, int, float and NumPy scalars as they are; Path -> str;
    a sequence of numbers, bools or strings -> a 1-D array; any other sequence -> a JSON
    string; a nested mapping or dataclass under key ``k`` -> a JSON string at ``k`` plus
    one attribute ``k.<field>`` per field (recursively). Anything else is a TypeError.
    """
    for key, value in _items(mapping, "mapping"):
        if not isinstance(key, str) or not key:
            raise TypeError(f"attribute names must be non-empty str, got {key!r}")
        name = prefix + key
        if _is_record(value):
            h5obj.attrs[name] = json.dumps(_jsonable(value))
            write_attrs(h5obj, value, prefix=name + ".")
        else:
            h5obj.attrs[name] = _attr_value(name, value)


def read_attrs(h5obj) -> dict:
    """Attributes of ``h5obj`` as plain Python values (str, int, float, bool, list)."""
    return {key: _plain(value) for key, value in h5obj.attrs.items()}


def _is_record(value) -> bool:
    """True for values stored as JSON plus one attribute per field."""
    return (isinstance(value, (Mapping, argparse.Namespace))
            or (dataclasses.is_dataclass(value) and not isinstance(value, type)))


def _items(record, what: str):
    """(key, value) pairs of a Mapping, dataclass instance or Namespace."""
    if isinstance(record, Mapping):
        return list(record.items())
    if isinstance(record, argparse.Namespace):
        return list(vars(record).items())
    if dataclasses.is_dataclass(record) and not isinstance(record, type):
        return [(f.name, getattr(record, f.name)) for f in dataclasses.fields(record)]
    raise TypeError(f"{what} must be a Mapping, a dataclass instance or an argparse.Namespace, "
                    f"got {type(record).__name__}")


def _attr_value(name: str, value):
    """Convert one value to something h5py stores as an attribute."""
    if value is None:
        return "None"
    if isinstance(value, (str, bytes, bool, int, float, np.generic)):
        return value
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, np.ndarray) and value.dtype != object:
        return value
    if isinstance(value, (Sequence, np.ndarray, set, frozenset)):
        items = sorted(value) if isinstance(value, (set, frozenset)) else list(value)
        if all(isinstance(v, str) for v in items):
            return np.array(items, dtype=_string_dtype())
        if all(isinstance(v, (bool, np.bool_)) for v in items):
            return np.array(items, dtype=bool)
        if all(isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool)
               for v in items):
            return np.array(items) if items else np.zeros(0)
        return json.dumps(_jsonable(items))
    raise TypeError(f"attribute {name!r}: cannot store a {type(value).__name__} "
                    "(use str, numbers, bools, sequences of them, mappings or dataclasses)")


def _string_dtype():
    """h5py's variable-length UTF-8 string dtype."""
    import h5py
    return h5py.string_dtype()


def _jsonable(value):
    """A JSON-serialisable copy of ``value`` (records become dicts, arrays lists)."""
    if _is_record(value):
        return {str(k): _jsonable(v) for k, v in _items(value, "value")}
    if isinstance(value, (str, bool, int, float)) or value is None:
        return value
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, (Sequence, np.ndarray, set, frozenset)):
        return [_jsonable(v) for v in (sorted(value) if isinstance(value, (set, frozenset)) else value)]
    raise TypeError(f"cannot store a {type(value).__name__} in a JSON attribute")


def _plain(value):
    """An h5py attribute value as a plain Python value."""
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    if isinstance(value, np.ndarray):
        return [_plain(v) for v in value.tolist()]
    if isinstance(value, np.generic):
        return value.item()
    return value
