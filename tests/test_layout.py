"""The package's shape, read from the source: no function longer than a screen."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "npddp"
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
