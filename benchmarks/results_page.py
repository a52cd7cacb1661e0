"""Write a results page's tables and figures from the HDF5 dumps kept beside it.

A page ``docs/results/<study>.md`` keeps its dumps in ``docs/results/<study>/``. Each generated
part sits between a marker and ``<!-- end -->``; the marker says what to draw::

    <!-- table allreduce.h5 rows=bytes cols=backend values=time_median_s scale=1e6 fmt=.1f
         where=place:outofplace title="Median time (us)" -->
    (generated: a line naming the command, commit, machine and load, then the table)
    <!-- end -->

    <!-- figure allreduce.h5 name=busbw x=bytes y=busbw_GBps series=backend title="Bus bandwidth (GB/s)" -->
    (generated: the image link; the PNG is written beside the dumps)
    <!-- end -->

Table options: ``columns=a,b,c`` (a plain table) or ``rows=R cols=C values=V`` (one row per value of R,
one column per value of C); ``where=col:value,col:value`` keeps matching rows; ``scale`` multiplies the
values; ``fmt`` is their format (default: about 3 digits, no exponent); ``ratio=NAME`` divides each row by its column NAME
and leaves that column out. A ``bytes`` column reads as 1K, 4M. Figure options: ``name`` (the PNG's
stem), ``x``, ``y``, ``series``, ``where``, ``scale``, ``title``; sizes go on a log axis.

``python -m benchmarks.results_page docs/results/PAGE.md ...`` rewrites the pages (every page under
docs/results with none named); ``--check`` rewrites nothing and exits 1 naming each page whose
generated parts differ from what its dumps make now.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import sys
from pathlib import Path

import numpy as np

from benchmarks._common import format_size
from npddp.results import read_meta, read_table

RESULTS_DIR = Path(__file__).resolve().parent.parent / "docs" / "results"
END = "<!-- end -->"
_BLOCK = re.compile(r"<!-- (table|figure) (.*?)-->\n(.*?)" + re.escape(END), re.S)
_TABLE_KEYS = {"columns", "rows", "cols", "values", "where", "scale", "fmt", "ratio", "title"}
_FIGURE_KEYS = {"name", "x", "y", "series", "where", "scale", "title"}
#: The launcher and module each benchmark's argv is shown with (argv holds the arguments only).
_MODULES = {"allreduce_sweep": "benchmarks.collectives", "ddp_breakdown": "benchmarks.ddp",
            "weak_scaling": "benchmarks.ddp", "torch_compare": "benchmarks.compare_torch",
            "naive_ddp": "benchmarks.naive_ddp", "parallelism": "benchmarks.parallelism",
            "mpi_algorithms": "benchmarks.mpi_algorithms"}


class PageError(ValueError):
    """A marker that cannot be drawn: names the page, the marker and what is wrong."""


def parse_marker(text: str, kind: str) -> tuple[str, dict]:
    """(dump file name, options) from a marker's text; unknown options raise PageError."""
    words = shlex.split(text)
    if not words or "=" in words[0]:
        raise PageError(f"{kind} marker {text.strip()!r} names no dump file first")
    options = dict(w.split("=", 1) for w in words[1:] if "=" in w)
    loose = [w for w in words[1:] if "=" not in w]
    unknown = sorted(set(options) - (_TABLE_KEYS if kind == "table" else _FIGURE_KEYS))
    if loose or unknown:
        valid = ", ".join(sorted(_TABLE_KEYS if kind == "table" else _FIGURE_KEYS))
        raise PageError(f"{kind} marker {text.strip()!r}: unknown {loose + unknown}; valid options: {valid}")
    return words[0], options


def load(path: Path) -> tuple[dict, dict]:
    """({column: NumPy array}, root attributes) of one dump."""
    table = read_table(path)
    columns = {name: np.asarray(table[name]) for name in (table.columns if hasattr(table, "columns") else table)}
    return columns, read_meta(path)


