"""The training CLI's configuration, in process and without MPI: defaults, every flag, every
bad-input message, and --help."""

import dataclasses
import io
import re

import pytest

from npddp.comm import BACKENDS, TRANSPORTS, backend_names
from npddp.train.config import (Config, ConfigError, default_backend, fixed_on_resume, flag,
                                 inherited_on_resume)
from npddp.train.cli.parser import build_parser, parse_args, parse_config
from npddp.train.cli.validate import check_config
from npddp.data import DATASET_NAMES, NORMALIZE_MODES
from npddp.parallel.hook_registry import HOOKS
from npddp.parallel.ddp import SYNCS
from npddp.train.models import MODELS, REGISTRY
from npddp.nn.gpt import PRESETS
from npddp.optim import OPTIMIZERS
from npddp.train.config import PROGRESS_MODES
from npddp.parallel.model.schedules import SCHEDULES


def test_no_flags_gives_the_dataclass_defaults_and_they_are_valid_on_1_to_8_ranks():
    cfg = parse_config([])
    assert cfg == Config()
    assert (cfg.backend, cfg.model, cfg.sync, cfg.comm_hook) == ("mpi", "mlp", "overlap", "allreduce")
    assert cfg.dataset_name() == "synthetic"
    assert Config(model="cnn").dataset_name() == "synthetic-image"
    assert Config(model="gpt").dataset_name() == "synthetic-tokens"
    check_config(Config(model="gpt"), 2)
    check_config(Config(model="gpt", dataset="text:README.md"), 2)
    for world in (1, 2, 3, 4, 6, 8):
        check_config(cfg, world)


# flag, value(s) on the command line, field, parsed value
FLAGS = [
    ("--backend", ["ring"], "backend", "ring"),
    ("--transport", ["tcp"], "transport", "tcp"),
    ("--sync", ["bucketed"], "sync", "bucketed"),
    ("--bucket-mb", ["0.5"], "bucket_mb", 0.5),
    ("--comm-hook", ["topk"], "comm_hook", "topk"),
    ("--powersgd-rank", ["4"], "powersgd_rank", 4),
    ("--powersgd-start-iter", ["5"], "powersgd_start_iter", 5),
    ("--plugin", ["examples.custom_allreduce"], "plugin", "examples.custom_allreduce"),
    ("--topk-ratio", ["0.1"], "topk_ratio", 0.1),
    ("--algorithms", ["allgather=bruck"], "algorithms", "allgather=bruck"),
    ("--local-sgd", ["4"], "local_sgd", 4),
    ("--timeout", ["30"], "timeout", 30.0),
    ("--inject-fault", ["1:5"], "inject_fault", "1:5"),
    ("--progress", ["log"], "progress", "log"),
    ("--log-every", ["2.5"], "log_every", 2.5),
    ("--model", ["cnn"], "model", "cnn"),
    ("--hidden", ["32", "16", "8"], "hidden", [32, 16, 8]),
    ("--channels", ["4"], "channels", [4]),
    ("--dropout", ["0.25"], "dropout", 0.25),
    ("--dtype", ["float64"], "dtype", "float64"),
    ("--model-size", ["small"], "model_size", "small"),
    ("--context-length", ["128"], "context_length", 128),
    ("--vocab-size", ["512"], "vocab_size", 512),
    ("--moe-experts", ["8"], "moe_experts", 8),
    ("--moe-top-k", ["2"], "moe_top_k", 2),
    ("--moe-capacity", ["1.5"], "moe_capacity", 1.5),
    ("--moe-aux", ["0.1"], "moe_aux", 0.1),
    ("--dataset", ["data/x.npz"], "dataset", "data/x.npz"),
    ("--x-key", ["train/images"], "x_key", "train/images"),
    ("--y-key", ["labels"], "y_key", "labels"),
    ("--normalize", ["standard"], "normalize", "standard"),
    ("--data-dir", ["/data"], "data_dir", "/data"),
    ("--train-samples", ["500"], "train_samples", 500),
    ("--val-samples", ["50"], "val_samples", 50),
    ("--epochs", ["7"], "epochs", 7),
    ("--batch-size", ["64"], "batch_size", 64),
    ("--lr", ["0.2"], "lr", 0.2),
    ("--optimizer", ["adamw"], "optimizer", "adamw"),
    ("--momentum", ["0.5"], "momentum", 0.5),
    ("--weight-decay", ["0.01"], "weight_decay", 0.01),
    ("--seed", ["3"], "seed", 3),
    ("--max-steps", ["10"], "max_steps", 10),
    ("--checkpoint", ["run.h5"], "checkpoint", "run.h5"),
    ("--checkpoint-every", ["5"], "checkpoint_every", 5),
    ("--resume", [], "resume", True),
    ("--overwrite", [], "overwrite", True),
    ("--metrics", ["m.h5"], "metrics", "m.h5"),
    ("--trace", ["t.json"], "trace", "t.json"),
    ("--trace-steps", ["2:9"], "trace_steps", "2:9"),
    ("--threads", ["2"], "threads", 2),
    ("--threads", ["auto"], "threads", "auto"),
    ("--quiet", [], "quiet", True),
    ("--zero", ["2"], "zero", 2),
    ("--tp", ["2"], "tp", 2),
    ("--sequence-parallel", [], "sequence_parallel", True),
    ("--pp", ["2"], "pp", 2),
    ("--micro-batches", ["4"], "micro_batches", 4),
    ("--pp-schedule", ["gpipe"], "pp_schedule", "gpipe"),
]


