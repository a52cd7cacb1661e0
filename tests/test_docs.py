"""The documentation holds together: the README links into every part of the docs, every link and anchor
resolves, every flag quoted for an entry point exists in its --help, the README stays short, and its own-script
example runs. (The site built from docs/: tests/test_docs_site.py.)"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from npddp.train.cli.parser import build_parser as train_parser
from npddp.train.evaluate import build_parser as evaluate_parser
from npddp.train.generate import build_parser as generate_parser

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = sorted([README, *DOCS.rglob("*.md")])
README_MAX_LINES = 150
#: Pages the README must link to: each part's index, and the guide's task pages.
REQUIRED = {f"docs/{part}/index.md" for part in ("guide", "reference", "design", "results")} | {
    f"docs/guide/{name}.md" for name in ("quickstart", "install", "launching", "slurm", "cluster", "training",
                                         "model-parallel", "library", "extending", "hooks")}
TRAINING = DOCS / "guide" / "training.md"
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
PARSERS = {"npddp.train": train_parser, "npddp.evaluate": evaluate_parser, "npddp.generate": generate_parser}


def outside_code(text: str) -> list[str]:
    """The lines of a markdown text outside fenced code blocks."""
    lines, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(line)
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    return {slug(line.lstrip("#")) for line in outside_code(page.read_text(encoding="utf-8"))
            if re.match(r"#{1,6} ", line)}


def links(page: Path) -> list[str]:
    return [m.group(1) for line in outside_code(page.read_text(encoding="utf-8")) for m in LINK.finditer(line)]


def flags_of(module: str) -> set[str]:
    return set(FLAG.findall(PARSERS[module]().format_help()))


def command_lines(page: Path):
    """(module, the text after it) for every line that runs one of PARSERS' entry points; continued lines joined."""
    text = page.read_text(encoding="utf-8").replace("\\\n", " ")
    for line in text.splitlines():
        for module in PARSERS:
            at = line.find(f"-m {module} ")
            if at < 0 and line.rstrip().endswith(f"-m {module}"):
                at = len(line)
            if at >= 0:
                rest = line[at + len(module) + 3:]
                yield module, rest.split("`")[0].split("#")[0].split("|")[0].split(";")[0].strip()


def page_id(page: Path) -> str:
    return str(page.relative_to(ROOT))


def test_the_readme_is_at_most_150_lines():
    n = len(README.read_text(encoding="utf-8").splitlines())
    assert n <= README_MAX_LINES, f"README.md has {n} lines; at most {README_MAX_LINES}: move detail into docs/guide/"


def test_the_readme_links_into_every_part_of_the_docs():
    linked = {target.split("#")[0] for target in links(README)}
    missing = sorted(REQUIRED - linked)
    assert not missing, f"README.md does not link {missing}"


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_every_relative_link_and_anchor_resolves(page):
    bad = []
    for target in links(page):
        if re.match(r"[a-z]+:", target):
            continue                                             # http(s), mailto: not checked offline
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        shown = os.path.relpath(dest, ROOT)
        if not dest.exists():
            bad.append(f"{target}: no file {shown}")
            continue
        if anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{target}: no heading #{anchor} in {shown}")
    assert not bad, f"{page_id(page)}: " + "; ".join(bad)


def test_the_link_checker_finds_broken_links_and_anchors(tmp_path):
    (tmp_path / "b.md").write_text("# A `code` heading, here\n")
    page = tmp_path / "a.md"
    page.write_text("[ok](b.md#a-code-heading-here) [gone](c.md) [bad](b.md#nope)\n```\n[in code](x.md)\n```\n")
    assert links(page) == ["b.md#a-code-heading-here", "c.md", "b.md#nope"]
    assert anchors(tmp_path / "b.md") == {"a-code-heading-here"}


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_every_flag_quoted_for_an_entry_point_exists_in_its_help(page):
    bad = sorted({f"{module} {flag}" for module, rest in command_lines(page)
                  for flag in FLAG.findall(rest) if flag not in flags_of(module)})
    assert not bad, f"{page_id(page)} quotes flags that --help does not list: {bad}"


def test_every_flag_in_the_training_pages_flag_table_exists():
    table = [line for line in outside_code(TRAINING.read_text(encoding="utf-8"))
             if line.startswith("| ")]
    quoted = {flag for line in table for flag in FLAG.findall(line)}
    assert len(quoted) > 30
    assert not quoted - flags_of("npddp.train"), sorted(quoted - flags_of("npddp.train"))


def test_every_flag_quoted_on_the_training_page_exists():
    """The training page's prose and tables name only flags of python -m npddp.train."""
    text = outside_code(TRAINING.read_text(encoding="utf-8"))
    quoted = {flag for line in text for span in re.findall(r"`([^`]+)`", line) if span.startswith("--")
              for flag in FLAG.findall(span)}
    assert "--resume" in quoted and "--checkpoint" in quoted
    assert not quoted - flags_of("npddp.train"), sorted(quoted - flags_of("npddp.train"))


def test_the_backend_help_describes_every_backend():
    """--help says what each backend is, not only its name in the choices."""
    from npddp.comm import BACKENDS

    action = next(a for a in train_parser()._actions if "--backend" in a.option_strings)
    described = action.help.split("(default")[0]
    missing = [b for b in BACKENDS if not re.search(rf"(?<![\w-]){b}(?![\w-])", described)]
    assert set(BACKENDS) <= set(action.choices) and not missing, (missing, described)  # and registered names


def test_the_flag_checker_sees_commands_and_their_flags(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("x `mpirun -n 2 python -m npddp.train --epochs 2 --no-such-flag` y --other\n"
                    "python -m npddp.generate g.h5 --prompt a \\\n    --top-k 3  # --comment\n")
    assert list(command_lines(page)) == [("npddp.train", "--epochs 2 --no-such-flag"),
                                         ("npddp.generate", "g.h5 --prompt a      --top-k 3")]
    assert "--no-such-flag" not in flags_of("npddp.train") and "--epochs" in flags_of("npddp.train")


def test_the_readmes_own_script_example_trains_on_two_ranks(tmp_path):
    text = README.read_text(encoding="utf-8")
    block = re.search(r"\*\*Your own script\.\*\*.*?```python\n(.*?)```", text, re.DOTALL)
    assert block, "README.md has no python block after **Your own script.**"
    script = tmp_path / "train_mine.py"
    script.write_text(block.group(1))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "PMIX_", "HYDRA_", "MPIR_", "OMPI_"))}
    env.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, "-m", "npddp.run", "--nproc", "2", str(script)], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    losses = {int(m.group(1)): float(m.group(2)) for m in re.finditer(r"rank (\d): loss ([\d.]+)", proc.stdout)}
    assert set(losses) == {0, 1} and all(v < 1.0 for v in losses.values()), proc.stdout
