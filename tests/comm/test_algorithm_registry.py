"""Algorithms by collective: the built-ins register from their own files through the public call, each collective
has its own names, and one registration reaches every list of names (auto's candidates, create, npddp.check)."""

import importlib
import re
import sys
import textwrap
from pathlib import Path

import pytest

from npddp.comm import BACKENDS, backend_names, register_algorithm
from npddp.comm.algorithms import registry
from npddp.comm.algorithms.api import Cost
from npddp.comm.algorithms.ring import Ring
from npddp.comm.compose.costmodel import CANDIDATES, candidates
from npddp.tools import check


ROOT = Path(__file__).resolve().parents[2]


def _free(nbytes, size, chunk_bytes=None):
    return Cost(0, 0, 0)


@pytest.fixture
def temporary():
    """Names registered during the test, forgotten after it: ``temporary.append((name, collective))``."""
    added: list = []
    yield added
    for name, collective in added:
        registry.unregister(name, collective)


def test_each_built_in_comes_from_its_own_file_through_register_algorithm():
    entries = registry.entries()
    assert [e.name for e in entries if e.builtin] == list(registry.ALGORITHMS) == list(BACKENDS[1:-3])
    for entry in entries:
        if entry.builtin:
            module = importlib.import_module(entry.cls.__module__)
            assert module.__name__ == f"npddp.comm.algorithms.{entry.name}" and entry.help and entry.collective == \
                "allreduce", entry
            assert entry.cost is entry.cls.cost and callable(entry.cost)
    assert CANDIDATES == registry.names(builtin=True, auto=True) == ("rabenseifner", "rd", "ring", "tree")
    assert "naive" in registry.ALGORITHMS and "naive" not in candidates()


def test_collectives_keep_their_own_names(temporary):
    for collective in registry.COLLECTIVES:
        register_algorithm("only_here", Ring, collective=collective, auto=False, help="a test's")
        temporary.append(("only_here", collective))
        others = [c for c in registry.COLLECTIVES if c != collective and ("only_here", c) not in temporary]
        assert "only_here" in registry.names(collective) and all("only_here" not in registry.names(c) for c in others)
        assert registry.algorithm("only_here", collective) is Ring
    assert registry.names("allgather", builtin=False) == ("only_here",)
    with pytest.raises(ValueError, match="unknown collective 'gather'; valid: allreduce, allgather, reduce_scatter"):
        register_algorithm("x", Ring, collective="gather")
    valid = ", ".join(registry.names("allgather"))
    assert valid.endswith("only_here")
    with pytest.raises(ValueError, match=f"unknown all-gather algorithm 'nope'; valid: {valid}$"):
        registry.algorithm("nope", "allgather")


def _gen(peers, buf):
    yield


@pytest.mark.parametrize("name, fn, kwargs, error, text", [
    ("ring", _gen, {}, ValueError, "'ring' is built in"),
    ("auto", _gen, {}, ValueError, "'auto' is built in"),
    ("hier", Ring, {"collective": "broadcast"}, ValueError, "'hier' is built in"),
    ("no_cost", _gen, {"auto": True}, ValueError, "auto=True needs a cost"),
    ("gen_gather", _gen, {"collective": "allgather"}, TypeError, r"a generator function fn\(peers, buf\) is an all-reduce's"),
])
def test_a_taken_name_a_generator_for_another_collective_or_auto_without_a_cost_is_refused(name, fn, kwargs, error,
                                                                                            text):
    before = {c: registry.names(c) for c in registry.COLLECTIVES}
    with pytest.raises(error, match=text):
        register_algorithm(name, fn, **kwargs)
    assert before == {c: registry.names(c) for c in registry.COLLECTIVES}


def test_one_registration_reaches_auto_the_help_and_check(temporary):
    register_algorithm("tmp_algo", Ring, cost=_free, help="a test's free algorithm")
    temporary.append(("tmp_algo", "allreduce"))
    assert "tmp_algo" in candidates() and "tmp_algo" in backend_names() and "tmp_algo" not in BACKENDS
    assert check.parse_args(["--backend", "tmp_algo"]).backend == "tmp_algo"
    from npddp.train.cli.parser import build_parser
    action = next(a for a in build_parser()._actions if "--backend" in a.option_strings)
    text = action.help
    assert text.index("tree (up a binomial") < text.index("tmp_algo (a test's free algorithm)") < text.index("auto (")
    assert "tmp_algo" in action.choices
    register_algorithm("no_auto", Ring, cost=_free, auto=False)
    temporary.append(("no_auto", "allreduce"))
    assert "no_auto" in backend_names() and "no_auto" not in candidates()


