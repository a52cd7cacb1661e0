"""--resume without MPI: which settings come from the checkpoint, what may change and what the
header says about it, and the messages for a checkpoint that does not fit this run."""

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest

from npddp.checkpoint.stateful import ModelState
from npddp.train.checkpoint import resume
from npddp.checkpoint.fileformat import Checkpoint
from npddp.train.config import Config, ConfigError, fixed_on_resume, inherited_on_resume
from npddp.train.cli.parser import parse_args
from npddp.nn import mlp
from npddp.optim import SGD, AdamW

SAVED_CONFIG = {**Config().as_dict(), "model": "cnn", "hidden": [16], "channels": [4], "batch_size": 32,
                "seed": 7, "epochs": 9, "lr": 0.2, "sync": "bucketed", "metrics": "m.h5", "dataset": "d.npz",
                "backend": "ring", "max_steps": 5, "threads": 1}
SAVED = {"config": SAVED_CONFIG, "backend": "ring", "world_size": 2, "step": 5, "epochs_done": 0,
         "batches_done": 5}


def test_every_field_is_fixed_inherited_or_this_runs_own():
    fixed, inherited = set(fixed_on_resume()), set(inherited_on_resume())
    assert not fixed & inherited
    assert {"model", "hidden", "batch_size", "seed", "dataset", "x_key", "normalize"} <= fixed
    assert {"epochs", "lr", "sync", "metrics", "checkpoint_every", "backend"} <= inherited
    assert not {"max_steps", "checkpoint", "resume", "threads", "timeout", "quiet"} & (fixed | inherited)


def test_a_bare_resume_takes_the_fixed_and_inherited_settings_from_the_checkpoint():
    given = parse_args(["--checkpoint", "c.h5", "--resume"])
    cfg = resume.merge(given, SAVED, "c.h5")
    for name in (*fixed_on_resume(), *inherited_on_resume()):
        assert getattr(cfg, name) == SAVED_CONFIG[name], name
    # this run's own settings are not taken over: --max-steps, threads keep their defaults
    assert (cfg.backend, cfg.max_steps, cfg.threads, cfg.checkpoint, cfg.resume) == ("ring", 0, "auto", "c.h5", True)


def test_given_flags_win_for_inherited_fields_and_must_repeat_fixed_ones():
    given = parse_args(["--checkpoint", "c.h5", "--resume", "--epochs", "12", "--lr", "0.01", "--hidden", "16"])
    cfg = resume.merge(given, SAVED, "c.h5")
    assert (cfg.epochs, cfg.lr, cfg.hidden) == (12, 0.01, [16])
    with pytest.raises(ConfigError) as info:
        resume.merge(parse_args(["--checkpoint", "c.h5", "--resume", "--hidden", "8", "--seed", "1"]), SAVED, "c.h5")
    text = str(info.value)
    assert "was written with --hidden 16 --seed 7, this run has --hidden 8 --seed 1" in text
    assert "[fixed on resume]" in text and "\n" not in text


def test_momentum_may_differ_when_the_optimizer_ignores_it():
    saved = {**SAVED, "config": {**SAVED_CONFIG, "optimizer": "adamw", "momentum": 0.9}}
    cfg = resume.merge(parse_args(["--resume", "--checkpoint", "c.h5", "--momentum", "0.5"]), saved, "c.h5")
    assert cfg.optimizer == "adamw"


@pytest.mark.parametrize("argv, world, expected", [
    ([], 2, "same settings as the checkpoint; bit-identical"),
    (["--backend", "ring"], 2, "same settings as the checkpoint; bit-identical"),
    (["--backend", "mpi"], 2, "--backend ring -> mpi; gradients are summed in another order"),
    ([], 3, "world size 2 -> 3; per-rank state"),
    (["--lr", "0.01", "--epochs", "9"], 2, "--lr 0.2 -> 0.01"),
    (["--sync", "overlap"], 2, "--sync bucketed -> overlap; gradients are summed in another"),
])
def test_the_header_names_what_changed_and_whether_bit_identity_holds(argv, world, expected):
    given = parse_args(["--checkpoint", "c.h5", "--resume", *argv])
    lines = resume.changes(resume.merge(given, SAVED, "c.h5"), given, SAVED, world)
    assert len(lines) == 1 and expected in lines[0], lines
    if "--epochs" in argv:
        assert "--epochs" not in lines[0]                 # given, but with the saved value


def test_a_split_model_resumed_names_its_data_replicas_not_its_world_size():
    """tp 2 x dp 2 (4 ranks, 2 replicas) resumed as pp 2 on 2 ranks: 1 replica, beside a header of 2 ranks."""
    saved = {**SAVED, "config": {**SAVED_CONFIG, "tp": 2, "zero": 1}}
    given = parse_args(["--checkpoint", "c.h5", "--resume", "--tp", "1", "--pp", "2"])
    lines = resume.changes(resume.merge(given, saved, "c.h5"), given, saved, 1)
    assert lines[0].startswith("resume: changed since the checkpoint: data replicas 2 -> 1, --tp 2 -> 1, --pp 1 -> 2")
    assert "world size" not in lines[0]


