"""Training checkpoints: written atomically by rank 0 with checksums, verified and validated on read.

File layout (HDF5, written through :func:`npddp.util.atomicfile.atomic_h5`)::

    /                 attrs: format="npddp-checkpoint", schema_version, epochs_done (complete
                      epochs), batches_done (batches of the epoch in progress), step (optimizer
                      steps in all), world_size, backend, per_rank, optimizer, sampler_seed,
                      input_shape and num_classes (what the model takes), config (JSON) and
                      config.<field>, the environment (mpi_library, host, ...), attrs_crc32
    /params/<name>    each parameter, in named_parameters() order (group attr ``order``);
                      shape (world_size, *shape) when per_rank (local SGD: replicas differ)
    /optimizer/<key>  the optimizer's state_dict(): step, lr, hyperparameters as scalars,
                      buffers such as exp_avg.3 (with a leading rank axis when per_rank)
    /rng/dropout      (world_size, n_dropout, 6) uint64: each rank's PCG64 dropout streams
                      (present only when the model has dropout)
    /ddp/<name>       (world_size, ...): each rank's comm hook state (top-k or PowerSGD error
                      feedback ``error.<bucket>``, PowerSGD's ``p.<bucket>``, ``q.<bucket>``, step, seeds)
    /progress/totals  running sums of the epoch in progress (attr ``columns``)

Integrity: the file starts with a 512-byte user block ``npddp-checkpoint crc32=XXXXXXXX
size=N`` holding the CRC-32 and length of everything after it (HDF5 skips the block); every
dataset also carries ``crc32`` (of its dtype, shape and bytes) and the root ``attrs_crc32``
covers every other attribute, so a damaged dataset is named. :func:`read` verifies all of
them and refuses a file that fails, lacks them, or holds a position or counter out of range
(:class:`CheckpointError`, one line naming the file and what is wrong).

The data order needs no state: the sampler shuffles with ``sampler_seed + epoch``. Gathering and
restoring state over the communicator lives in :mod:`npddp.checkpoint.state`;
:func:`npddp.load_model` rebuilds the trained model for use after training.
"""

from __future__ import annotations

import json
import os
import zlib
from dataclasses import dataclass, field

import numpy as np

from npddp.checkpoint.shardread import ShardError, assemble
from npddp.util.atomicfile import atomic_h5
from npddp.util.runinfo import SCHEMA_VERSION, read_attrs, write_attrs

FORMAT = "npddp-checkpoint"
_CRC, _ATTRS_CRC = "crc32", "attrs_crc32"
_BLOCK = 512                                   # user block: the whole-file checksum
_HEADER = b"npddp-checkpoint crc32="


class CheckpointError(ValueError):
    """A checkpoint that is missing, unreadable, damaged, foreign, or does not fit this run."""


@dataclass
class Checkpoint:
    """Everything a checkpoint file holds, in memory (rank 0 only)."""

    epochs_done: int
    batches_done: int
    step: int
    world_size: int
    backend: str
    config: dict
    params: dict              # name -> array, (world_size, *shape) when per_rank
    optimizer: dict           # state_dict() key -> array or scalar (buffers rank-major when per_rank)
    optimizer_name: str
    per_rank: bool = False
    dropout_rng: np.ndarray | None = None          # (world_size, n_dropout, 6) uint64
    hook_state: dict = field(default_factory=dict)  # name -> (world_size, ...) comm hook state
    totals: np.ndarray = field(default_factory=lambda: np.zeros(0))
    totals_columns: tuple = ()
    attrs: dict = field(default_factory=dict)      # environment, written as attributes
    input_shape: tuple = ()                        # one input row, as the model takes it
    num_classes: int = 0


# ----------------------------------------------------------------------------- checksums