def test_a_new_file_in_the_folder_is_a_built_in_everywhere(tmp_path, monkeypatch):
    """What adding a built-in algorithm takes: one file in npddp/comm/algorithms/ (here a copy of the ring)."""
    (tmp_path / "tmp_builtin.py").write_text(textwrap.dedent('''
        from npddp.comm.algorithms.api import register_algorithm
        from npddp.comm.algorithms.ring import Ring


        class TmpBuiltin(Ring):
            """The ring under another name."""


        register_algorithm("tmp_builtin", TmpBuiltin, auto=True, help="a test's copy of the ring")
    '''))
    import npddp.comm.algorithms as folder
    monkeypatch.setattr(folder, "__path__", [*folder.__path__, str(tmp_path)])
    monkeypatch.setattr(registry, "REGISTRIES", {c: r.copy() for c, r in registry.REGISTRIES.items()})
    monkeypatch.delitem(sys.modules, "npddp.comm.algorithms.tmp_builtin", raising=False)
    registry._import_builtins()   # what importing npddp.comm does
    sys.modules.pop("npddp.comm.algorithms.tmp_builtin")
    assert registry.names(builtin=True, auto=True) == (*CANDIDATES, "tmp_builtin")
    assert "tmp_builtin" in candidates() and "tmp_builtin" not in registry.costed()
    assert backend_names()[:len(BACKENDS) + 1] == (*BACKENDS[:-3], "tmp_builtin", *BACKENDS[-3:])
    assert check.parse_args(["--backend", "tmp_builtin"]).backend == "tmp_builtin"
    from npddp.train.cli.parser import build_parser
    action = next(a for a in build_parser()._actions if "--backend" in a.option_strings)
    assert "tree (up a binomial tree and back down), tmp_builtin (a test's copy of the ring), " in action.help
    assert "tmp_builtin" in action.choices


def _tables(page: str) -> list[list[list[str]]]:
    """Every markdown table of ``page``: rows of cells, the header and rule left out."""
    tables, rows = [], []
    for line in (ROOT / page).read_text(encoding="utf-8").splitlines() + [""]:
        if line.startswith("|"):
            rows.append([cell.strip() for cell in line.strip("|").split("|")])
        elif rows:
            tables.append(rows[2:])
            rows = []
    return tables


def test_the_docs_table_of_algorithms_is_the_registry():
    spelled = {"yes": True, "no": False}
    expected = [[registry.SPELLED[e.collective], f"`{e.name}`", "yes" if e.auto else "no", e.help]
                for c in registry.COLLECTIVES for e in registry.entries(c) if e.builtin]
    table = next(t for t in _tables("docs/guide/comm.md") if t and t[0][0] in map(registry.SPELLED.get, registry.COLLECTIVES)
                 and t[0][2] in spelled)
    assert table == expected, "docs/guide/comm.md's table of algorithms should read:\n" + "\n".join(
        "| " + " | ".join(row) + " |" for row in expected)


@pytest.mark.parametrize("page", ["README.md", "docs/guide/comm.md"])
def test_the_pages_tables_of_backends_name_every_built_in_algorithm(page):
    """Each table whose first column names backends or algorithms names exactly the built-ins, besides the rest."""
    others, known = {"mpi", *registry.COMPOSED}, {"mpi", *registry.COMPOSED, *registry.ALGORITHMS}
    tables = [[set(re.findall(r"`(\w+)`", row[0])) for row in t] for t in _tables(page)]
    tables = [named for named in tables if named and all(names and names <= known for names in named)]
    assert tables, f"{page} has no table of backends"
    for named in tables:
        assert set().union(*named) - others == set(registry.ALGORITHMS), (page, named)


def test_plugins_written_against_the_former_address_still_import():
    from npddp.comm import algorithm, algorithms
    from npddp.comm.algorithms import api
    assert algorithms.__doc__ and [getattr(algorithm, n) for n in algorithm.__all__] == \
        [api.Cost, api.Peers, api.Request, api.block_bounds, api.register_algorithm] == \
        [getattr(api, n) for n in algorithm.__all__]
