"""benchmarks/layout.py: the package's shape in numbers, read from a checkout."""

from pathlib import Path

from benchmarks import layout

ROOT = Path(__file__).resolve().parents[2]


def test_circles_are_found_and_only_circles():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set(), "f": {"f"}}
    assert layout.circles(graph) == [["a", "b", "c"]]
    assert layout.circles({"a": {"b"}, "b": set()}) == []


def test_this_checkout_has_no_upward_import_no_circle_and_names_its_builtins():
    lines = layout.report(ROOT)
    edges = next(line for line in lines if line.startswith("import edges"))
    assert edges.endswith("upward 0, circles 0"), edges
    algorithm = next(line for line in lines if line.lstrip().startswith("algorithm"))
    assert "costmodel.py" in algorithm, algorithm        # CANDIDATES names every built-in all-reduce


def test_a_built_in_named_only_in_a_docstring_does_not_count(tmp_path):
    (tmp_path / "npddp").mkdir()
    (tmp_path / "npddp" / "a.py").write_text('"""Mentions rabenseifner."""\nX = 1\n')
    (tmp_path / "npddp" / "b.py").write_text('NAMES = ("ring", "rabenseifner")\n')
    assert layout.naming_files(tmp_path, "literal", "rabenseifner") == ["npddp/b.py"]
