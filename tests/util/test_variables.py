"""Every NPDDP_* variable is declared once: the readers, the generated docs table, no literal name elsewhere."""

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

from npddp.util import env, plugins, threads, variables
from npddp.util.tracing import DEFAULT_STEPS

ROOT = Path(__file__).resolve().parents[2]
DECLARATIONS = ROOT / "npddp" / "util" / "variables.py"
NAME = re.compile(r"NPDDP_[A-Z_]+")


def literal_names(path: Path) -> list[tuple[int, str]]:
    """(line, name) of every NPDDP_* name inside a string the code uses (docstrings and bare strings are prose)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    prose = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)
             and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)}
    return [(node.lineno, name) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in prose
            for name in NAME.findall(node.value)]


def test_no_module_spells_a_variable_name_outside_the_declarations():
    found = [f"{path.relative_to(ROOT)}:{line}: {name}"
             for folder in ("npddp", "benchmarks") for path in sorted((ROOT / folder).rglob("*.py"))
             if path != DECLARATIONS for line, name in literal_names(path)]
    assert not found, "use npddp.util.variables instead of these literals:\n" + "\n".join(found)


def test_the_literal_scan_sees_code_strings_and_f_strings_but_not_docstrings(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text('"""NPDDP_DOC"""\n\ndef f(x):\n    """NPDDP_DOC"""\n    return x.get("NPDDP_A"), f"NPDDP_B={x}"\n')
    assert sorted(literal_names(sample)) == [(5, "NPDDP_A"), (5, "NPDDP_B")]


def test_the_docs_table_is_the_generated_one():
    text = (ROOT / "docs" / "reference" / "variables.md").read_text(encoding="utf-8")
    assert variables.BEGIN_MARK in text and variables.END_MARK in text, "docs/reference/variables.md lost the table's markers"
    table = text.split(variables.BEGIN_MARK, 1)[1].split(variables.END_MARK, 1)[0].strip()
    assert table == variables.markdown(), "regenerate it: python -m npddp.util.variables --markdown"


def test_every_variable_is_declared_once_with_a_kind_and_a_meaning():
    names = [v.name for v in variables.VARIABLES]
    assert len(names) == len(set(names)) and all(n.startswith(variables.PREFIX) for n in names)
    assert all(v.kind and v.meaning for v in variables.VARIABLES)
    flags = [v for v in variables.VARIABLES if v.kind == "flag"]
    assert flags and all(v.default in ("on", "off") for v in flags)


def test_declared_defaults_are_the_ones_the_code_uses():
    from npddp.comm import DEFAULT_TIMEOUT
    assert variables.TIMEOUT.default == f"{DEFAULT_TIMEOUT:g}"
    assert variables.TRACE_STEPS.default == DEFAULT_STEPS


@pytest.mark.parametrize("variable", [variables.DEBUG, variables.CHECK_ARGS, variables.ABORT_ON_EXCEPTION,
                                      variables.AUTO_SHM, variables.SINGLE_COPY])
def test_one_flag_table_for_every_switch_with_empty_meaning_the_default(variable):
    default = variable.default == "on"
    assert variables.flag(variable, {}) is default
    assert variables.flag(variable, {variable.name: ""}) is default
    assert variables.flag(variable, {variable.name: "  "}) is default
    for raw in ("1", "true", "YES", " on "):
        assert variables.flag(variable, {variable.name: raw}) is True
    for raw in ("0", "False", "no", "OFF"):
        assert variables.flag(variable, {variable.name: raw}) is False
    with pytest.raises(ValueError, match=f"{variable.name}='maybe'") as info:
        variables.flag(variable, {variable.name: "maybe"})
    assert "valid: 1/true/yes/on or 0/false/no/off" in str(info.value)


def test_numbers_name_the_variable_and_the_valid_values():
    per_node = variables.RANKS_PER_NODE
    assert variables.integer(per_node, {}, minimum=1) is None
    assert variables.integer(per_node, {per_node.name: " 4 "}, minimum=1) == 4
    for raw in ("0", "two", "-1"):
        with pytest.raises(ValueError, match=rf"{per_node.name}='{raw}' is out of range; valid: an integer >= 1"):
            variables.integer(per_node, {per_node.name: raw}, minimum=1)
    timeout = variables.TIMEOUT
    assert variables.number(timeout, {timeout.name: "inf"}) == float("inf")
    assert variables.number(timeout, {timeout.name: ""}) is None
    with pytest.raises(ValueError, match=rf"{timeout.name}='soon' is not a number; valid: seconds"):
        variables.number(timeout, {timeout.name: "soon"}, valid="seconds > 0")


def test_the_markdown_command_prints_the_table():
    done = subprocess.run([sys.executable, "-m", "npddp.util.variables", "--markdown"], capture_output=True,
                          text=True, cwd=ROOT, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == variables.markdown(), done.stderr


def test_mpi_live_never_imports_or_initializes_mpi():
    script = ("import sys; from npddp.util import env; live = env.mpi_live(); "
              "print(live is None, 'mpi4py.MPI' in sys.modules, 'mpi4py' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert done.stdout.split() == ["True", "False", "False"], done.stderr


def test_mpi_live_is_the_module_only_between_init_and_finalize(monkeypatch):
    class FakeMPI:
        def __init__(self, initialized, finalized):
            self.state = initialized, finalized

        def Is_initialized(self):
            return self.state[0]

        def Is_finalized(self):
            return self.state[1]

    for initialized, finalized, live in ((False, False, False), (True, False, True), (True, True, False)):
        fake = FakeMPI(initialized, finalized)
        monkeypatch.setitem(sys.modules, "mpi4py.MPI", fake)
        assert (env.mpi_live() is fake) is live


@pytest.mark.parametrize("argv, named", [
    (["--plugin", "a", "--backend", "x", "--plugin=b.py"], ["a", "b.py"]),
    (["--plugin=a,b", "--plugin", "c"], ["a,b", "c"]), (["--backend", "ring", "--plugin"], []), ([], [])])
def test_one_pre_scan_finds_plugins_in_either_spelling_in_order(argv, named):
    assert plugins.named(argv) == named


def test_the_plugin_loader_names_the_bad_module(tmp_path):
    with pytest.raises(ValueError, match=r"--plugin 'no_such_module_here' cannot be imported"):
        plugins.load(["no_such_module_here"])
    broken = tmp_path / "broken.py"
    broken.write_text("raise RuntimeError('boom')\n")
    with pytest.raises(ValueError, match=r"raised RuntimeError while imported: boom"):
        plugins.load([str(broken)])
    assert plugins.split(" a, ,b ") == ["a", "b"]


@pytest.mark.parametrize("setting, environ, expected", [
    (None, {"LOCAL_WORLD_SIZE": "4"}, None), ("auto", {"LOCAL_WORLD_SIZE": "1"}, None),
    ("auto", {"LOCAL_WORLD_SIZE": "4", "OMP_NUM_THREADS": "2"}, None), (3, {"LOCAL_WORLD_SIZE": "1"}, 3),
    ("auto", {"LOCAL_WORLD_SIZE": "4"}, "rule")])
def test_a_scripts_share_follows_the_one_thread_rule(setting, environ, expected):
    got = threads.share(setting, environ)
    assert got == (threads.auto_threads(environ, ask_mpi=False)[0] if expected == "rule" else expected)