def _crc_of(array: np.ndarray) -> int:
    """CRC-32 of an array's dtype, shape and bytes."""
    a = np.ascontiguousarray(array)
    head = f"{a.dtype.str}{a.shape}".encode()
    return zlib.crc32(memoryview(a).cast("B"), zlib.crc32(head)) if a.size else zlib.crc32(head)


def _attrs_text(f) -> bytes:
    """Every attribute in the file but the checksums, as canonical JSON."""
    import h5py

    table = {"/": {k: v for k, v in read_attrs(f).items() if k not in (_CRC, _ATTRS_CRC)}}

    def visit(name, obj):
        attrs = {k: v for k, v in read_attrs(obj).items() if k != _CRC}
        kind = "dataset" if isinstance(obj, h5py.Dataset) else "group"
        table[f"{kind}:{name}"] = attrs
    f.visititems(visit)
    return json.dumps(table, sort_keys=True, default=str).encode()


def _seal(f) -> None:
    """Add the checksums to a file that is otherwise complete."""
    import h5py

    def visit(_, obj):
        if isinstance(obj, h5py.Dataset):
            obj.attrs[_CRC] = np.int64(_crc_of(obj[()]))
    f.visititems(visit)
    f.attrs[_ATTRS_CRC] = np.int64(zlib.crc32(_attrs_text(f)))


def _with_header(image: bytes) -> bytes:
    """The file: a user block naming the CRC-32 and size of ``image``, then ``image``."""
    head = _HEADER + f"{zlib.crc32(image):08x} size={len(image)}\n".encode()
    return head.ljust(_BLOCK, b"\0") + image


def _file_checksum(path: str) -> str | None:
    """None when the file matches its user block's checksum, else what is wrong."""
    with open(path, "rb") as f:
        head = f.read(_BLOCK)
        if not head.startswith(_HEADER):
            return "carries no checksums (written by an older npddp?), so it cannot be verified"
        try:
            fields = dict(part.split("=") for part in head[len(b"npddp-checkpoint "):].split(b"\n")[0]
                          .decode().split())
            want, size = int(fields["crc32"], 16), int(fields["size"])
        except (ValueError, KeyError, UnicodeDecodeError):
            return "is damaged: its checksum block is unreadable"
        crc, n = 0, 0
        while chunk := f.read(1 << 24):
            crc, n = zlib.crc32(chunk, crc), n + len(chunk)
    if n != size:
        return f"is damaged or truncated: {n} bytes of data where {size} were written"
    if crc != want:
        return "is damaged: the file's checksum does not match its contents"
    return None


def _verify(f, path: str) -> None:
    """CheckpointError unless every dataset and the attributes match their checksums."""
    import h5py

    if _ATTRS_CRC not in f.attrs:
        raise CheckpointError(f"checkpoint {path!r} carries no checksums (written by an older npddp?), "
                              "so it cannot be verified")
    bad: list[str] = []

    def visit(name, obj):
        if isinstance(obj, h5py.Dataset):
            want = obj.attrs.get(_CRC)
            if want is None or int(want) != _crc_of(obj[()]):
                bad.append("/" + name)
    f.visititems(visit)
    if bad:
        raise CheckpointError(f"checkpoint {path!r} is damaged: checksum mismatch in {', '.join(bad[:5])}"
                              + (f" and {len(bad) - 5} more" if len(bad) > 5 else ""))
    if int(f.attrs[_ATTRS_CRC]) != zlib.crc32(_attrs_text(f)):
        raise CheckpointError(f"checkpoint {path!r} is damaged: its attributes (position, config) "
                              "do not match their checksum")


# ----------------------------------------------------------------------------- file I/O (rank 0)