def test_the_flag_table_covers_every_field():
    assert sorted({f for _, _, f, _ in FLAGS}) == sorted(f.name for f in dataclasses.fields(Config))


@pytest.mark.parametrize("option, values, name, expected", FLAGS)
def test_every_flag_sets_its_field_and_only_that_one(option, values, name, expected):
    cfg = parse_config([option, *values])
    assert getattr(cfg, name) == expected
    others = {k: v for k, v in cfg.as_dict().items() if k != name}
    defaults = Config(**{name: expected})           # with the defaults that follow it (--optimizer's lr)
    assert others == {k: v for k, v in defaults.as_dict().items() if k != name}


def test_choices_come_from_the_implementations():
    """Each flag's choices are exactly the tuple its implementing module exports (so they cannot drift)."""
    parser = build_parser()
    choices = {a.dest: tuple(a.choices) for a in parser._actions if a.choices}
    assert choices == {"backend": backend_names(), "sync": SYNCS, "comm_hook": HOOKS, "model": MODELS,
                       "dtype": ("float32", "float64"), "optimizer": OPTIMIZERS, "normalize": NORMALIZE_MODES,
                       "progress": PROGRESS_MODES, "model_size": tuple(PRESETS),
                       "transport": ("auto", *TRANSPORTS), "pp_schedule": SCHEDULES}
    assert MODELS == tuple(REGISTRY) and set(MODELS) >= {"mlp", "cnn", "gpt"}
    for option, valid in (("--backend", BACKENDS), ("--sync", SYNCS), ("--comm-hook", HOOKS),
                          ("--model", MODELS), ("--optimizer", OPTIMIZERS), ("--normalize", NORMALIZE_MODES)):
        for value in valid:
            assert getattr(parse_config([option, value]), option[2:].replace("-", "_")) == value
    for name in DATASET_NAMES:
        if name != "regression":                 # the one set with float targets: not a classifier's
            model = ["--model", "gpt"] if name == "synthetic-tokens" else []
            check_config(parse_config(["--dataset", name, "--data-dir", "d", *model]), 1)


