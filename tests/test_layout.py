"""The package's shape, read from the source: no function longer than a screen; tests that stand on helpers, not on
each other."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "npddp"
TESTS = Path(__file__).resolve().parent
#: The most lines a function may span, its signature and docstring included.
MAX_FUNCTION_LINES = 60


def long_functions(root: Path, limit: int) -> list[str]:
    """``path:line name (N lines)`` for every function or method under ``root`` longer than ``limit``."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > limit:
                    found.append(f"{path.relative_to(root.parent)}:{node.lineno} {node.name} ({lines} lines)")
    return found


def test_no_function_in_the_package_is_longer_than_sixty_lines():
    too_long = long_functions(PACKAGE, MAX_FUNCTION_LINES)
    assert not too_long, f"split these into named steps (at most {MAX_FUNCTION_LINES} lines each): {too_long}"


def test_the_check_finds_a_long_function(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    body = "".join(f"        x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES))
    (package / "long.py").write_text(f"def short():\n    return 1\n\n\nclass A:\n    def long(self):\n{body}")
    assert long_functions(package, MAX_FUNCTION_LINES) == [f"pkg/long.py:6 long ({MAX_FUNCTION_LINES + 1} lines)"]


def imported_modules(tree: ast.AST, top: Path) -> list[tuple[int, str]]:
    """(line, module) of every import in ``tree``, at any depth; ``from a import b`` gives a, and a.b where b is a
    module under ``top`` (the folder holding a)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.append((node.lineno, node.module))
            for alias in node.names:
                where = top.joinpath(*node.module.split("."), alias.name)
                if where.with_suffix(".py").exists() or where.is_dir():
                    found.append((node.lineno, f"{node.module}.{alias.name}"))
    return found


def imports_of_tests(root: Path) -> list[str]:
    """``path:line module`` for every import under ``root`` of a test module (``test_*``) or a conftest."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for line, module in imported_modules(ast.parse(path.read_text(), str(path)), root.parent):
            last = module.rsplit(".", 1)[-1]
            if module.split(".")[0] == root.name and (last.startswith("test_") or last == "conftest"):
                found.append(f"{path.relative_to(root.parent)}:{line} {module}")
    return sorted(set(found))


def test_no_test_imports_a_test_module_or_a_conftest():
    found = imports_of_tests(TESTS)
    assert not found, f"move what these share into tests/helpers (conftests keep fixtures and hooks): {found}"


def test_the_check_finds_an_import_of_a_test_module_or_a_conftest(tmp_path):
    tests = tmp_path / "tests"
    (tests / "sub").mkdir(parents=True)
    (tests / "helpers.py").write_text("import os\nfrom tests import helpers\n\n\ndef test_like():\n    pass\n")
    (tests / "sub" / "conftest.py").write_text("")
    (tests / "sub" / "test_b.py").write_text("x = 1\n")
    (tests / "sub" / "test_a.py").write_text("from tests.sub.test_b import x\n\n\ndef f():\n    import tests.conftest\n")
    (tests / "sub" / "test_c.py").write_text("from tests.sub import conftest\nfrom tests.helpers import test_like\n")
    assert imports_of_tests(tests) == ["tests/sub/test_a.py:1 tests.sub.test_b", "tests/sub/test_a.py:5 tests.conftest",
                                       "tests/sub/test_c.py:1 tests.sub.conftest"]
