"""The command blocks of README.md and the pages under docs/ marked runnable run, and print the lines the page quotes.

A page marks a fenced block with an HTML comment on the line before it (invisible when rendered):

    <!-- runnable -->   its lines run as one bash script; a block whose lines start with "$ " is a session
                        instead: each "$ " line is a command, the lines after it what the page says it prints
    <!-- output -->     a block of what the runnable block before it prints

Quoted lines must appear in the output in the page's order; other lines may come between them (a quoted
``...`` stands for those). Times, rates and percentage shares match any number in their place (:data:`VARY`),
runs of spaces any run of spaces; a marker adds patterns of its own that may vary, each after ``; vary: ``,
e.g. ``<!-- output; vary: \\d+ BLAS thread.* -->``. Each block runs in a fresh temporary directory holding links
to the checkout's top-level entries that git tracks (so ``examples/`` and ``benchmarks/`` resolve and what the block writes
stays there), with the checkout first on PYTHONPATH and this interpreter's directory first on PATH.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
MARKER = re.compile(r"<!--\s*(runnable|output)((?:;\s*\w+:[^;]*?)*)\s*-->")
#: Parts of a line that vary from run to run: seconds, samples or tokens per second, percentage shares.
VARY = (r"\d+(?:\.\d+)? s\b", r"\d+ (?:samples|tokens)/s", r"(?<![\d.])\d+%")
#: Seconds one block may run.
LIMIT_S = 240


@dataclass
class Block:
    """A runnable block of a page: its script, the lines it must print, and what in them may vary."""

    where: str
    script: str
    expected: list[str] = field(default_factory=list)
    vary: list[str] = field(default_factory=list)


def _options(text: str) -> list[str]:
    """The ``vary`` patterns of a marker's ``; vary: RE`` parts."""
    return [value.strip() for key, value in re.findall(r";\s*(\w+):([^;]*)", text) if key == "vary"]


def _fenced(lines: list[str], start: int) -> tuple[list[str], int]:
    """The body of the fenced block opening at ``lines[start]``, and the index after its closing fence."""
    end = start + 1
    while end < len(lines) and not lines[end].lstrip().startswith("```"):
        end += 1
    return lines[start + 1:end], end + 1


def _session(body: list[str]) -> tuple[str, list[str]]:
    """A session block's script (its "$ " commands, continuations joined) and the lines it quotes."""
    commands, expected, continued = [], [], False
    for line in body:
        if line.startswith("$ ") or continued:
            commands.append(line[2:] if line.startswith("$ ") and not continued else line)
            continued = line.endswith("\\")
        else:
            expected.append(line)
    return "\n".join(commands), expected


def blocks_of(page: Path) -> list[Block]:
    """The runnable blocks of ``page``, each with the output lines quoted for it."""
    lines, found, i = page.read_text(encoding="utf-8").splitlines(), [], 0
    while i < len(lines):
        mark = MARKER.fullmatch(lines[i].strip())
        if not mark:
            i += 1
            continue
        kind, vary = mark.group(1), _options(mark.group(2))
        if i + 1 >= len(lines) or not lines[i + 1].lstrip().startswith("```"):
            raise ValueError(f"{page.name}:{i + 1}: a <!-- {kind} --> marker must stand right before a fenced block")
        where = f"{page.relative_to(ROOT) if page.is_relative_to(ROOT) else page.name}:{i + 2}"   # the fence's line
        body, i = _fenced(lines, i + 1)
        if kind == "runnable":
            session = any(line.startswith("$ ") for line in body)
            script, expected = _session(body) if session else ("\n".join(body), [])
            found.append(Block(where, script, expected, vary))
        elif not found:
            raise ValueError(f"{page.name}:{i}: an <!-- output --> block with no runnable block before it")
        else:
            found[-1].expected += body
            found[-1].vary += vary
    return found


def line_pattern(expected: str, vary) -> re.Pattern:
    """A pattern for one quoted line: its varying parts match any text of their kind, spaces any spaces."""
    kinds = "|".join(f"(?:{v})" for v in vary)
    parts, last = [], 0
    for m in re.finditer(kinds, expected):
        parts += [expected[last:m.start()], None]
        last = m.end()
    parts.append(expected[last:])
    return re.compile("".join(f"(?:{kinds})" if p is None else r"\s+".join(map(re.escape, re.split(r"\s+", p)))
                              for p in parts))