# argv, world size, text the message must contain
BAD = [
    (["--epochs", "0"], 2, "--epochs must be a positive integer, got 0"),
    (["--epochs", "-3"], 1, "--epochs must be a positive integer, got -3"),
    (["--epochs", "two"], 1, "argument --epochs: invalid int value: 'two'"),
    (["--batch-size", "0"], 1, "--batch-size must be a positive integer, got 0"),
    (["--batch-size", "1"], 2, "--batch-size 1 is smaller than the world size 2"),
    (["--batch-size", "3"], 4, "--batch-size 3 is smaller than the world size 4"),
    (["--batch-size", "10"], 4, "--batch-size 10 does not split evenly over 4 ranks: use a multiple of 4, e.g. 8 or 12"),
    (["--batch-size", "96"], 5, "--batch-size 96 does not split evenly over 5 ranks"),
    (["--lr", "0"], 1, "--lr must be a positive number, got 0.0"),
    (["--lr", "-0.1"], 1, "--lr must be a positive number, got -0.1"),
    (["--lr", "nan"], 1, "--lr must be a positive number, got nan"),
    (["--lr", "inf"], 1, "--lr must be a positive number, got inf"),
    (["--bucket-mb", "0"], 1, "--bucket-mb must be a positive number"),
    (["--momentum", "1"], 1, "--momentum must be in [0, 1), got 1.0"),
    (["--weight-decay", "-1"], 1, "--weight-decay must be a finite number >= 0, got -1.0"),
    (["--dropout", "1"], 1, "--dropout must be in [0, 1), got 1.0"),
    (["--topk-ratio", "0"], 1, "--topk-ratio must be in (0, 1], got 0.0"),
    (["--model", "gpt", "--moe-experts", "-1"], 1, "--moe-experts must be an integer >= 0 (0: no experts), got -1"),
    (["--model", "gpt", "--moe-experts", "4", "--moe-top-k", "5"], 1, "--moe-top-k must be in [1, 4] (--moe-experts), got 5"),
    (["--model", "gpt", "--moe-experts", "4", "--moe-capacity", "0"], 1, "--moe-capacity must be a finite number > 0, got 0.0"),
    (["--model", "gpt", "--moe-experts", "4", "--moe-aux", "-1"], 1, "--moe-aux must be a finite number >= 0, got -1.0"),
    (["--moe-experts", "4"], 1, "--moe-experts 4 applies to --model gpt; --model mlp does not read it"),
    (["--local-sgd", "-1"], 1, "--local-sgd must be an integer >= 0, got -1"),
    (["--seed", "-1"], 1, "--seed must be an integer >= 0, got -1"),
    (["--max-steps", "-2"], 1, "--max-steps must be an integer >= 0, got -2"),
    (["--threads", "-1"], 1, "argument --threads: threads must be 'auto' or a positive integer, got -1"),
    (["--threads", "0"], 1, "argument --threads: threads must be 'auto' or a positive integer, got 0"),
    (["--threads", "many"], 1, "argument --threads: threads must be 'auto' or a positive integer, got 'many'"),
    (["--log-every", "0"], 1, "--log-every must be a positive number, got 0.0"),
    (["--x-key", " "], 1, "--x-key must name an array, got an empty string"),
    (["--normalize", "zscore"], 1, "argument --normalize: invalid choice: 'zscore'"),
    (["--progress", "always"], 1, "argument --progress: invalid choice: 'always'"),
    (["--inject-fault", "1:5:boom"], 2, "--inject-fault '1:5:boom': kind 'boom' is not one of raise, exit, nan"),
    (["--inject-fault", "1"], 2, "--inject-fault '1' must be RANK:STEP or RANK:STEP:KIND"),
    (["--hidden", "8", "0"], 1, "--hidden takes positive integers, got 0"),
    (["--channels", "-4"], 1, "--channels takes positive integers, got -4"),
    (["--local-sgd", "2", "--comm-hook", "fp16"], 1, "--local-sgd 2 averages parameters, so it cannot be combined with --comm-hook fp16"),
    (["--compression", "fp16"], 1, "--compression is gone; use --comm-hook {allreduce,fp16,topk,powersgd}"),
    (["--compression=none"], 1, "--compression is gone; use --comm-hook"),
    (["--powersgd-rank", "0"], 1, "--powersgd-rank must be an integer >= 1, got 0"),
    (["--powersgd-start-iter", "1"], 1, "--powersgd-start-iter must be an integer >= 2"),
    (["--plugin", "no_such_module_x"], 1, "--plugin 'no_such_module_x' cannot be imported"),
    (["--backend", "nccl"], 1, "argument --backend: invalid choice: 'nccl'"),
    (["--backend", "my_ring"], 1, "an algorithm of your own needs --plugin MODULE, which registers it"),
    (["--model-size", "small"], 1, "--model-size small applies to --model gpt; --model mlp does not read it"),
    (["--model", "cnn", "--context-length", "128"], 1, "--context-length 128 applies to --model gpt; --model cnn"),
    (["--vocab-size", "512"], 1, "--vocab-size 512 applies to --model gpt; --model mlp does not read it"),
    (["--channels", "4", "2"], 1, "--channels 4 2 applies to --model cnn; --model mlp does not read it"),
    (["--model", "gpt", "--hidden", "16"], 1, "--hidden 16 applies to --model mlp or cnn; --model gpt does not"),
    (["--model", "resnet"], 1, "argument --model: invalid choice: 'resnet'"),
    (["--sync", "async"], 1, "argument --sync: invalid choice: 'async'"),
    (["--optimizer", "lamb"], 1, "argument --optimizer: invalid choice: 'lamb'"),
    (["--dtype", "float16"], 1, "argument --dtype: invalid choice: 'float16'"),
    (["--dataset", "cifar"], 1, "unknown --dataset 'cifar'; valid: synthetic, synthetic-image, digits, mnist, a path ending in .npz, .h5, .hdf5, or a directory path (with a '/') holding X.npy and y.npy; for --model gpt: synthetic-tokens, tokens:PATH or text:PATH"),
    (["--model", "gpt", "--dataset", "synthetic"], 1, "--model gpt needs token data: --dataset synthetic-tokens, "
     "tokens:PATH or text:PATH, not 'synthetic'"),
    (["--dataset", "text:a.txt"], 1, "--dataset text:a.txt holds token sequences, which only --model gpt takes"),
    (["--model", "gpt", "--dropout", "0.1"], 1, "--dropout 0.1 applies to mlp and cnn"),
    (["--model", "gpt", "--context-length", "0"], 1, "--context-length must be a positive integer, got 0"),
    (["--model", "gpt", "--vocab-size", "-1"], 1, "--vocab-size must be an integer >= 0, got -1"),
    (["--model", "gpt", "--model-size", "huge"], 1, "argument --model-size: invalid choice: 'huge'"),
    (["--dataset", "regression"], 1, "unknown --dataset 'regression'"),
    (["--dataset", "mnist"], 1, "--dataset mnist needs --data-dir DIR"),
    (["--checkpoint", "run.pt"], 1, "--checkpoint 'run.pt' must end in .h5 or .hdf5"),
    (["--metrics", "m.csv"], 1, "--metrics 'm.csv' must end in .h5 or .hdf5"),
    (["--checkpoint", "a.h5", "--metrics", "./a.h5"], 1, "--checkpoint and --metrics name the same file 'a.h5'"),
    (["--resume"], 1, "--resume needs --checkpoint PATH.h5"),
    (["--checkpoint-every", "5"], 1, "--checkpoint-every needs --checkpoint PATH.h5"),
    (["--no-such-flag"], 1, "unrecognized arguments: --no-such-flag"),
    (["--hidden"], 1, "argument --hidden: expected at least one argument"),
    (["--epoch", "3"], 1, "unrecognized arguments: --epoch 3"),   # no abbreviations
    (["--zero", "4"], 1, "--zero must be one of 0, 1, 2, 3, got 4"),
    (["--zero", "two"], 1, "argument --zero: invalid int value: 'two'"),
    (["--zero", "1", "--local-sgd", "2"], 1, "--local-sgd 2 keeps a different replica on every rank, which --zero 1"),
    (["--zero", "2", "--comm-hook", "fp16"], 1, "--comm-hook fp16 works on whole buckets for an all-reduce; --zero 2"),
    (["--zero", "3", "--sync", "bucketed"], 1, "--sync bucketed is a DDP strategy; --zero 3 always reduce-scatters"),
]


