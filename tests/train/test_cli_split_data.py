"""``python -m npddp.train --tp/--pp`` with ZeRO-1, comm hooks and local SGD over the data replicas.

Whole runs under mpirun (and one under ``npddp.run`` over TCP), serial pytest, marked slow. In
float64: ZeRO-1 ends at one process's parameters and optimizer state, its checkpoint is the whole
model's and resumes on another layout; the fp16 hook and local SGD end where the same flags end
without a split; PowerSGD trains. A split run's epoch line counts its communication, and ZeRO-2/3
remain one error line, exit 2.
"""

import re

import numpy as np
import pytest

from npddp.checkpoint import fileformat
from npddp.train.checkpoint import resume
from npddp.train.checkpoint.saving import load_model
from npddp.train.console.metrics import read_metrics
from npddp.train.cli.validate import check_config
from tests.helpers.cli import epoch_lines, ok, train
from tests.helpers.cli_split import GPT, MLP, cfg_of

ONE_EPOCH = [*GPT, "--epochs", "1"]


def _worst(a: dict, b: dict, row=None) -> float:
    """Largest relative difference over the arrays of ``a`` and ``b`` (``row``: that row of ``a``'s per-rank stacks)."""
    arrays = [k for k in b if isinstance(b[k], np.ndarray) and b[k].ndim]
    assert arrays and set(arrays) <= set(a)
    return max(float(np.abs((a[k] if row is None else a[k][row]) - b[k]).max() / max(np.abs(b[k]).max(), 1e-300))
               for k in arrays)


@pytest.mark.parametrize("argv", [["--pp", "2", "--zero", "1"], ["--tp", "2", "--comm-hook", "powersgd"],
                                  ["--tp", "2", "--pp", "2", "--comm-hook", "fp16", "--zero", "1"],
                                  ["--pp", "2", "--local-sgd", "2"]])
def test_data_parallel_options_pass_the_layout_check(argv):
    check_config(cfg_of(argv), 8)


@pytest.mark.slow
def test_zero1_tp2_dp2_gpt_ends_at_one_process_and_resumes_at_pp2(tmp_path):
    ok(train(tmp_path, *GPT, "--epochs", "2", "--checkpoint", "one.h5", n=None))
    split = ok(train(tmp_path, *[a for a in GPT if a != "--quiet"], "--epochs", "2", "--tp", "2", "--zero", "1",
                     "--max-steps", "18", "--checkpoint", "split.h5", "--metrics", "m.h5", n=4))
    assert "zero: stage 1 (optimizer state sharded)" in split.stdout
    mid = fileformat.read(tmp_path / "split.h5")
    assert (mid.step, mid.world_size, mid.config["zero"], mid.config["tp"]) == (18, 2, 1, 2)
    assert [n for n, _ in load_model(tmp_path / "split.h5").named_parameters()] == list(mid.params)
    # the step's tensor all-reduces and the data replicas' sync are communication
    line = epoch_lines(split.stdout)[0]
    assert int(re.search(r"comm\s+(\d+)%", line).group(1)) > 0, line
    steps = read_metrics(tmp_path / "m.h5")["steps"]
    assert (steps["comm_issue_s"] > 0).all() and (steps["comm_calls"] > 0).all()
    ok(train(tmp_path, "--checkpoint", "split.h5", "--resume", "--tp", "1", "--pp", "2", "--progress", "none", n=2))
    one, end = fileformat.read(tmp_path / "one.h5"), fileformat.read(tmp_path / "split.h5")
    assert end.step == 24
    assert _worst(one.params, end.params) <= 1e-9
    assert _worst(one.optimizer, end.optimizer) <= 1e-9          # AdamW's moments, assembled whole