def select(columns: dict, where: str | None) -> dict:
    """The rows whose columns match every ``col:value`` of ``where`` (compared as text)."""
    keep = np.ones(len(next(iter(columns.values()))), dtype=bool)
    for term in filter(None, (where or "").split(",")):
        name, _, value = term.partition(":")
        _need(columns, name)
        keep &= np.array([str(v) == value for v in columns[name]])
    if not keep.any():
        raise PageError(f"where={where!r} matches no row")
    return {name: values[keep] for name, values in columns.items()}


def _need(columns: dict, name: str) -> None:
    if name not in columns:
        raise PageError(f"no column {name!r}; the dump has: {', '.join(columns)}")


def _short(x: float) -> str:
    """About 3 significant digits, never an exponent: 5631.2 -> "5631", 12.34 -> "12.3", 0.00166 -> "0.00166"."""
    size = abs(x)
    if size >= 100 or x == 0:
        return f"{x:.0f}"
    return f"{x:.1f}" if size >= 10 else f"{x:.2f}" if size >= 1 else f"{x:.3g}"


def _cell(name: str, value) -> str:
    """A label cell: sizes as 1K/4M, others as text."""
    return format_size(int(value)) if name == "bytes" else str(value)


def provenance(dump: str, meta: dict) -> str:
    """One line: the command that made the dump, its commit, the machine, the MPI, the time and the load."""
    args = json.loads(meta["argv"]) if isinstance(meta.get("argv"), str) else list(meta.get("argv", []))
    module = _MODULES.get(meta.get("kind"), "?")
    command = f"mpirun -n {meta['world_size']} python -m {module} {shlex.join(args)}".rstrip()
    commit = str(meta.get("git_commit", "not recorded"))[:10]
    load = meta.get("load_average")
    load = f"load average {load} (1, 5, 15 min) as it finished" if load else "load not recorded"
    return (f"From [`{dump}`]({{stem}}/{dump}): `{command}` at commit `{commit}`; {meta.get('host', '?')} "
            f"({meta.get('cpu_model', '?')}, {meta.get('logical_cores', '?')} logical cores), "
            f"{meta.get('mpi_library', 'no MPI')}, {str(meta.get('time_utc', '?'))[:16]} UTC, {load}.")


def table(columns: dict, options: dict) -> str:
    """The Markdown table a table marker asks for."""
    columns = select(columns, options.get("where"))
    fmt, scale = options.get("fmt"), float(options.get("scale", 1))

    def number(value) -> str:
        return "" if value is None else format(float(value) * scale, fmt) if fmt else _short(float(value) * scale)
    if "columns" in options:
        names = options["columns"].split(",")
        for name in names:
            _need(columns, name)
        lines = ["| " + " | ".join(names) + " |", "|" + "---|" * len(names)]
        for i in range(len(columns[names[0]])):
            cells = [number(columns[n][i]) if columns[n].dtype.kind == "f" else _cell(n, columns[n][i])
                     for n in names]
            lines.append("| " + " | ".join(cells) + " |")
        return "\n".join(lines)
    if not {"rows", "cols", "values"} <= set(options):
        raise PageError("a table needs columns=..., or rows=, cols= and values=")
    row_name, col_name, value_name = options["rows"], options["cols"], options["values"]
    for name in (row_name, col_name, value_name):
        _need(columns, name)
    row_keys = list(dict.fromkeys(columns[row_name].tolist()))
    col_keys = list(dict.fromkeys(columns[col_name].tolist()))
    cells: dict = {}
    for r, c, v in zip(columns[row_name].tolist(), columns[col_name].tolist(), columns[value_name].tolist()):
        if (r, c) in cells:
            raise PageError(f"two rows for {row_name}={r!r}, {col_name}={c!r}: narrow them with where=")
        cells[r, c] = v
    base = options.get("ratio")
    if base is not None and base not in col_keys:
        raise PageError(f"ratio={base!r} is not a value of {col_name}: {col_keys}")
    shown = [c for c in col_keys if c != base]
    lines = [f"| {row_name} | " + " | ".join(map(str, shown)) + " |", "|---|" + "---|" * len(shown)]
    for r in row_keys:
        values = [cells.get((r, c)) for c in shown]
        if base is not None:
            values = [None if v is None else v / cells[r, base] for v in values]
        text = [number(v) if isinstance(v, float) else ("" if v is None else str(v)) for v in values]
        lines.append(f"| {_cell(row_name, r)} | " + " | ".join(text) + " |")
    return "\n".join(lines)


