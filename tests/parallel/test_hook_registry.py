"""The comm hook registry: the built-ins come through it, and a ``--plugin`` module's hook is a ``--comm-hook`` choice."""

import re

import pytest

from npddp.parallel import hook_registry
from npddp.parallel.hooks import allreduce_hook
from tests.helpers.cli import TINY, ok, train

PLUGIN = '''
from npddp.parallel.hook_registry import register_comm_hook_factory
from npddp.parallel.hooks import allreduce_prescaled


def build(comm, settings):
    print(f"prescaled hook built on rank {comm.rank} of {comm.size}, seed {settings.seed}", flush=True)
    return comm, allreduce_prescaled


register_comm_hook_factory("prescaled", build, "divide by the size, then sum")
'''


def test_the_builtin_hooks_are_registered_in_order_with_their_help():
    assert hook_registry.comm_hook_names()[:4] == hook_registry.HOOKS == ("allreduce", "fp16", "topk", "powersgd")
    assert hook_registry.build_comm_hook("allreduce", "the comm", None) == ("the comm", allreduce_hook)
    assert hook_registry.comm_hook_help().startswith("allreduce (the average over ranks), fp16 (")


@pytest.mark.parametrize("name, build, error, text", [
    ("allreduce", lambda comm, s: (comm, allreduce_hook), ValueError, "comm hook 'allreduce' is already registered"),
    ("two words", lambda comm, s: (comm, allreduce_hook), ValueError, "must be a Python identifier"),
    ("", lambda comm, s: (comm, allreduce_hook), ValueError, "got ''"),
    ("nohook", "allreduce", TypeError, "build must be a function"),
])
def test_a_bad_registration_is_refused_and_registers_nothing(name, build, error, text):
    before = hook_registry.comm_hook_names()
    with pytest.raises(error, match=text):
        hook_registry.register_comm_hook_factory(name, build, "help")
    assert hook_registry.comm_hook_names() == before


@pytest.mark.slow
def test_a_plugin_registered_comm_hook_is_accepted_by_the_cli(tmp_path):
    (tmp_path / "myhooks.py").write_text(PLUGIN)
    proc = ok(train(tmp_path, "--plugin", "myhooks.py", "--comm-hook", "prescaled", *TINY, n=2))
    built = re.findall(r"prescaled hook built on rank (\d) of 2, seed 0", proc.stdout)   # ranks' lines may interleave
    assert sorted(built) == ["0", "1"] and "comm hook prescaled" in proc.stdout, proc.stdout
    shown = ok(train(tmp_path, "--plugin", "myhooks.py", "--help", n=None))
    assert "prescaled (divide by the size, then sum)" in " ".join(shown.stdout.split())
    refused = train(tmp_path, "--comm-hook", "prescaled", n=None)
    assert refused.returncode == 2 and "invalid choice: 'prescaled'" in refused.stderr, refused.stderr


def test_plugins_written_against_the_former_address_still_import():
    from npddp.parallel import builtin
    assert [getattr(builtin, n) for n in builtin.__all__] == [getattr(hook_registry, n) for n in builtin.__all__]
    assert builtin.register_comm_hook_factory is hook_registry.register_comm_hook_factory