@pytest.mark.parametrize("argv, world, text", BAD)
def test_bad_input_is_one_config_error_naming_the_value(argv, world, text):
    with pytest.raises(ConfigError) as info:
        check_config(parse_config(argv), world)
    assert text in str(info.value)
    assert "\n" not in str(info.value)


def test_the_same_flags_are_fine_where_the_world_allows_them():
    check_config(parse_config(["--batch-size", "10"]), 5)
    check_config(parse_config(["--batch-size", "3"]), 3)
    check_config(parse_config(["--checkpoint", "a.h5", "--resume"]), 2)
    check_config(parse_config(["--dataset", "data/npy/", "--x-key", "images"]), 2)


def test_help_explains_every_flag_with_its_default_and_goes_to_the_given_file():
    out = io.StringIO()
    with pytest.raises(SystemExit) as info:
        parse_config(["--help"], help_file=out)
    assert info.value.code == 0
    text = out.getvalue()
    flat = " ".join(text.split())
    for f in dataclasses.fields(Config):
        assert flag(f.name) in text, f.name
    assert flat.count("(default: ") == len(dataclasses.fields(Config))
    for needle in ("(default: mpi under an MPI launcher; auto when the job runs over tcp", "(default: overlap)", "(default: 256 256)", "(default: 96)",
                   "GLOBAL batch size, split evenly across ranks", "threadpoolctl",
                   "synthetic-image with --model cnn", "mpirun -n 2 python -m npddp.train",
                   "(default: auto)", "--normalize standard", "3 a non-finite loss", "4 a checkpoint or metrics",
                   "python -m npddp.evaluate run.h5"):
        assert needle in flat, needle