def figure(columns: dict, options: dict, out: Path) -> None:
    """Draw a figure marker's plot to ``out`` (a PNG with no time stamp in it)."""
    from matplotlib.figure import Figure
    columns = select(columns, options.get("where"))
    x, y, series = options["x"], options["y"], options.get("series")
    for name in filter(None, (x, y, series)):
        _need(columns, name)
    scale = float(options.get("scale", 1))
    fig = Figure(figsize=(7, 4), dpi=100, layout="constrained")
    ax = fig.add_subplot()
    groups = list(dict.fromkeys(columns[series].tolist())) if series else [None]
    for g in groups:
        keep = np.ones(len(columns[x]), dtype=bool) if g is None else columns[series] == g
        ax.plot(columns[x][keep], columns[y][keep] * scale, marker="o", label=str(g))
    if x == "bytes":
        ax.set_xscale("log", base=2)
        ticks = sorted(set(columns[x].tolist()))
        ax.set_xticks(ticks, [format_size(int(t)) for t in ticks])
    ax.set_xlabel(x)
    ax.set_ylabel(options.get("title", y))
    ax.grid(True, alpha=0.3)
    if series:
        ax.legend(title=series)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, format="png", metadata={"Software": None})


def render(page: Path, draw: bool = True) -> str:
    """The page's text with every generated part made anew from its dumps; ``draw`` also writes the PNGs."""
    text = page.read_text(encoding="utf-8")
    folder = page.with_suffix("")
    cache: dict = {}

    def part(match: re.Match) -> str:
        kind, marker = match.group(1), match.group(2)
        try:
            dump, options = parse_marker(marker, kind)
            if dump not in cache:
                cache[dump] = load(folder / dump)
            columns, meta = cache[dump]
            if kind == "table":
                title = f"{options['title']}. " if "title" in options else ""
                body = (title + provenance(dump, meta).format(stem=folder.name) + "\n\n"
                        + table(columns, options) + "\n\n")
            else:
                name = options.get("name")
                if not name:
                    raise PageError("a figure needs name=, the PNG's stem")
                if draw:
                    figure(columns, options, folder / f"{name}.png")
                body = (f"![{options.get('title', name)}]({folder.name}/{name}.png)\n\n"
                        + provenance(dump, meta).format(stem=folder.name) + "\n\n")
        except (PageError, OSError, KeyError, ValueError) as e:
            raise PageError(f"{page.name}: {kind} {marker.strip()!r}: {e}") from e
        return f"<!-- {kind} {marker}-->\n{body}{END}"
    if text.count("<!-- table ") + text.count("<!-- figure ") != len(_BLOCK.findall(text)):
        raise PageError(f"{page.name}: a table or figure marker has no {END} after it")
    return _BLOCK.sub(part, text)


def generated_pages(folder: Path = RESULTS_DIR) -> list[Path]:
    """The results pages that have at least one generated part."""
    return [p for p in sorted(folder.glob("*.md")) if _BLOCK.search(p.read_text(encoding="utf-8"))]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("pages", nargs="*", type=Path, help="results pages (default: every generated page)")
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a page is stale")
    args = parser.parse_args(argv)
    pages = args.pages or generated_pages()
    stale = []
    for page in pages:
        if not page.is_file():
            parser.error(f"no such page: {page}")
        try:
            new = render(page, draw=not args.check)
        except PageError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        if new != page.read_text(encoding="utf-8"):
            stale.append(page)
            if not args.check:
                page.write_text(new, encoding="utf-8")
        print(f"{page}: {'stale' if args.check and page in stale else 'written' if page in stale else 'current'}")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
