"""Serial tests of npddp.util.runinfo: environment fields, attribute conversion, atomic HDF5 writes."""

import argparse
import dataclasses
import datetime
import os
import re
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

from npddp.util import atomicfile, runinfo

EXPECTED_KEYS = {"schema_version": int, "world_size": int, "mpi_library": str, "mpi_version": str,
                 "numpy_version": str, "mpi4py_version": str, "h5py_version": str, "npddp_version": str,
                 "python_version": str, "host": str, "cpu_model": str, "logical_cores": int,
                 "threads_per_rank": int, "time_utc": str}


def test_environment_has_every_field_with_its_type():
    env = runinfo.environment(world_size=3, backend=("mpi", "ring"))
    for key, kind in EXPECTED_KEYS.items():
        assert isinstance(env[key], kind), (key, env.get(key))
    assert env["schema_version"] == runinfo.SCHEMA_VERSION == 1
    assert env["world_size"] == 3 and env["backend"] == "mpi,ring"
    assert env["numpy_version"] == np.__version__ and env["h5py_version"] == h5py.__version__
    assert re.fullmatch(r"\d+\.\d+", env["mpi_version"]) and env["mpi_library"]
    assert "\n" not in env["mpi_library"]
    stamp = datetime.datetime.fromisoformat(env["time_utc"])
    assert stamp.utcoffset() == datetime.timedelta(0)
    assert abs((datetime.datetime.now(datetime.timezone.utc) - stamp).total_seconds()) < 60
    assert env["logical_cores"] == (os.cpu_count() or 0)
    assert re.fullmatch(r"\d+\.\d\d \d+\.\d\d \d+\.\d\d", env["load_average"]), env["load_average"]


def test_environment_values_are_storable_as_attributes(tmp_path):
    env = runinfo.environment(backend="mpi")
    with h5py.File(tmp_path / "env.h5", "w") as f:
        runinfo.write_attrs(f, env)
    with h5py.File(tmp_path / "env.h5", "r") as f:
        assert runinfo.read_attrs(f) == env


@pytest.mark.parametrize("bad", [0, -1, 2.0, True, "2"])
def test_environment_rejects_a_bad_world_size(bad):
    with pytest.raises(ValueError, match="world_size"):
        runinfo.environment(world_size=bad)


def test_environment_rejects_a_non_string_backend():
    with pytest.raises(TypeError, match="backend"):
        runinfo.environment(backend=["mpi", 3])


@pytest.mark.parametrize("env, expected", [({}, 0), ({"OMP_NUM_THREADS": "4"}, 4),
                                           ({"OPENBLAS_NUM_THREADS": "2"}, 2),
                                           ({"OMP_NUM_THREADS": "x", "MKL_NUM_THREADS": "3"}, 3)])
def test_threads_per_rank_reads_the_thread_variables(monkeypatch, env, expected):
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.delenv(var, raising=False)
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    assert runinfo.environment()["threads_per_rank"] == expected


def test_git_commit_present_in_a_checkout_and_absent_outside(monkeypatch, tmp_path):
    source = Path(runinfo.__file__).resolve().parent
    tracked = subprocess.run(["git", "-C", str(source), "ls-files", "--error-unmatch", "__init__.py"],
                             capture_output=True).returncode == 0
    env = runinfo.environment()
    if tracked:
        assert re.fullmatch(r"[0-9a-f]{40}", env["git_commit"])
    else:
        assert "git_commit" not in env
    monkeypatch.setattr(runinfo, "_PACKAGE_DIR", tmp_path)  # not a checkout: silently left out
    assert "git_commit" not in runinfo.environment()


def test_import_does_not_initialise_mpi():
    code = "import sys, npddp.util.runinfo; sys.exit(1 if 'mpi4py.MPI' in sys.modules else 0)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


# ----------------------------------------------------------------------------- attributes

@dataclasses.dataclass
class Inner:
    depth: int = 2
    name: str = "in"


@dataclasses.dataclass
class Config:
    lr: float = 0.1
    backend: str = "ring"
    checkpoint: str | None = None
    sizes: tuple = (1, 2, 3)
    inner: Inner = dataclasses.field(default_factory=Inner)


def _roundtrip(tmp_path, mapping):
    with h5py.File(tmp_path / "a.h5", "w") as f:
        runinfo.write_attrs(f, mapping)
    with h5py.File(tmp_path / "a.h5", "r") as f:
        return runinfo.read_attrs(f)


def test_write_attrs_converts_each_kind_of_value(tmp_path):
    got = _roundtrip(tmp_path, {
        "none": None, "flag": True, "int": 7, "float": 2.5, "str": "héllo", "bytes": b"raw",
        "path": Path("/x/y.h5"), "ints": [1, 2, 3], "floats": (0.5, 1.5), "strs": ["a", "bc"],
        "bools": [True, False], "empty": [], "mixed": [1, "a", None], "nested_list": [[1, 2], [3]],
        "array": np.arange(4, dtype=np.int32), "np_scalar": np.float32(1.25)})
    assert got == {"none": "None", "flag": True, "int": 7, "float": 2.5, "str": "héllo", "bytes": "raw",
                   "path": "/x/y.h5", "ints": [1, 2, 3], "floats": [0.5, 1.5], "strs": ["a", "bc"],
                   "bools": [True, False], "empty": [], "mixed": '[1, "a", null]',
                   "nested_list": "[[1, 2], [3]]", "array": [0, 1, 2, 3], "np_scalar": 1.25}


