"""The package's shape in numbers: module sizes, imports per folder, upward imports, circles, public
names, and the files that name one built-in of each kind of extension.

    python benchmarks/layout.py              # this checkout
    python benchmarks/layout.py --root DIR   # another checkout (git worktree add DIR <commit>)

The import graph and the layer rules are the checkout's own ``tests/test_layers.py`` (loaded from
``DIR``), so every commit is measured by the rules it kept; the public names are imported from ``DIR``.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

#: Each kind of extension and one built-in of it: the files whose code names it (literal: in a string, not a
#: docstring; field: also as an attribute, variable or keyword) or import it (imports) are what a new one of
#: that kind is added to, or passed through, beside its own file.
PROBES = {
    "algorithm (the rabenseifner all-reduce)": ("literal", "rabenseifner"),
    "transport (tcp)": ("literal", "tcp"),
    "comm hook (powersgd)": ("literal", "powersgd"),
    "flag (--topk-ratio)": ("field", "topk_ratio"),
    "parallelism strategy (ZeRO-2/3's engine)": ("imports", "ZeroDataParallel"),
}


def load_layers(root: Path):
    """The checkout's ``tests/test_layers.py`` as a module: its import graph, ALLOWED and layer()."""
    spec = importlib.util.spec_from_file_location("_layers_of_checkout", root / "tests" / "test_layers.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm, iterative)."""
    index, low, on_stack, stack, found, counter = {}, {}, set(), [], [], [0]

    def connect(start):
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter[0]
                    counter[0] += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    group = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        group.append(member)
                        if member == node:
                            break
                    if len(group) > 1:
                        found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return found


def code_strings(tree: ast.AST) -> list[str]:
    """Every string constant of a module that is not a docstring."""
    docs = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docs.add(id(first.value))
    return [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
            and id(n) not in docs]


def naming_files(root: Path, kind: str, probe: str) -> list[str]:
    """The package's files whose code names ``probe`` (as a word in a string) or import a name ``probe``."""
    word = re.compile(rf"(?<![\w-]){re.escape(probe)}(?![\w-])")
    hits = []
    for path in sorted((root / "npddp").rglob("*.py")):
        tree = ast.parse(path.read_text())
        if kind in ("literal", "field"):
            hit = any(word.search(s) for s in code_strings(tree)) or kind == "field" and any(
                probe in (getattr(n, "attr", None), getattr(n, "id", None), getattr(n, "arg", None))
                for n in ast.walk(tree))
        else:
            hit = any(isinstance(n, ast.ImportFrom) and any(a.name == probe for a in n.names) for n in ast.walk(tree))
        if hit:
            hits.append(str(path.relative_to(root)))
    return hits


def public_names(root: Path, module: str) -> int:
    """How many names ``module``'s ``__all__`` lists, imported from the checkout at ``root`` in a child process."""
    code = f"import {module} as m; print(len(m.__all__))"
    done = subprocess.run([sys.executable, "-c", code], cwd=root, env={**os.environ, "PYTHONPATH": str(root)},
                          capture_output=True, text=True, check=True)
    return int(done.stdout)


def report(root: Path) -> list[str]:
    """The lines this script prints for the checkout at ``root``."""
    layers = load_layers(root)
    graph = layers.graph() if hasattr(layers, "graph") else layers.GRAPH   # a checkout before the lazy graph
    sizes = {str(p.relative_to(root)): len(p.read_text().splitlines()) for p in (root / "npddp").rglob("*.py")}
    biggest = sorted(sizes.items(), key=lambda kv: -kv[1])[:6]
    upward = [(a, b) for a, targets in graph.items() for b in targets
              if layers.layer(b) != layers.layer(a) and layers.layer(a) in layers.ALLOWED
              and layers.layer(b) not in layers.ALLOWED[layers.layer(a)] and b != "npddp"]
    lines = [f"modules {len(sizes)}, lines {sum(sizes.values())}, lines per module: median "
             f"{statistics.median(sizes.values()):.0f}, max {max(sizes.values())}",
             "largest: " + ", ".join(f"{p.removeprefix('npddp/')} {n}" for p, n in biggest),
             f"import edges {sum(map(len, graph.values()))}, upward {len(upward)}, "
             f"circles {len(circles(graph))}", "layer: modules, imports inside it / to other layers"]
    for name in sorted({layers.layer(m) for m in graph}):
        members = [m for m in graph if layers.layer(m) == name]
        inside = sum(1 for m in members for t in graph[m] if layers.layer(t) == name)
        out = sum(1 for m in members for t in graph[m] if layers.layer(t) != name)
        lines.append(f"  {name:<10} {len(members):>3}  {inside:>3} / {out:<3}")
    lines.append("public names (__all__): " + ", ".join(
        f"{m} {public_names(root, m)}" for m in ("npddp", "npddp.comm", "npddp.parallel")))
    lines.append("files whose code names one built-in (what a new one is added to, beside its own file):")
    for label, (kind, probe) in PROBES.items():
        hits = naming_files(root, kind, probe)
        pages = [p.name for p in sorted([root / "README.md", *(root / "docs").glob("*.md")])
                 if re.search(rf"(?<![\w-]){re.escape(probe)}(?![\w-])", p.read_text(encoding="utf-8"))]
        lines.append(f"  {label}: {len(hits)} (docs pages naming it: {len(pages)}): "
                     + " ".join(h.removeprefix("npddp/") for h in hits))
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1],
                        help="the checkout to measure (default: this one)")
    args = parser.parse_args(argv)
    if not (args.root / "npddp").is_dir() or not (args.root / "tests" / "test_layers.py").exists():
        parser.error(f"--root {args.root} holds no npddp/ and tests/test_layers.py")
    print("\n".join(report(args.root.resolve())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
