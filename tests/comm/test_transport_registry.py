"""Transports by name: register_transport's checks, the names create/check/tune accept, and a third transport
(examples/pipe_transport.py) under npddp.check."""

import glob
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

import npddp.comm.transports.base as base
from npddp.comm import TRANSPORTS, create, register_transport, transport_names
from npddp.comm.transports.base import resolve_transport
from npddp.tools import check, tune

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def registry(monkeypatch):
    """A copy of the transport registry, so what a test registers leaves with it."""
    monkeypatch.setattr(base, "_WORLDS", base._WORLDS.copy())


def test_the_built_in_transports_are_registered_through_the_registry():
    assert transport_names()[:2] == TRANSPORTS == ("mpi", "tcp")


def test_a_registered_transport_is_a_name_create_resolves(registry):
    register_transport("loopback", lambda timeout: None)
    assert "loopback" in transport_names() and resolve_transport("loopback") == "loopback"


@pytest.mark.parametrize("name", ["auto", "two words", "", 3])
def test_register_transport_rejects_a_bad_name_naming_it(registry, name):
    with pytest.raises(ValueError, match="must be a Python identifier other than 'auto'"):
        register_transport(name, lambda timeout: None)


def test_register_transport_rejects_a_taken_name_and_a_world_it_cannot_call(registry):
    with pytest.raises(ValueError, match="'tcp' is already registered; taken: mpi, tcp"):
        register_transport("tcp", lambda timeout: None)
    with pytest.raises(TypeError, match="must be callable .*got int"):
        register_transport("loopback", 3)


def test_an_unknown_transport_is_refused_before_anything_is_built():
    with pytest.raises(ValueError, match="unknown transport 'pigeon'; valid transports: mpi, tcp"):
        create("ring", transport="pigeon")


@pytest.mark.parametrize("parse", [check.parse_args, lambda argv: tune.parse_args(argv[2:])])
def test_the_clis_check_the_transport_against_the_registry(parse, capsys):
    with pytest.raises(SystemExit) as exit_:
        parse(["--backend", "ring", "--transport", "pigeon"])
    assert exit_.value.code == 2
    assert "--transport 'pigeon' is unknown; valid: auto, mpi, tcp" in capsys.readouterr().err


@pytest.mark.slow
def test_npddp_check_passes_over_the_pipe_transport_and_leaves_no_pipe_behind():
    pipes = os.path.join(tempfile.gettempdir(), "pipes-*")
    before = set(glob.glob(pipes))
    cmd = [sys.executable, "-m", "npddp.run", "--nproc", "3", "-m", "npddp.check", "--transport", "pipe",
           "--backend", "ring", "--plugin", "examples/pipe_transport.py", "--timeout", "30"]
    run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"})
    assert run.returncode == 0, run.stdout + run.stderr
    assert "7 passed, 0 failed of 7 properties" in run.stdout
    assert set(glob.glob(pipes)) == before


@pytest.mark.parametrize("environ, size, refused", [
    ({}, 1, False),                                              # no launcher: a singleton world is right
    ({"PMI_SIZE": "2"}, 2, False), ({"OMPI_COMM_WORLD_SIZE": "4"}, 4, False),
    ({"PMI_SIZE": "2"}, 1, True),                                # srun --mpi=pmi2 under Open MPI: N worlds of one
    ({"PMI_SIZE": "3"}, 2, True),
])
def test_an_mpi_world_other_than_the_launchers_is_refused(environ, size, refused):
    from npddp.comm.transports.mpi import check_world_size
    if not refused:
        check_world_size(size, environ)
        return
    with pytest.raises(ValueError, match=rf"world of {size} rank.*announced {environ['PMI_SIZE']}.*--mpi=pmix"):
        check_world_size(size, environ)
