"""Bad input across the public API, in one table: each case raises its error type with a message that
names the bad value and the valid range (or choices).

This is the index of the API's input checks; the module tests go deeper on their own
(``tests/comm/test_comm_errors.py`` runs every bad collective argument on every backend and
checks that no message was sent; ``tests/test_config.py`` every CLI flag). Serial: the
collectives run over ``MPI.COMM_SELF``.
"""

import json

import h5py
import numpy as np
import pytest

from npddp.checkpoint import fileformat
from npddp.comm import BACKENDS, create
from npddp.comm.checks import debug_from_env, timeout_from_env
from npddp.train.config import ConfigError
from npddp.train.cli.parser import parse_config
from npddp.train.cli.validate import check_config
from npddp.data import BatchLoader, DistributedSampler, iterate_batches
from npddp.parallel.averaging import PeriodicModelAverager
from npddp.parallel.hook_registry import build as build_hook
from npddp.parallel.ddp import DistributedDataParallel
from npddp.parallel.hooks import TopKState
from npddp.parallel.powersgd import PowerSGDState
from npddp.nn import mlp


def _self(backend="ring", **kw):
    from mpi4py import MPI
    return create(backend, MPI.COMM_SELF, **kw)


def _ddp(**kw):
    return DistributedDataParallel(mlp(3, [4], 2, seed=0), _self("mpi"), **kw)


def _cli(*argv, world=2):
    check_config(parse_config(list(argv)), world)


x = np.zeros(6, dtype=np.float32)
strided = np.zeros(12, dtype=np.float32)[::2]

