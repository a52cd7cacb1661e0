"""Writes the reference pages made from the code itself: every entry point's flags, every NPDDP_* variable, the dump
columns, and what ``auto`` picks by the cost model.

    python docs/generate.py            # (re)write docs/reference/{cli,variables,dumps,auto}.md
    python docs/generate.py --check    # exit 1, naming the pages, if any is not what the code makes now

Run it before ``mkdocs build``; tests/test_docs_site.py checks the committed pages are current.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "reference"
#: argparse wraps help at the terminal's width: one fixed width, so a page does not depend on the terminal.
WIDTH = "100"


#: Every entry point, in the order the page lists them.
COMMANDS = ("npddp.train", "npddp.evaluate", "npddp.generate", "npddp.run", "npddp.tune", "npddp.check", "npddp.cluster",
            "npddp.process.cleanup")


def help_of(module: str) -> str:
    """What ``python -m MODULE --help`` prints, at a fixed width."""
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, "-m", module, "--help"], env={**os.environ, "COLUMNS": WIDTH, "PYTHONPATH": path},
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        raise SystemExit(f"python -m {module} --help: exit {proc.returncode}: {proc.stderr.strip()}")
    return proc.stdout.rstrip()


def cli() -> str:
    """Every entry point's ``--help``, as its parser prints it."""
    parts = ["# Command-line flags\n",
             "Every entry point's `--help`, generated from its parser (for `npddp.train`, the `Config` dataclass "
             "feeds the parser) by `python docs/generate.py`. How to use them: [the training CLI](../guide/training.md), "
             "[launching](../guide/launching.md), [the emulated cluster](../guide/cluster.md).\n"]
    with ThreadPoolExecutor(len(COMMANDS)) as pool:
        helps = list(pool.map(help_of, COMMANDS))
    parts += [f"## `python -m {module}`\n\n```text\n{text}\n```\n" for module, text in zip(COMMANDS, helps)]
    return "\n".join(parts)


def variables() -> str:
    """Every ``NPDDP_*`` variable, from :mod:`npddp.util.variables`."""
    from npddp.util import variables as v

    return ("# Environment variables\n\n"
            "Every `NPDDP_*` variable npddp reads or sets, generated from its one declaration in "
            "`npddp/util/variables.py` (`python -m npddp.util.variables --markdown` prints the same table). "
            "Flags take `1`, `true`, `yes`, `on` or `0`, `false`, `no`, `off`; unset or empty takes the default.\n\n"
            + f"{v.BEGIN_MARK}\n{v.markdown().rstrip()}\n{v.END_MARK}\n")


def dumps() -> str:
    """Every kind of benchmark dump: its root attributes, columns and raw arrays, from :mod:`npddp.results.columns`."""
    from npddp.results import columns as c

    def cell(text: str) -> str:
        return str(text).replace("|", "\\|").replace("\n", " ")

    parts = ["# Benchmark dump format\n",
             "A benchmark dump is an HDF5 file holding one flat table, one row per measurement; "
             "[`npddp.results`](results.md) checks and reads it. Every kind's attributes, columns and raw arrays, "
             "generated from `npddp/results/columns.py`: `python docs/generate.py`. Units: `B` bytes, `s`/`ms` "
             "seconds/milliseconds, `GB/s` with GB = 1e9 B, `MiB` = 2**20 B, `1` a dimensionless ratio.\n"]
    for kind in c.KINDS.values():
        parts.append(f"## `{kind.name}`\n\n{cell(kind.doc)}\n")
        for title, cols in (("Root attributes", kind.attrs), ("Columns", kind.columns)):
            if cols:
                rows = [f"| `{col.name}` | {col.type} | {col.unit or ''} | {cell(col.doc)} | {cell(col.expectation())} |"
                        for col in cols]
                parts.append(f"{title}:\n\n| name | type | unit | meaning | valid |\n|---|---|---|---|---|\n"
                             + "\n".join(rows) + "\n")
        if kind.raw:
            rows = [f"| `{r.name}` | {r.unit} | {cell(r.doc)} |" for r in kind.raw]
            parts.append("Raw arrays (one row per table row):\n\n| name | unit | meaning |\n|---|---|---|\n"
                         + "\n".join(rows) + "\n")
    return "\n".join(parts)


def _size(nbytes: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"


def _steps(table: list) -> str:
    """``[[max_bytes, algorithm], ..., [None, algorithm]]`` in words: "rd up to 64 KiB, then rabenseifner"."""
    parts = [f"`{name}` up to {_size(limit)}" if limit is not None else f"`{name}`" for limit, name in table]
    return ", then ".join(parts)


def auto() -> str:
    """What ``auto`` picks by the cost model (no measured table), from :mod:`npddp.comm.compose.costmodel`."""
    from npddp.comm.compose import costmodel as c

    ranks = (2, 4, 8, 16)
    settings = [("One node, shared memory off, over MPI", dict(transport="mpi")),
                ("One node, shared memory off, over TCP", dict(transport="tcp")),
                ("Across nodes, 1 rank per node", dict(transport="tcp", across_nodes=True)),
                ("Across nodes, 2 ranks per node", dict(transport="tcp", across_nodes=True, per_node=2)),
                ("Across nodes, 4 ranks per node", dict(transport="tcp", across_nodes=True, per_node=4))]
    parts = ["# What `auto` picks\n",
             "The table `auto` picks all-reduce algorithms from when no measured table is given (`NPDDP_TUNING` unset), "
             "per setting and world size: each algorithm up to the size where the next one becomes cheaper by the cost "
             "model. Generated from `npddp/comm/compose/costmodel.py` and the constants of `npddp/comm/engine/cost.py` "
             "by `python docs/generate.py`; why: [the cost model and `auto`](../design/auto.md). With every rank on one "
             "node and shared memory on (the default), `auto` runs `shm`, over MPI after MPI's own all-reduce up to a "
             "bound per MPI library (table below).\n"]
    for title, kw in settings:
        rows = [f"| {n} | {_steps(c.model_table(size=n, **kw))} |" for n in ranks
                if kw.get("per_node", 1) < n and n % kw.get("per_node", 1) == 0]
        parts.append(f"## {title}\n\n| ranks | algorithm by size |\n|---|---|\n" + "\n".join(rows) + "\n")
    rows = [f"| {name} | {_steps(c.node_table(2, name))} |" for name in c.LIBRARY_NODE_BYTES]
    parts.append("## One node, shared memory on, over MPI (any number of ranks above one)\n\n"
                 "| MPI library | algorithm by size |\n|---|---|\n" + "\n".join(rows) + "\n")
    return "\n".join(parts)


PAGES = {"cli.md": cli, "variables.md": variables, "dumps.md": dumps, "auto.md": auto}


def main(argv=None) -> int:
    """Write the generated pages, or with ``--check`` name those that differ from what the code makes."""
    parser = argparse.ArgumentParser(prog="python docs/generate.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a page is not current")
    args = parser.parse_args(argv)
    stale = []
    for name, make in PAGES.items():
        path, text = OUT / name, make()
        if args.check:
            if not path.exists() or path.read_text(encoding="utf-8") != text:
                stale.append(str(path.relative_to(ROOT)))
        elif not path.exists() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
    if stale:
        print(f"not current: {', '.join(stale)}; run python docs/generate.py", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
