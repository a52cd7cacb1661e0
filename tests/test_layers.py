"""The package's layers, read from the source: who may import whom, and no circle between modules."""

import ast
import functools
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "npddp"
#: Each layer and the layers it may import (besides itself); util is the floor, the faces are the top.
ALLOWED = {
    "util": set(),
    "comm": {"util"},
    "nn": {"util"}, "data": {"util"}, "optim": {"util", "nn"},
    "parallel": {"util", "comm", "nn", "data", "optim"},
    "process": {"util", "comm"},
    "checkpoint": {"util", "comm", "nn", "data", "optim", "parallel", "process"},
    "train": {"util", "comm", "nn", "data", "optim", "parallel", "process", "checkpoint"},
    "tools": {"util", "comm", "process"},
    "tune": {"tools"}, "check": {"tools"},
    "run": {"process"}, "evaluate": {"train"}, "__init__": set(),
    "generate": {"train"},
    "cluster": {"util", "process"},
    "results": {"util"},
}


def modules() -> dict[str, Path]:
    """Dotted module name -> file, for every module of the package."""
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def imports_of(name: str, path: Path, known: dict) -> set[str]:
    """The package modules ``name`` imports anywhere in its file (module level or inside functions)."""
    found = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1] + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        found |= {t for t in targets if t in known and t != name}
    return found


def layer(name: str) -> str:
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


@functools.cache
def graph() -> dict:
    """Module name -> the package modules it imports (parsed on first use, not at collection)."""
    return {name: imports_of(name, path, modules()) for name, path in modules().items()}


@pytest.mark.parametrize("name", sorted(modules()))
def test_every_module_imports_only_its_own_and_lower_layers(name):
    mine = layer(name)
    assert mine in ALLOWED, f"{name} is in no known layer; add {mine!r} to ALLOWED"
    upward = sorted(t for t in graph()[name] if layer(t) != mine and layer(t) not in ALLOWED[mine]
                    and t != "npddp")
    assert not upward, f"{name} ({mine}) imports {upward}, outside the layers it may use: {sorted(ALLOWED[mine])}"


def test_no_two_modules_import_each_other_even_indirectly():
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph()[node]):
            if state.get(nxt) == "open":
                cycle = stack[stack.index(nxt):] + [nxt]
                pytest.fail("import circle: " + " -> ".join(cycle))
            if nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = "done"

    for node in sorted(graph()):
        if node not in state:
            visit(node)


def test_the_package_root_holds_at_most_eight_modules_and_every_subpackage_says_what_it_holds():
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= 8, f"npddp/ holds {len(top)} modules directly: {top}"
    for init in PACKAGE.rglob("__init__.py"):
        doc = ast.get_docstring(ast.parse(init.read_text()))
        assert doc, f"{init.relative_to(PACKAGE.parent)} has no docstring saying what the subpackage holds"


#: Inside comm, bottom to top: a module imports only from its own level and the levels below it.
#: Each entry: a level and the comm modules (or subpackages) in it.
COMM_LEVELS = (
    ("contracts", ("checks", "base", "signature", "contract", "status")),  # argument checks, the protocol, signatures
    ("transports", ("transports",)),                               # the Transport seam and its built-ins
    ("engine", ("engine",)),                                       # deadlines, calls, scratch, work, cost
    ("algorithms", ("algorithms", "algorithm")),                   # one file per algorithm, their registry, the API
    ("communicators", ("communicators", "mpi", "mpi_calls", "mpi_carried")),   # an algorithm over a transport; MPI's own
    ("node", ("node",)),                                           # shared memory on a node
    ("compose", ("compose",)),                                     # auto, hier
    ("wrappers", ("wrappers",)),                                   # debug, progress thread
    ("create", ("backends", "")),                                  # names -> backends; npddp.comm itself
)


def level_of(name: str, levels: tuple) -> int:
    """Index in ``levels`` (bottom to top) of module ``name`` (``npddp.<package>.x.y``) of that package."""
    first = name.split(".")[2] if name.count(".") >= 2 else ""
    for index, (_, members) in enumerate(levels):
        if first in members:
            return index
    raise AssertionError(f"{name} is in no level of its package's levels; add it where it belongs")


#: Inside train, bottom to top: a module imports only from its own floor and the floors below it.
#: Each entry: a floor and the train modules (or subpackages) on it.
TRAIN_FLOORS = (
    ("base", ("models", "")),                                      # model builders; npddp.train itself
    ("config", ("config", "faults")),                              # the flags as one dataclass, their values read
    ("console", ("console",)),                                     # what is printed and written as metrics
    ("sharding", ("sharding",)),                                   # --zero's optimizers and memory line
    ("checkpoint", ("checkpoint",)),                               # files of a run and resuming one
    ("loop", ("trainer", "engines")),                              # the training loop; its engine from Config
    ("commands", ("__main__", "cli", "evaluate", "generate")),    # parse flags, run: python -m npddp.train/...
)
#: The packages whose inside runs one way, each with its levels.
INSIDE = {"comm": COMM_LEVELS, "train": TRAIN_FLOORS}


def _inside(package: str) -> list[str]:
    return sorted(n for n in modules() if n == f"npddp.{package}" or n.startswith(f"npddp.{package}."))


@pytest.mark.parametrize("package, name", [(p, n) for p in INSIDE for n in _inside(p)])
def test_inside_comm_and_train_every_import_goes_down_or_stays_level(package, name):
    levels, members = INSIDE[package], set(_inside(package))
    mine = level_of(name, levels)
    upward = sorted(f"{t} ({levels[level_of(t, levels)][0]})" for t in graph()[name]
                    if t in members and level_of(t, levels) > mine)
    assert not upward, f"{name} ({levels[mine][0]}) imports upward inside {package}: {upward}"


def test_the_floor_checks_catch_a_loop_importing_the_cli_and_a_circle_through_the_console():
    """Both checks see the two upward imports train once had (trainer -> cli, config -> console)."""
    def upward(name, target):
        return level_of(target, TRAIN_FLOORS) > level_of(name, TRAIN_FLOORS)
    assert upward("npddp.train.trainer", "npddp.train.cli.validate")
    assert upward("npddp.train.config", "npddp.train.console.printer")
    assert not upward("npddp.train.console.banner", "npddp.train.config")
