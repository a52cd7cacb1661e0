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


def comm_level(name: str) -> int:
    """Index in :data:`COMM_LEVELS` of comm module ``name`` (``npddp.comm.x.y``)."""
    first = name.split(".")[2] if name.count(".") >= 2 else ""
    for index, (_, members) in enumerate(COMM_LEVELS):
        if first in members:
            return index
    raise AssertionError(f"{name} is in no level of COMM_LEVELS; add it where it belongs")


COMM = sorted(n for n in modules() if n == "npddp.comm" or n.startswith("npddp.comm."))


@pytest.mark.parametrize("name", COMM)
def test_inside_comm_every_import_goes_down_or_stays_level(name):
    mine = comm_level(name)
    upward = sorted(f"{t} ({COMM_LEVELS[comm_level(t)][0]})" for t in graph()[name]
                    if t in COMM and comm_level(t) > mine)
    assert not upward, f"{name} ({COMM_LEVELS[mine][0]}) imports upward inside comm: {upward}"


#: Inside train, top to bottom: a module imports only from its own floor and the floors below it.
#: Each entry: a floor and the train modules (or subpackages) on it.
TRAIN_FLOORS = (
    ("commands", ("__main__", "cli", "evaluate", "generate")),    # parse flags, run: python -m npddp.train/...
    ("loop", ("trainer", "engines")),                              # the training loop; its engine from Config
    ("checkpoint", ("checkpoint",)),                               # files of a run and resuming one
    ("sharding", ("sharding",)),                                   # --zero's optimizers and memory line
    ("console", ("console",)),                                     # what is printed and written as metrics
    ("config", ("config", "faults")),                              # the flags as one dataclass, their values read
    ("base", ("models", "")),                             # decisions shared by ranks, model builders
)


def train_floor(name: str) -> int:
    """Index in :data:`TRAIN_FLOORS` of train module ``name`` (``npddp.train.x.y``), counted from the top."""
    first = name.split(".")[2] if name.count(".") >= 2 else ""
    for index, (_, members) in enumerate(TRAIN_FLOORS):
        if first in members:
            return index
    raise AssertionError(f"{name} is on no floor of TRAIN_FLOORS; add it where it belongs")


TRAIN = sorted(n for n in modules() if n == "npddp.train" or n.startswith("npddp.train."))


@pytest.mark.parametrize("name", TRAIN)
def test_inside_train_every_import_goes_down_or_stays_level(name):
    mine = train_floor(name)
    upward = sorted(f"{t} ({TRAIN_FLOORS[train_floor(t)][0]})" for t in graph()[name]
                    if t in TRAIN and train_floor(t) < mine)
    assert not upward, f"{name} ({TRAIN_FLOORS[mine][0]}) imports upward inside train: {upward}"


def test_the_floor_checks_catch_a_loop_importing_the_cli_and_a_circle_through_the_console():
    """Both checks see the two upward imports train once had (trainer -> cli, config -> console)."""
    def upward(name, target):
        return train_floor(target) < train_floor(name)
    assert upward("npddp.train.trainer", "npddp.train.cli.validate")
    assert upward("npddp.train.config", "npddp.train.console.printer")
    assert not upward("npddp.train.console.banner", "npddp.train.config")
