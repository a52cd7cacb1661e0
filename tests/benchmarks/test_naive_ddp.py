"""benchmarks/naive_ddp.py: the memory auto-fit, the exact CSV columns, and an in-process run on COMM_WORLD."""

import csv

import numpy as np
import pytest
from mpi4py import MPI

from benchmarks import naive_ddp as nd
from benchmarks import results
from npddp.nn import PRESETS, gpt_preset

GIB = 2 ** 30


def config(**kw):
    base = dict(model_sizes=("small",), syncs=("per_param",), backend="mpi", bucket_mb=25.0, context_length=256,
                vocab_size=10000, batch_size=4, num_steps=1, num_warmup=0, dtype="float32", optimizer="adamw",
                csv="", out="")
    return nd.Config(**{**base, **kw})


def test_footprint_grows_with_the_preset_and_counts_adamw_state():
    cfg = config()
    sizes = [nd.footprint(s, cfg, 2) for s in PRESETS]
    assert sizes == sorted(sizes)
    small = gpt_preset("tiny", 10000, 256).num_parameters()
    assert nd.footprint("tiny", cfg, 2) > small * 4 * 4                      # values, grads, 2 moments
    assert nd.footprint("tiny", config(optimizer="sgd"), 2) < nd.footprint("tiny", cfg, 2)


@pytest.mark.parametrize("requested,available,ranks,chosen,text", [
    ("small", 64 * GIB, 2, "small", None),
    ("medium", 8 * GIB, 2, "small", "medium needs ~5.8 GiB per rank x 2 rank(s) on this node, 8.0 GiB available "
                                    "(using 85%): running small instead"),
    ("2.7B", 40 * GIB, 1, "xl", "running xl instead"),
    ("small", GIB // 8, 2, None, "no preset fits; lower --batch-size or --context-length"),
])
def test_fit_size_picks_the_largest_preset_that_fits_and_says_so(requested, available, ranks, chosen, text):
    got, note = nd.fit_size(requested, config(), 2, ranks, available)
    assert got == chosen
    assert (note is None) if text is None else (text in note)


def test_csv_paths_and_exact_columns(tmp_path):
    assert nd.csv_paths("a/t.csv", ("per_param",)) == {"per_param": "a/t.csv"}
    assert nd.csv_paths("t.csv", ("per_param", "overlap")) == {"per_param": "t.per_param.csv",
                                                              "overlap": "t.overlap.csv"}
    row = {c: 1.5 for c in nd.CSV_COLUMNS} | {"model_size": "small", "d_model": 768, "num_layers": 12,
                                             "num_comm_ops": 148, "sync": "per_param"}
    nd.write_csv(tmp_path / "t.csv", [row])
    with open(tmp_path / "t.csv") as f:
        table = list(csv.reader(f))
    assert table[0] == ["model_size", "d_model", "num_layers", "total_time_ms", "compute_time_ms", "comm_time_ms",
                        "comm_fraction", "num_comm_ops"]
    assert table[1] == ["small", "768", "12", "1.500", "1.500", "1.500", "1.500", "148"]


@pytest.mark.parametrize("argv,text", [
    (["--batch-size", "3"], "--batch-size 3 does not split over 2 ranks"),
    (["--model-size", "huge"], "unknown name 'huge'; valid: tiny, small, medium, large, xl, 2.7B"),
    (["--sync", "per_param,per_param"], "'per_param,per_param' names something twice"),
    (["--num-steps", "0"], "must be >= 1"),
])
def test_bad_arguments_exit_2_naming_the_value(argv, text, capsys):
    with pytest.raises(SystemExit) as info:
        nd.parse_config(argv, 2)
    assert info.value.code == 2 and text in capsys.readouterr().err


@pytest.mark.mpi
def test_run_on_the_world_writes_the_table_the_csvs_and_the_dump(agreed_tmpdir, monkeypatch, capsys,
                                                                assert_all_ranks):
    world = MPI.COMM_WORLD
    n = world.Get_size()
    small = nd.Config(("small",), ("per_param",), "mpi", 25.0, 16, 64, 2 * n, 1, 0, "float32", "adamw", "", "")
    tiny_fits = nd.footprint("tiny", small, n) * n / nd.MEMORY_SHARE * 1.01       # tiny fits, small does not
    monkeypatch.setattr(nd, "available_memory", lambda: int(tiny_fits))
    prefix = str(agreed_tmpdir / "naive")
    argv = ["--model-size", "small", "--sync", "per_param,overlap", "--num-steps", "2", "--num-warmup", "0",
            "--context-length", "16", "--vocab-size", "64", "--batch-size", str(2 * n), "--bucket-mb", "0.01",
            "--csv", prefix + ".csv", "--out", prefix + ".h5"]
    code = nd.main(argv, mpi_comm=world)
    out = capsys.readouterr().out
    problems = [] if code == 0 else [f"exit {code}"]
    if world.Get_rank() != 0:
        assert_all_ranks(not problems and out == "", f"{problems}, printed {out!r}")
        return
    if "small needs ~" not in out or "running tiny instead" not in out:
        problems.append("no auto-fit note")
    tensors = len(gpt_preset("tiny", 64, 16).parameters())
    for sync in ("per_param", "overlap"):
        with open(f"{prefix}.{sync}.csv") as f:
            table = list(csv.DictReader(f))
        if list(table[0]) != list(nd.CSV_COLUMNS) or len(table) != 1 or table[0]["model_size"] != "tiny":
            problems.append(f"{sync} csv {table}")
        ops = int(table[0]["num_comm_ops"])
        want = 0 if n == 1 else tensors if sync == "per_param" else None
        if (want is not None and ops != want) or (sync == "overlap" and n > 1 and not 1 < ops < tensors):
            problems.append(f"{sync}: {ops} all-reduce calls, {tensors} tensors")
        if not 0.0 <= float(table[0]["comm_fraction"]) <= 1.0:
            problems.append(f"{sync} comm_fraction {table[0]['comm_fraction']}")
    table, meta = results.read_table(prefix + ".h5"), results.read_meta(prefix + ".h5")   # checks the dump
    if meta["kind"] != "naive_ddp" or meta["world_size"] != n or "running tiny instead" not in meta["memory_notes"]:
        problems.append(f"dump attributes {meta}")
    if list(table["requested_size"]) != ["small", "small"] or list(table["model_size"]) != ["tiny", "tiny"]:
        problems.append("requested_size / model_size columns")
    if list(table)[:8] != list(nd.CSV_COLUMNS):
        problems.append(f"dump columns {list(table)}")
    if not (np.all(np.asarray(table["tokens_per_s"]) > 0) and np.all(np.asarray(table["cpu_time_ms"]) > 0)):
        problems.append("tokens_per_s or cpu_time_ms")
    assert_all_ranks(not problems, "; ".join(problems))