@pytest.mark.slow
def test_zero1_pp2_dp2_mlp_with_dropout_over_tcp_ends_at_one_process(tmp_path):
    ok(train(tmp_path, *MLP, "--optimizer", "sgd", "--momentum", "0.9", "--checkpoint", "one.h5", n=None))
    ok(train(tmp_path, *MLP, "--optimizer", "sgd", "--momentum", "0.9", "--pp", "2", "--zero", "1",
             "--backend", "ring", "--transport", "tcp", "--checkpoint", "pp2.h5", n=4, launcher="npddp"))
    one, pp2 = fileformat.read(tmp_path / "one.h5"), fileformat.read(tmp_path / "pp2.h5")
    assert _worst(one.params, pp2.params) <= 1e-9
    assert _worst(one.optimizer, pp2.optimizer) <= 1e-9


@pytest.mark.slow
def test_fp16_hook_and_local_sgd_end_where_the_unsplit_run_ends(tmp_path):
    """Two data replicas: split (tp 2 or pp 2) at four ranks against the same flags at two ranks."""
    for flags, split in ((["--comm-hook", "fp16"], ["--tp", "2"]), (["--local-sgd", "3"], ["--pp", "2"])):
        name = flags[0].strip("-")
        ok(train(tmp_path, *ONE_EPOCH, *flags, "--checkpoint", f"{name}-dp2.h5", n=2))
        ok(train(tmp_path, *ONE_EPOCH, *flags, *split, "--checkpoint", f"{name}-split.h5", n=4))
        dp2 = fileformat.read(tmp_path / f"{name}-dp2.h5")
        got = fileformat.read(tmp_path / f"{name}-split.h5")
        # local SGD keeps each rank's replica; they were averaged at the last step, so row 0 is every row
        assert _worst(dp2.params, got.params, row=0 if dp2.per_rank else None) <= 1e-9, name


@pytest.mark.slow
def test_powersgd_over_the_data_replicas_of_a_pipeline_trains_and_resumes_without_its_state(tmp_path):
    first = ok(train(tmp_path, *[a for a in GPT if a != "--quiet"], "--epochs", "2", "--pp", "2", "--comm-hook",
                     "powersgd", "--powersgd-start-iter", "2", "--max-steps", "12", "--checkpoint", "ps.h5", n=4))
    second = ok(train(tmp_path, "--checkpoint", "ps.h5", "--resume", "--progress", "none", n=4))
    assert ("resume: same settings as the checkpoint, which does not hold the --comm-hook powersgd state "
            "(error feedback); so the run may differ") in second.stdout, second.stdout
    losses = [float(re.search(r"train_loss (\S+)", line).group(1))
              for line in epoch_lines(first.stdout) + epoch_lines(second.stdout)]
    assert len(losses) == 2 and losses[1] < losses[0], first.stdout + second.stdout
    assert all(np.isfinite(v).all() for v in fileformat.read(tmp_path / "ps.h5").params.values())


def test_the_resume_line_names_what_a_split_checkpoint_does_not_hold():
    saved = {"config": cfg_of(["--pp", "2", "--local-sgd", "2"]).as_dict(), "world_size": 2}
    cfg = cfg_of(["--pp", "2", "--local-sgd", "2"])
    plain = resume.changes(cfg, {}, saved, 2)
    assert plain == ["resume: same settings as the checkpoint; bit-identical to an uninterrupted run"]
    line, = resume.changes(cfg, {}, saved, 2, unkept="each data replica's own parameters")
    assert "does not hold each data replica's own parameters; so the run may differ" in line


@pytest.mark.slow
def test_zero2_with_a_split_is_one_error_line_and_exit_2(tmp_path):
    proc = train(tmp_path, "--model", "mlp", "--pp", "2", "--zero", "2", "--checkpoint", "run.h5", n=2)
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if line.startswith("error:")]
    assert proc.returncode == 2 and len(lines) == 1, proc.stdout + proc.stderr
    assert "--zero 2 with --tp 1 --pp 2 is not supported" in lines[0] and "--zero 1" in lines[0]
    assert not (tmp_path / "run.h5").exists()
