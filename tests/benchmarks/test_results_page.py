"""Serial tests of benchmarks/results_page.py: every generated results table is what its dump makes now."""

import re
import shutil

import pytest

from benchmarks import results_page as rp

PAGES = rp.generated_pages()
_ROW = re.compile(r"^\| [^|]+ \| .*\d", re.M)


def test_the_results_folder_has_generated_pages():
    assert len(PAGES) >= 2, [p.name for p in PAGES]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.stem)
def test_every_generated_table_matches_its_dump(page):
    text = page.read_text(encoding="utf-8")
    assert rp.render(page, draw=False) == text, (
        f"{page.name} differs from its dumps: run python -m benchmarks.results_page {page}")
    for image in re.findall(r"!\[[^]]*\]\(([^)]+\.png)\)", text):
        assert (page.parent / image).is_file(), image


@pytest.fixture
def copied(tmp_path):
    """A generated page and its dumps, copied where a test may change them."""
    page = PAGES[0]
    shutil.copytree(page.with_suffix(""), tmp_path / page.stem)
    return shutil.copy(page, tmp_path / page.name)


def test_a_number_edited_by_hand_is_found(copied):
    text = copied.read_text(encoding="utf-8")
    row = _ROW.search(text)
    digit = re.search(r"\d", row.group(0)[row.group(0).index("|", 2):]).start() + row.group(0).index("|", 2)
    old = row.group(0)
    new = old[:digit] + str((int(old[digit]) + 1) % 10) + old[digit + 1:]
    copied.write_text(text.replace(old, new, 1), encoding="utf-8")
    assert rp.render(copied, draw=False) == text
    assert rp.main(["--check", str(copied)]) == 1
    assert rp.main([str(copied)]) == 0 and copied.read_text(encoding="utf-8") == text
    assert rp.main(["--check", str(copied)]) == 0


def _page(tmp_path, copied, marker: str):
    dump = next(copied.with_suffix("").glob("*.h5")).name
    page = copied.with_suffix("").parent / "bad.md"
    shutil.copytree(copied.with_suffix(""), tmp_path / "bad", dirs_exist_ok=True)
    page.write_text(f"# Bad\n\n{marker.format(dump=dump)}\n", encoding="utf-8")
    return page


@pytest.mark.parametrize("marker, says", [
    ("<!-- table {dump} rows=bytes -->\nno end here", "has no <!-- end -->"),
    ("<!-- table {dump} colour=red -->\n<!-- end -->", "valid options"),
    ("<!-- table {dump} columns=nosuch -->\n<!-- end -->", "no column 'nosuch'"),
    ("<!-- table {dump} rows=model -->\n<!-- end -->", "rows=, cols= and values="),
    ("<!-- table {dump} columns=backend where=backend:nosuch -->\n<!-- end -->", "matches no row"),
    ("<!-- table missing.h5 columns=backend -->\n<!-- end -->", "missing.h5"),
    ("<!-- figure {dump} x=backend y=backend -->\n<!-- end -->", "name="),
])
def test_a_bad_marker_is_named(tmp_path, copied, marker, says):
    page = _page(tmp_path, copied, marker)
    with pytest.raises(rp.PageError, match=re.escape(says)):
        rp.render(page, draw=False)
    assert rp.main(["--check", str(page)]) == 2