def test_help_marks_exactly_the_fields_fixed_on_resume_and_those_taken_from_the_checkpoint():
    text = " ".join(build_parser().format_help().split())
    fixed, inherited = fixed_on_resume(), inherited_on_resume()
    assert {"model", "hidden", "batch_size", "seed", "optimizer", "dataset"} <= set(fixed)
    assert not {"epochs", "lr", "backend", "max_steps", "checkpoint"} & set(fixed)
    assert len(re.findall(r"\(default: [^)]*\) \[fixed on resume\]", text)) == len(fixed)
    assert len(re.findall(r"\(default: [^)]*\) \[from the checkpoint\]", text)) == len(inherited)


def test_parse_args_returns_only_the_flags_given():
    assert parse_args([]) == {}
    assert parse_args(["--lr", "0.1", "--resume"]) == {"lr": 0.1, "resume": True}


def test_config_is_frozen_and_its_dict_is_a_copy():
    cfg = Config()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.epochs = 3
    d = cfg.as_dict()
    d["hidden"].append(1)
    assert cfg.hidden == [256, 256]


def test_zero_help_says_checkpoints_are_sharded_as_they_are_written():
    text = " ".join(build_parser().format_help().split())
    start = text.index("--zero {0,1,2,3} sharded")
    zero = text[start:text.index("--model {", start)]
    assert "whole-model" not in zero
    assert "one shard file per rank plus an index" in zero



def test_help_says_the_metrics_file_and_the_trace_need_overwrite_as_the_checkpoint_does():
    text = " ".join(build_parser().format_help().split())
    start = text.index("--overwrite let")
    overwrite = text[start:text.index("--threads", start)]
    start = text.index("--metrics PATH.h5 HDF5")
    metrics = text[start:text.index("--trace FILE.json", start)]
    assert "--checkpoint, --metrics or --trace file" in overwrite
    assert "--resume continues the checkpoint and metrics" in overwrite
    assert "replaced only with --overwrite" in metrics and "continued by --resume" in metrics

def test_the_default_backend_follows_the_transport_the_launcher_gives():
    tcp = {"RANK": "0", "WORLD_SIZE": "2"}
    assert default_backend("auto", tcp) == ("auto", "not started by MPI")
    assert default_backend("auto", {**tcp, "PMI_RANK": "0", "PMI_SIZE": "2"}) == ("mpi", "")
    assert default_backend("auto", {}) == ("mpi", "")
    assert default_backend("tcp", {}) == ("auto", "--transport tcp")
    assert default_backend("mpi", tcp) == ("mpi", "")


def test_each_optimizer_has_its_own_default_learning_rate_named_in_help():
    assert parse_config([]).lr == 0.05
    assert parse_config(["--optimizer", "adamw"]).lr == 1e-3            # PyTorch's AdamW default
    assert parse_config(["--optimizer", "adamw", "--lr", "0.01"]).lr == 0.01
    assert parse_args(["--optimizer", "adamw"]) == {"optimizer": "adamw"}  # a resume still inherits lr
    text = " ".join(build_parser().format_help().split())
    start = text.index("--lr LR learning rate")
    assert "0.05 with sgd, 0.001 with adamw" in text[start:text.index("--optimizer {", start)]


def test_algorithms_flag_is_parsed_and_checked():
    from npddp.train.cli.validate import check_algorithms
    assert check_algorithms(parse_config([])) == {}
    assert check_algorithms(parse_config(["--algorithms", "allgather=bruck, reduce_scatter=halving"])) == \
        {"allgather": "bruck", "reduce_scatter": "halving"}
    for bad, named in (("allgather=nope", "'nope'; valid: auto, "), ("broadcast=ring", "'broadcast'"),
                       ("allgather", "COLLECTIVE=ALGORITHM"), ("allgather=rd,allgather=ring", "twice")):
        with pytest.raises(ConfigError, match=named):
            check_algorithms(parse_config(["--algorithms", bad]))
    with pytest.raises(ConfigError, match="--backend mpi runs its own"):
        check_config(parse_config(["--backend", "mpi", "--algorithms", "allgather=rd"]), 2)
    check_config(parse_config(["--backend", "ring", "--algorithms", "allgather=rd"]), 2)