def write(path, ckpt: Checkpoint, extra=None) -> None:
    """Write ``ckpt`` to ``path`` atomically, with checksums: a crash leaves the previous file or this one.

    OSError (disk full, I/O error) leaves the previous file untouched and no temporary file.
    ``extra(f)``, when given, adds to the open file before it is sealed (a sharded checkpoint's index).
    """
    with atomic_h5(path, finish=_with_header, userblock_size=_BLOCK) as f:
        write_attrs(f, ckpt.attrs)
        write_attrs(f, {"config": ckpt.config})
        f.attrs.update({"format": FORMAT, "schema_version": SCHEMA_VERSION,
                        "epochs_done": ckpt.epochs_done, "batches_done": ckpt.batches_done,
                        "step": ckpt.step, "world_size": ckpt.world_size, "backend": ckpt.backend,
                        "per_rank": ckpt.per_rank, "optimizer": ckpt.optimizer_name,
                        "sampler_seed": int(ckpt.config.get("seed", 0)),
                        "input_shape": np.array(ckpt.input_shape, dtype=np.int64),
                        "num_classes": int(ckpt.num_classes)})
        g = f.create_group("params")
        g.attrs["order"] = json.dumps(list(ckpt.params))
        for name, value in ckpt.params.items():
            g.create_dataset(name, data=value)
        g = f.create_group("optimizer")
        for key, value in ckpt.optimizer.items():
            g.create_dataset(key, data=value)
        rng = f.create_group("rng")
        if ckpt.dropout_rng is not None:
            rng.create_dataset("dropout", data=ckpt.dropout_rng.astype(np.uint64))
        g = f.create_group("ddp")
        for name, value in ckpt.hook_state.items():
            g.create_dataset(name, data=value)
        g = f.create_group("progress")
        g.create_dataset("totals", data=np.asarray(ckpt.totals, dtype=np.float64))
        g["totals"].attrs["columns"] = json.dumps(list(ckpt.totals_columns))
        if extra is not None:
            extra(f)
        _seal(f)


def read(path) -> Checkpoint:
    """Load a checkpoint file, verified and validated; CheckpointError (naming the file) when it is not usable."""
    import h5py

    from npddp.data.arrays import DataFileError, check_regular_file

    path = os.fspath(path)
    try:
        check_regular_file(path, "checkpoint")
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint {path!r} does not exist") from None
    except DataFileError as exc:
        raise CheckpointError(str(exc)) from None
    try:
        whole = _file_checksum(path)
        f = h5py.File(path, "r")
    except OSError as exc:
        raise CheckpointError(f"cannot read checkpoint {path!r}: not an HDF5 file, or damaged ({exc})") \
            from None
    with f:
        try:
            attrs = read_attrs(f)
        except (OSError, RuntimeError, ValueError) as exc:
            raise CheckpointError(f"checkpoint {path!r} is damaged: {exc}") from None
        if attrs.get("format") != FORMAT:
            found = f"format {attrs['format']!r}" if "format" in attrs else "no 'format' attribute"
            raise CheckpointError(f"{path!r} is not an npddp checkpoint ({found}; expected {FORMAT!r})")
        if attrs.get("schema_version") != SCHEMA_VERSION:
            raise CheckpointError(f"checkpoint {path!r} has schema version {attrs.get('schema_version')!r}; "
                                  f"this npddp reads version {SCHEMA_VERSION}")
        try:
            _verify(f, path)
            if whole:
                raise CheckpointError(f"checkpoint {path!r} {whole}")
            ckpt = _from_file(f, attrs)
            if attrs.get("sharded"):          # --zero: the index of shard files (npddp.checkpoint.shardwrite)
                try:
                    ckpt = assemble(path, f, ckpt)
                except ShardError as exc:
                    raise CheckpointError(str(exc)) from None
        except CheckpointError:
            raise
        except (KeyError, ValueError, TypeError, OSError, RuntimeError) as exc:
            raise CheckpointError(f"checkpoint {path!r} is damaged or incomplete: {exc}") from None
    problem = validate(ckpt)
    if problem:
        raise CheckpointError(f"checkpoint {path!r}: {problem}")
    return ckpt