# id, call (given the directory of bad files), error type, texts the message must contain
CASES = [
    # --- collectives (every backend: tests/comm/test_comm_errors.py)
    ("allreduce op", lambda d: _self().allreduce(x, "mean"), ValueError, ["'mean'", "sum, prod, max, min"]),
    ("allreduce dtype", lambda d: _self("naive").allreduce(np.zeros(3, np.complex64)), TypeError,
     ["complex64", "float16, float32, float64, int32, int64"]),
    ("allreduce strided", lambda d: _self("mpi").allreduce(strided), ValueError, ["C-contiguous", "strides (8,)"]),
    ("broadcast root", lambda d: _self().broadcast(x, root=1), ValueError, ["root=1", "valid ranks: 0..0"]),
    ("send tag", lambda d: _self().send(x, 0, tag=1 << 14), ValueError, ["tag=16384", "valid tags: 0..16383"]),
    ("debug allreduce op", lambda d: _self(debug=True).allreduce(x, "mean"), ValueError, ["'mean'", "sum, prod"]),
    # --- create() and the environment
    ("create backend", lambda d: create("nccl"), ValueError, ["'nccl'", ", ".join(BACKENDS)]),
    ("create debug", lambda d: create("ring", debug="yes"), TypeError, ["debug must be a bool", "str"]),
    ("create timeout 0", lambda d: _self(timeout=0), ValueError, ["timeout=0", "seconds > 0"]),
    ("create timeout nan", lambda d: _self(timeout=float("nan")), ValueError, ["timeout=nan", "seconds > 0"]),
    ("create timeout str", lambda d: _self(timeout="5"), TypeError, ["timeout must be a number of seconds", "str"]),
    ("create timeout bool", lambda d: _self(timeout=True), TypeError, ["bool"]),
    ("create mpi over tcp", lambda d: create("mpi", transport="tcp"), ValueError,
     ["backend 'mpi'", "transport 'mpi'", "'tcp'", ", ".join(BACKENDS[1:-3])]),
    ("create group clash", lambda d: _self("ring", transport="tcp"), ValueError, ["transport='tcp'", "mpi group"]),
    ("create transport", lambda d: _self("ring", transport="udp"), ValueError, ["'udp'", "mpi, tcp, auto"]),
    ("set timeout", lambda d: setattr(_self("naive"), "timeout", -1), ValueError, ["timeout=-1", "seconds > 0"]),
    ("NPDDP_TIMEOUT word", lambda d: timeout_from_env({"NPDDP_TIMEOUT": "soon"}), ValueError,
     ["NPDDP_TIMEOUT='soon'", "seconds > 0"]),
    ("NPDDP_TIMEOUT negative", lambda d: timeout_from_env({"NPDDP_TIMEOUT": "-3"}), ValueError,
     ["NPDDP_TIMEOUT=-3.0", "seconds > 0"]),
    ("NPDDP_DEBUG", lambda d: debug_from_env({"NPDDP_DEBUG": "maybe"}), ValueError,
     ["NPDDP_DEBUG='maybe'", "1/true/yes/on or 0/false/no/off"]),
    # --- sampler and loader
    ("sampler length", lambda d: DistributedSampler(-1, 2, 0), ValueError, ["dataset_len must be >= 0", "-1"]),
    ("sampler replicas", lambda d: DistributedSampler(10, 0, 0), ValueError, ["num_replicas must be >= 1", "0"]),
    ("sampler rank", lambda d: DistributedSampler(10, 2, 2), ValueError, ["0 <= rank < num_replicas=2", "got 2"]),
    ("sampler epoch", lambda d: DistributedSampler(10, 2, 0).set_epoch(-1), ValueError, ["epoch must be >= 0",
                                                                                          "-1"]),
    ("loader batch", lambda d: BatchLoader(np.zeros((4, 2)), np.zeros(4), DistributedSampler(4, 1, 0), 0),
     ValueError, ["batch_size must be >= 1", "got 0"]),
    ("loader index", lambda d: list(iterate_batches(np.zeros((4, 2)), np.zeros(4), [0, 9], 2)), ValueError,
     ["index 9", "[0, 4)"]),
    # --- DistributedDataParallel
    ("ddp sync", lambda d: _ddp(sync="async"), ValueError, ["'async'", "per_param", "overlap"]),
    ("ddp bucket", lambda d: _ddp(bucket_cap_mb=0), ValueError, ["bucket_cap_mb must be a positive number", "0"]),
    ("ddp comm hook name", lambda d: build_hook("zip", None), ValueError, ["'zip'", "fp16", "topk", "powersgd"]),
    ("ddp topk ratio", lambda d: TopKState(None, 1.5), ValueError, ["ratio must be in (0, 1]", "1.5"]),
    ("ddp powersgd rank", lambda d: PowerSGDState(None, rank=0), ValueError, ["rank must be an int >= 1", "0"]),
    ("ddp powersgd start", lambda d: PowerSGDState(None, start_iter=1), ValueError, ["start_iter must be > 1", "1"]),
    ("ddp averager period", lambda d: PeriodicModelAverager(None, period=-2), ValueError, ["period must be an int >= 1",
                                                                                        "-2"]),
    # --- checkpoint loader
    ("checkpoint missing", lambda d: fileformat.read(d / "nope.h5"), fileformat.CheckpointError,
     ["nope.h5", "does not exist"]),
    ("checkpoint junk", lambda d: fileformat.read(d / "junk.h5"), fileformat.CheckpointError,
     ["junk.h5", "not an HDF5 file"]),
    ("checkpoint foreign", lambda d: fileformat.read(d / "foreign.h5"), fileformat.CheckpointError,
     ["foreign.h5", "is not an npddp checkpoint", "'npddp-checkpoint'"]),
    ("checkpoint version", lambda d: fileformat.read(d / "future.h5"), fileformat.CheckpointError,
     ["future.h5", "schema version 999", "this npddp reads version"]),
    # --- the training CLI's additions (every flag: tests/test_config.py)
    ("--timeout 0", lambda d: _cli("--backend", "ring", "--timeout", "0"), ConfigError,
     ["--timeout must be a number of seconds > 0", "got 0.0"]),
    ("--timeout nan", lambda d: _cli("--backend", "naive", "--timeout", "nan"), ConfigError, ["got nan"]),
    ("--timeout word", lambda d: _cli("--timeout", "soon"), ConfigError, ["--timeout", "'soon'"]),
    ("--inject-fault form", lambda d: _cli("--inject-fault", "1-5"), ConfigError,
     ["--inject-fault '1-5'", "RANK:STEP", "e.g. 1:5"]),
    ("--inject-fault rank", lambda d: _cli("--inject-fault", "2:5"), ConfigError,
     ["rank 2 is out of range", "valid ranks: 0..1"]),
    ("--inject-fault negative rank", lambda d: _cli("--inject-fault=-1:5", world=3), ConfigError,
     ["rank -1", "valid ranks: 0..2"]),
    ("--inject-fault step", lambda d: _cli("--inject-fault", "0:0"), ConfigError,
     ["step 0 is out of range", "valid steps: 1 and up"]),
]


@pytest.fixture(scope="module")
def bad_files(tmp_path_factory):
    """A directory of files that are not usable checkpoints."""
    d = tmp_path_factory.mktemp("bad")
    (d / "junk.h5").write_bytes(b"not HDF5 at all")
    with h5py.File(d / "foreign.h5", "w") as f:
        f["weights"] = np.zeros(3)
    with h5py.File(d / "future.h5", "w") as f:
        f.attrs.update({"format": fileformat.FORMAT, "schema_version": 999, "config": json.dumps({})})
    return d


@pytest.mark.parametrize("call, kind, texts", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_raises_its_error_naming_the_value_and_the_valid_range(bad_files, call, kind, texts):
    with pytest.raises(kind) as info:
        call(bad_files)
    assert type(info.value) is kind, f"{type(info.value).__name__}: {info.value}"
    missing = [t for t in texts if t not in str(info.value)]
    assert not missing, f"{info.value!s} lacks {missing}"


def test_the_table_covers_every_area_of_the_public_api():
    areas = {"collectives": ("allreduce", "broadcast", "send", "debug"), "create": ("create", "NPDDP", "set timeout"),
             "data": ("sampler", "loader"), "ddp": ("ddp",), "checkpoint": ("checkpoint",), "cli": ("--",)}
    counts = {area: sum(c[0].startswith(prefixes) for c in CASES) for area, prefixes in areas.items()}
    assert min(counts.values()) >= 4 and sum(counts.values()) == len(CASES), counts