def missing_lines(expected: list[str], output: str, vary) -> list[str]:
    """The quoted lines not found in ``output`` (in order, other lines allowed between them)."""
    actual = [line.strip() for line in output.splitlines()]
    at, missing = 0, []
    for line in (e.strip() for e in expected):
        if not line or line == "...":
            continue
        pattern = line_pattern(line, vary)
        hit = next((k for k in range(at, len(actual)) if pattern.fullmatch(actual[k])), None)
        if hit is None:
            missing.append(line)
        else:
            at = hit + 1
    return missing


def _tracked_top_level() -> set[str]:
    """The checkout's top-level names git tracks (not what the user's own runs left there, e.g. a run.h5)."""
    listed = subprocess.run(["git", "-C", str(ROOT), "ls-files"], capture_output=True, text=True)
    if listed.returncode != 0:   # no git: every entry but the virtual environment
        return {entry.name for entry in ROOT.iterdir() if not entry.name.startswith(".venv")}
    return {path.split("/", 1)[0] for path in listed.stdout.splitlines()}


def run_block(block: Block, timeout: float = LIMIT_S) -> subprocess.CompletedProcess:
    """Run ``block``'s script with bash in a fresh directory linked to the checkout."""
    with tempfile.TemporaryDirectory(prefix="doc-commands-") as scratch:
        for entry in ROOT.iterdir():
            if entry.name in _tracked_top_level():
                os.symlink(entry, Path(scratch) / entry.name)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
                   PATH=os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", os.defpath)]))
        return subprocess.run(["bash", "-e", "-o", "pipefail", "-c", block.script], cwd=scratch, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)


BLOCKS = [block for page in PAGES for block in blocks_of(page)]


@pytest.mark.slow
@pytest.mark.parametrize("block", BLOCKS, ids=lambda b: b.where)
def test_a_runnable_block_runs_and_prints_what_its_page_quotes(block):
    search = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", os.defpath)])
    if re.search(r"\bmpirun\b", block.script) and not shutil.which("mpirun", path=search):
        pytest.skip("mpirun is not installed (pip install -e '.[mpich]')")
    done = run_block(block)
    assert done.returncode == 0, f"{block.where}: exit {done.returncode}\n{done.stdout[-3000:]}"
    missing = missing_lines(block.expected, done.stdout, (*VARY, *block.vary))
    assert not missing, f"{block.where}: not printed:\n" + "\n".join(missing) + f"\n--- output:\n{done.stdout}"


def test_the_readme_and_the_docs_mark_runnable_blocks_with_quoted_output():
    assert any(b.where.startswith("README.md") and b.expected for b in BLOCKS)
    assert any(b.where.startswith("docs/") and b.expected for b in BLOCKS)


def test_the_checker_lets_timings_vary_and_catches_a_changed_number(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("intro\n<!-- runnable; vary: backend \\w+ -->\n```bash\necho go\n```\ntext\n"
                    "<!-- output -->\n```\nepoch 1/2  loss 0.5000  17000 samples/s  comm  75%  (1.74 s)\n...\n"
                    "done: backend mpi, val_acc  92.68%\n```\n"
                    "<!-- runnable -->\n```\n$ printf 'a\\nb\\n'\na\nb\n```\n")
    block, session = blocks_of(page)
    assert block.script == "echo go" and len(block.expected) == 3 and block.vary == [r"backend \w+"]
    vary = (*VARY, *block.vary)
    good = "header\nepoch 1/2  loss 0.5000   9 samples/s  comm   5%  (10.02 s)\nmore\ndone: backend ring, val_acc  92.68%\n"
    assert missing_lines(block.expected, good, vary) == []
    assert missing_lines(block.expected, good.replace("0.5000", "0.5001"), vary) == \
        ["epoch 1/2  loss 0.5000  17000 samples/s  comm  75%  (1.74 s)"]
    assert missing_lines(block.expected, good.replace("92.68%", "92.69%"), vary) == ["done: backend mpi, val_acc  92.68%"]
    assert session.script == "printf 'a\\nb\\n'" and session.expected == ["a", "b"]
    assert missing_lines(session.expected, run_block(session, timeout=60).stdout, VARY) == []


def test_a_marker_away_from_a_block_is_an_error(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("<!-- runnable -->\n\n```bash\necho go\n```\n")
    with pytest.raises(ValueError, match="right before a fenced block"):
        blocks_of(page)
