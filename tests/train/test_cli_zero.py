"""``python -m npddp.train --zero {1,2,3}`` end to end (subprocesses under mpirun): the same parameters as
``--zero 0``, the header's memory line, checkpoints resumed with another stage and world size, bad combinations."""

import pytest

from npddp.checkpoint import fileformat

from tests.helpers.cli import ok, train
from tests.helpers.cli_zero import GPT, params_of, relative


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("zero0")
    ok(train(cwd, *GPT, "--zero", "0", "--checkpoint", "ref.h5"))
    return params_of(cwd / "ref.h5")


@pytest.mark.parametrize("stage", [1, 3])   # stage 2: the resumed run below
@pytest.mark.slow
def test_every_stage_trains_to_ddps_parameters_and_states_its_memory(tmp_path, ddp_run, stage):
    proc = ok(train(tmp_path, *GPT, "--zero", str(stage), "--checkpoint", "z.h5"))
    header = [line for line in proc.stdout.splitlines() if line.startswith("zero: ")]
    assert len(header) == 1 and f"stage {stage}" in header[0] and "optimizer" in header[0], proc.stdout
    assert relative(params_of(tmp_path / "z.h5"), ddp_run) < 1e-12


@pytest.mark.slow
def test_a_zero3_checkpoint_resumes_as_zero2_on_three_ranks_and_ends_at_ddps_parameters(tmp_path, ddp_run):
    ok(train(tmp_path, *GPT, "--zero", "3", "--checkpoint", "z.h5", "--max-steps", "5"))
    assert fileformat.read(str(tmp_path / "z.h5")).step == 5
    ok(train(tmp_path, "--checkpoint", "z.h5", "--resume", "--zero", "2", "--progress", "none", n=3))
    assert relative(params_of(tmp_path / "z.h5"), ddp_run) < 1e-12


def test_a_combination_that_makes_no_sense_is_one_line_exit_2(tmp_path):
    proc = train(tmp_path, *GPT, "--zero", "2", "--comm-hook", "fp16")
    assert proc.returncode == 2
    errors = [line for line in (proc.stdout + proc.stderr).splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "--zero 2" in errors[0], proc.stderr