def _from_file(f, attrs: dict) -> Checkpoint:
    """The Checkpoint stored in an open file whose format is already checked."""
    order = json.loads(f["params"].attrs["order"])
    params = {name: f["params"][name][()] for name in order}
    optimizer = {}
    for key, ds in f["optimizer"].items():
        value = ds[()]
        optimizer[key] = value.item() if isinstance(value, np.generic) and key != "step" else value
    dropout = f["rng"]["dropout"][()] if "dropout" in f["rng"] else None
    hook_state = {name: f["ddp"][name][()] for name in f["ddp"]}
    totals = f["progress"]["totals"]
    env = {k: v for k, v in attrs.items() if not k.startswith("config")}
    return Checkpoint(epochs_done=attrs["epochs_done"], batches_done=attrs["batches_done"],
                      step=attrs["step"], world_size=attrs["world_size"],
                      backend=str(attrs["backend"]), config=json.loads(attrs["config"]),
                      params=params, optimizer=optimizer, optimizer_name=str(attrs["optimizer"]),
                      per_rank=attrs["per_rank"], dropout_rng=dropout, hook_state=hook_state,
                      totals=totals[()], totals_columns=tuple(json.loads(totals.attrs["columns"])),
                      attrs=env, input_shape=tuple(attrs.get("input_shape") or ()),
                      num_classes=attrs.get("num_classes", 0))


def _is_int(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def validate(ckpt: Checkpoint) -> str | None:
    """What is out of range in ``ckpt`` (positions, counters, shapes), or None."""
    for name, low in (("epochs_done", 0), ("batches_done", 0), ("step", 0), ("world_size", 1),
                      ("num_classes", 0)):
        value = getattr(ckpt, name)
        if not _is_int(value) or value < low:
            return f"{name} is {value!r}; valid: an integer >= {low}"
    if ckpt.step < ckpt.epochs_done + ckpt.batches_done:
        return (f"step {ckpt.step} is smaller than epochs_done + batches_done = "
                f"{ckpt.epochs_done + ckpt.batches_done}; every batch is one step")
    if not isinstance(ckpt.per_rank, (bool, np.bool_)):
        return f"per_rank is {ckpt.per_rank!r}; valid: true or false"
    if not isinstance(ckpt.config, dict):
        return f"config is {type(ckpt.config).__name__}, not a mapping of settings"
    opt_step = ckpt.optimizer.get("step")
    if opt_step is None or np.ndim(opt_step) != 0 or not _is_int(np.asarray(opt_step)[()]) \
            or int(opt_step) != ckpt.step:
        shown = np.asarray(opt_step).tolist() if opt_step is not None else None
        return f"optimizer step is {shown!r}; valid: the integer {ckpt.step} (one per training step)"
    if not all(_is_int(v) and v >= 1 for v in ckpt.input_shape):
        return f"input_shape is {ckpt.input_shape!r}; valid: positive integers"
    world = ckpt.world_size
    if ckpt.per_rank and any(np.ndim(p) == 0 or np.shape(p)[0] != world for p in ckpt.params.values()):
        return f"per-rank parameters must have a leading axis of world_size {world}"
    if ckpt.dropout_rng is not None and (ckpt.dropout_rng.ndim != 3 or ckpt.dropout_rng.shape[0] != world
                                         or ckpt.dropout_rng.shape[2] != 6):
        return f"rng/dropout has shape {ckpt.dropout_rng.shape}; valid: ({world}, layers, 6)"
    for name, value in ckpt.hook_state.items():
        if np.ndim(value) < 2 or np.shape(value)[0] != world:
            return f"ddp/{name} has shape {np.shape(value)}; valid: ({world}, ...)"
    if np.ndim(ckpt.totals) != 1 or len(ckpt.totals) != len(ckpt.totals_columns):
        return f"progress/totals has shape {np.shape(ckpt.totals)}; valid: ({len(ckpt.totals_columns)},)"
    return None