def test_write_attrs_stores_a_dataclass_as_json_and_one_attr_per_field(tmp_path):
    got = _roundtrip(tmp_path, {"config": Config(), "kind": "x"})
    assert got["config"] == ('{"lr": 0.1, "backend": "ring", "checkpoint": null, "sizes": [1, 2, 3], '
                             '"inner": {"depth": 2, "name": "in"}}')
    assert got["config.lr"] == 0.1 and got["config.backend"] == "ring" and got["config.checkpoint"] == "None"
    assert got["config.sizes"] == [1, 2, 3] and got["config.inner.depth"] == 2 and got["config.inner.name"] == "in"
    assert got["config.inner"] == '{"depth": 2, "name": "in"}' and got["kind"] == "x"


def test_write_attrs_takes_a_dataclass_or_namespace_as_the_mapping(tmp_path):
    assert _roundtrip(tmp_path, Inner(depth=5))["depth"] == 5
    assert _roundtrip(tmp_path, argparse.Namespace(a=1, b="two")) == {"a": 1, "b": "two"}


def test_write_attrs_rejects_what_it_cannot_store(tmp_path):
    with h5py.File(tmp_path / "a.h5", "w") as f:
        with pytest.raises(TypeError, match="'bad'.*object"):
            runinfo.write_attrs(f, {"bad": object()})
        with pytest.raises(TypeError, match="attribute names"):
            runinfo.write_attrs(f, {3: 1})
        with pytest.raises(TypeError, match="Mapping"):
            runinfo.write_attrs(f, [("a", 1)])


# ----------------------------------------------------------------------------- atomic writes

def _write(path, value):
    with atomicfile.atomic_h5(path) as f:
        f["x"] = np.full(3, value)


def _read(path):
    with h5py.File(path, "r") as f:
        return f["x"][()].tolist()


def test_atomic_h5_creates_then_replaces_leaving_no_temp_file(tmp_path):
    path = tmp_path / "run.h5"
    _write(path, 1)
    assert _read(path) == [1, 1, 1]
    _write(str(path), 2)  # str paths too
    assert _read(path) == [2, 2, 2]
    assert os.listdir(tmp_path) == ["run.h5"]
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask


@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt])
@pytest.mark.parametrize("existing", [True, False])
def test_atomic_h5_keeps_the_old_file_when_writing_fails(tmp_path, error, existing):
    path = tmp_path / "run.h5"
    if existing:
        _write(path, 1)
    before = path.read_bytes() if existing else None
    with pytest.raises(error):
        with atomicfile.atomic_h5(path) as f:
            f["x"] = np.full(3, 9)
            f.flush()
            assert (path.read_bytes() == before) if existing else not path.exists()  # nothing written yet
            raise error("mid-write")
    assert os.listdir(tmp_path) == (["run.h5"] if existing else [])
    if existing:
        assert path.read_bytes() == before and _read(path) == [1, 1, 1]


def test_atomic_h5_fsyncs_the_file_and_its_directory(tmp_path, monkeypatch):
    synced = []
    real = os.fsync

    def spy(fd):
        synced.append(os.path.realpath(f"/proc/self/fd/{fd}"))
        real(fd)
    monkeypatch.setattr(os, "fsync", spy)
    _write(tmp_path / "run.h5", 1)
    assert len(synced) == 2
    assert synced[0].endswith(".tmp") and Path(synced[0]).parent == tmp_path
    assert Path(synced[1]) == tmp_path


def test_atomic_h5_rejects_bad_paths(tmp_path):
    with pytest.raises(TypeError, match="path"):
        with atomicfile.atomic_h5(3):
            pass
    with pytest.raises(IsADirectoryError):
        with atomicfile.atomic_h5(tmp_path):
            pass
    with pytest.raises(FileNotFoundError):
        with atomicfile.atomic_h5(tmp_path / "missing" / "run.h5"):
            pass
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("version, expected", [
    ("MPICH Version:      5.0.2\nMPICH Release date: x\n", "MPICH Version: 5.0.2"),
    ("Open MPI v5.0.11, package: Open MPI user@localhost Distribution, ident: 5.0.11\x00",
     "Open MPI v5.0.11, package: Open MPI user@localhost Distribution, ident: 5.0.11"),
    ("Intel(R) MPI Library 2021.18 for Linux* OS\n\x00garbage", "Intel(R) MPI Library 2021.18 for Linux* OS"),
    ("", ""), ("\x00", ""),
])
def test_library_name_is_one_line_without_nul_and_storable(tmp_path, version, expected):
    name = runinfo.library_name(version)
    assert name == expected
    with h5py.File(tmp_path / "a.h5", "w") as f:   # Open MPI's trailing NUL made this raise
        runinfo.write_attrs(f, {"mpi_library": name})
        assert f.attrs["mpi_library"] == expected


def test_target_problem_tries_to_create_a_file_and_leaves_none(tmp_path):
    assert atomicfile.target_problem("--out x", tmp_path / "run.h5") is None
    assert os.listdir(tmp_path) == []
    problem = atomicfile.target_problem("--out x", "/proc/npddp-test.h5")
    if os.access("/proc", os.W_OK):                 # root: the permission bits say yes
        assert problem == "--out x: cannot create a file in directory '/proc': No such file or directory"
    else:
        assert problem == "--out x: directory '/proc' is not writable"


def test_a_write_into_a_missing_directory_says_why_without_repeating_the_path(tmp_path):
    """Callers print ``cannot write PATH: <strerror>``; the error once read ``cannot write X: cannot write X: ...``."""
    target = tmp_path / "missing" / "run.h5"
    with pytest.raises(FileNotFoundError) as info:
        with atomicfile.atomic_h5(target):
            pass
    assert info.value.strerror == f"directory {target.parent} does not exist"
    assert info.value.filename == str(target)
    with pytest.raises(IsADirectoryError) as info:
        with atomicfile.atomic_h5(tmp_path):
            pass
    assert str(tmp_path) not in info.value.strerror