def test_a_backend_replaced_without_being_given_counts_as_a_change():
    """The checkpoint's mpi, which a job over TCP cannot run, is replaced by the default: not bit-identical."""
    saved = {**SAVED, "config": {**SAVED_CONFIG, "backend": "mpi"}}
    given = parse_args(["--checkpoint", "c.h5", "--resume"])
    cfg = dataclasses.replace(resume.merge(given, saved, "c.h5"), backend="auto")
    lines = resume.changes(cfg, given, saved, 2)
    assert "--backend mpi -> auto; gradients are summed in another order" in lines[0], lines


def test_the_zero_line_says_one_data_replica_shards_nothing():
    from npddp.train.sharding import memory_line
    model, opt = _model_and_optimizer()
    engine = SimpleNamespace(parameters=model.parameters)
    assert memory_line(1, engine, opt, replicas=2).startswith("zero: stage 1 (optimizer state sharded); held")
    assert memory_line(1, engine, opt, replicas=1).startswith("zero: stage 1 (one data replica: nothing to shard "
                                                              "across); held")


@pytest.mark.parametrize("n, batch, world, steps", [(384, 32, 2, 12), (100, 10, 1, 10), (101, 10, 1, 11),
                                                    (10, 4, 4, 3), (7, 3, 3, 3)])
def test_steps_per_epoch_matches_the_loader(n, batch, world, steps):
    from npddp.data import BatchLoader, DistributedSampler

    assert resume.steps_per_epoch(n, batch, world) == steps
    loader = BatchLoader(np.zeros((n, 1)), np.zeros(n, np.int64), DistributedSampler(n, world, 0), batch // world)
    assert len(loader) == steps


# ----------------------------------------------------------------------------- a checkpoint that does not fit

def _model_and_optimizer(hidden=5, kind="sgd"):
    model = mlp(4, [hidden], 3, seed=0)
    opt = SGD(model.parameters(), lr=0.1, momentum=0.9) if kind == "sgd" else AdamW(model.parameters(), lr=0.1)
    return model, opt


def _saved(model, opt, world=2):
    return Checkpoint(epochs_done=0, batches_done=1, step=1, world_size=world, backend="mpi",
                      config={"sync": "overlap", "bucket_mb": 0.25}, params=model.state_dict(),
                      optimizer=opt.state_dict(), optimizer_name="sgd" if isinstance(opt, SGD) else "adamw")


def _why(ckpt, model, opt, ddp=None, steps=None):
    engine = ddp or SimpleNamespace(buckets=[], comm=SimpleNamespace(size=2), comm_hook_state=None)
    return resume.incompatibility(ckpt, "c.h5", model=ModelState(model.named_parameters(), engine=engine),
                                  optim=opt, optimizer_name="sgd" if isinstance(opt, SGD) else "adamw", steps=steps)


def test_a_matching_checkpoint_is_compatible():
    model, opt = _model_and_optimizer()
    assert _why(_saved(model, opt), model, opt, steps=12) is None


def test_incompatibilities_name_both_values():
    model, opt = _model_and_optimizer()
    ckpt = _saved(model, opt)
    other, other_opt = _model_and_optimizer(hidden=6)
    assert "parameter '0.weight' is (5, 4) float32 there, (6, 4) float32 here" in _why(ckpt, other, other_opt)
    adam_model, adam = _model_and_optimizer(kind="adamw")
    assert "holds sgd state, this run uses adamw" in _why(ckpt, adam_model, adam)
    plain = SGD(model.parameters(), lr=0.1)      # no momentum: no momentum buffers
    assert "optimizer state" in _why(ckpt, model, plain) and "momentum_buffer.0" in _why(ckpt, model, plain)
    ckpt.hook_state = {"error.0": np.zeros((2, 9)), "error.1": np.zeros((2, 5))}
    ddp = SimpleNamespace(comm=SimpleNamespace(size=2),
                          buckets=[SimpleNamespace(buffer=np.zeros(4)), SimpleNamespace(buffer=np.zeros(5))])
    assert "buckets of [9, 5] elements, this run's buckets have [4, 5]" in _why(ckpt, model, opt, ddp=ddp)


@pytest.mark.parametrize("batches_done", [12, 10**6])
def test_a_position_past_the_end_of_the_epoch_is_refused(batches_done):
    model, opt = _model_and_optimizer()
    ckpt = _saved(model, opt)
    ckpt.batches_done = batches_done
    why = _why(ckpt, model, opt, steps=12)
    assert f"says {batches_done} batches of the epoch are done" in why and "valid: 0..11" in why
