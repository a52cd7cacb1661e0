"""The documentation site: its generated reference pages are current, every page is in the navigation,
``mkdocs build --strict`` passes, and the built site works in headless Chromium.

The browser test serves the built site on a 127.0.0.1 port and drives Chromium (Debian's ``chromium``) over the
DevTools protocol on a pipe (``--remote-debugging-pipe``: JSON messages ending in a NUL byte, on its fds 3 and 4).
It writes screenshots of the pages it opens, at a laptop's and a phone's width, to ``docs-screenshots/``.
"""

from __future__ import annotations

import functools
import http.server
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
SHOTS = ROOT / "docs-screenshots"
#: The pages the browser opens: home, guide pages (code blocks; figures), a reference page, a results page (tables, figures).
OPENED = ("", "guide/quickstart/", "guide/benchmarks/", "reference/comm/", "results/2026-12-02-allreduce-n2/")
#: Widths of the screenshots: a laptop's and a phone's (CSS pixels) and their heights.
VIEWPORTS = {"laptop": (1366, 900, False), "phone": (390, 844, True)}
#: Screenshots show the top of a page down to this many CSS pixels (tables and code blocks, not only the title).
SHOT_HEIGHT = 2600
NAV_PAGE = re.compile(r"^\s*-\s+(?:\"[^\"]*\":\s+|[^:\n\"]+:\s+)?([\w./-]+\.md)\s*$")


def has(module: str) -> bool:
    try:
        __import__(module)
        return True
    except ImportError:
        return False


NO_MKDOCS = None if has("mkdocs") and has("material") and has("mkdocstrings_handlers.python") else \
    "the docs extra is not installed (pip install -e '.[docs]')"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def nav_pages() -> list[str]:
    """The pages mkdocs.yml's nav lists, in order."""
    text = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    nav = text[text.index("\nnav:"):]
    return [m.group(1) for line in nav.splitlines() if (m := NAV_PAGE.match(line))]


def url_of(page: str) -> str:
    """The site path of a page: index.md is "", guide/index.md "guide/", guide/x.md "guide/x/"."""
    stem = page.removesuffix(".md").removesuffix("index")
    return stem if not stem or stem.endswith("/") else stem + "/"


def test_the_generated_reference_pages_are_current():
    proc = subprocess.run([sys.executable, str(DOCS / "generate.py"), "--check"], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr


def test_every_page_is_in_the_navigation_once():
    pages = sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md"))
    listed = nav_pages()
    assert len(listed) == len(set(listed)), sorted({p for p in listed if listed.count(p) > 1})
    assert not set(listed) - set(pages), f"the nav names missing pages: {sorted(set(listed) - set(pages))}"
    assert not set(pages) - set(listed), f"pages not in mkdocs.yml's nav: {sorted(set(pages) - set(listed))}"


def test_the_nav_reader_sees_plain_and_titled_entries():
    lines = ["  - Home: index.md", "      - guide/index.md", "  - Guide:", "      - \"A: b\": guide/x-y.md"]
    assert [m.group(1) for line in lines if (m := NAV_PAGE.match(line))] == ["index.md", "guide/index.md", "guide/x-y.md"]
    assert [url_of(p) for p in ("index.md", "guide/index.md", "guide/x-y.md")] == ["", "guide/", "guide/x-y/"]


def test_the_build_hook_reads_lists_as_github_does():
    spec = importlib.util.spec_from_file_location("docs_hooks", DOCS / "hooks.py")
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    github_lists = hooks.github_lists
    page = "Text\n- a\n  more\n\n  ```\n  code\n  ```\n  after\n- b\n- c\n  - sub\n\n```\n- not a list\n  x\n```\n1. one\n   two\n"
    assert github_lists(page) == ("Text\n\n- a\n    more\n\n    ```\n    code\n    ```\n    after\n\n- b\n- c\n    - sub\n\n"
                                  "```\n- not a list\n  x\n```\n\n1. one\n    two\n")


@pytest.fixture(scope="module")
def site():
    """The site, built with ``mkdocs build --strict`` into a temporary directory."""
    if NO_MKDOCS:
        pytest.skip(NO_MKDOCS)
    with tempfile.TemporaryDirectory(prefix="npddp-site-") as out:
        env = {**os.environ, "NO_MKDOCS_2_WARNING": "1",
               "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", out], cwd=ROOT,
                              env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        yield Path(out)


def test_mkdocs_build_strict_passes_and_makes_every_page(site):
    built = {str(p.relative_to(site)) for p in site.rglob("index.html")}
    expected = {url_of(p) + "index.html" for p in nav_pages()}
    assert not expected - built, sorted(expected - built)
    comm = (site / "reference" / "comm" / "index.html").read_text(encoding="utf-8")
    assert 'id="npddp.comm.Communicator.allreduce"' in comm and ":func:" not in comm   # roles shown as code
    study = (site / "results" / "2026-11-26-mpi-algorithms" / "index.html").read_text(encoding="utf-8")
    assert '<a href="../../img/mpi_study_1x2.png"><img' in study   # a figure opens full size
    guide = (site / "guide" / "benchmarks" / "index.html").read_text(encoding="utf-8")
    assert "<li>\n<p><code>ddp.py</code>" in guide   # an item after an item holding a code block


class Browser:
    """Headless Chromium driven over the DevTools protocol on a pipe: one page, commands answered in order."""

    def __init__(self, profile: Path):
        to_browser, self._write = os.pipe()
        self._read, from_browser = os.pipe()
        # the child reads commands on fd 3 and writes replies on fd 4
        self.proc = subprocess.Popen(
            [CHROMIUM, "--headless=new", "--remote-debugging-pipe", "--no-sandbox", "--disable-gpu",
             "--no-first-run", "--no-default-browser-check", "--disable-extensions", "--hide-scrollbars",
             f"--user-data-dir={profile}", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            pass_fds=(3, 4), preexec_fn=functools.partial(self._fds, to_browser, from_browser))
        os.close(to_browser)
        os.close(from_browser)
        self._buffer, self._id, self.events, self.session = b"", 0, [], None
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        for domain in ("Page", "Runtime", "Log"):
            self.call(f"{domain}.enable")

    @staticmethod
    def _fds(to_browser: int, from_browser: int) -> None:
        os.dup2(to_browser, 3)
        os.dup2(from_browser, 4)

    def _message(self, deadline: float) -> dict:
        while b"\0" not in self._buffer:
            if time.monotonic() > deadline:
                raise TimeoutError("Chromium did not answer in time")
            chunk = os.read(self._read, 1 << 20)
            if not chunk:
                raise RuntimeError(f"Chromium closed its pipe (exit {self.proc.poll()})")
            self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(raw)

    def call(self, method: str, timeout: float = 20, **params) -> dict:
        """Send one command; the events that arrive before its reply are kept in :attr:`events`."""
        self._id += 1
        message = {"id": self._id, "method": method, "params": params}
        if self.session:
            message["sessionId"] = self.session
        os.write(self._write, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._message(deadline)
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_for(self, method: str, timeout: float = 20) -> dict:
        """The first event ``method`` not yet seen (kept ones first)."""
        deadline = time.monotonic() + timeout
        while True:
            for i, event in enumerate(self.events):
                if event.get("method") == method:
                    return self.events.pop(i)
            self.events.append(self._message(deadline))

    def evaluate(self, expression: str):
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        return result["result"].get("value")

    def open(self, url: str) -> None:
        self.events = [e for e in self.events if e.get("method") != "Page.loadEventFired"]
        self.call("Page.navigate", url=url)
        self.wait_for("Page.loadEventFired")

    def errors(self) -> list[str]:
        """Console errors, uncaught exceptions and failed loads reported so far (and forget them)."""
        found = []
        for event in self.events:
            method, params = event.get("method"), event.get("params", {})
            if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                found.append("console: " + " ".join(str(a.get("value", a.get("description"))) for a in params["args"]))
            elif method == "Runtime.exceptionThrown":
                found.append("exception: " + params["exceptionDetails"].get("text", ""))
            elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
                found.append(f"log: {params['entry']['text']} {params['entry'].get('url', '')}")
        self.events = [e for e in self.events if e.get("method") not in
                       ("Runtime.consoleAPICalled", "Runtime.exceptionThrown", "Log.entryAdded")]
        return found

    def screenshot(self, path: Path, viewport: str) -> None:
        width, height, mobile = VIEWPORTS[viewport]
        self.call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=mobile)
        tall = min(SHOT_HEIGHT, self.evaluate("document.documentElement.scrollHeight"))
        shot = self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True,
                         clip={"x": 0, "y": 0, "width": width, "height": tall, "scale": 1})
        path.write_bytes(__import__("base64").b64decode(shot["data"]))

    def close(self) -> None:
        for fd in (self._write, self._read):
            os.close(fd)
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def served(site):
    """The built site on a free 127.0.0.1 port: its base URL."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(site)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def browser(served, tmp_path_factory):
    if not CHROMIUM:
        pytest.skip("no chromium on PATH (Debian: apt-get install chromium)")
    b = Browser(tmp_path_factory.mktemp("chromium-profile"))
    yield b
    b.close()


BROKEN_IMAGES = "Array.from(document.images).filter(i => !i.complete || i.naturalWidth === 0).map(i => i.src)"
#: What overflows the page sideways at this width (a table or code block should scroll inside itself).
OVERFLOW = "document.documentElement.scrollWidth > window.innerWidth + 1"


def test_the_pages_render_without_errors_at_both_widths(browser, served):
    SHOTS.mkdir(exist_ok=True)
    browser.errors()
    bad = []
    for page in OPENED:
        for viewport in VIEWPORTS:
            width, height, mobile = VIEWPORTS[viewport]
            browser.call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1,
                         mobile=mobile)
            browser.open(served + page)
            name = (page.strip("/").replace("/", "-") or "home") + f"-{viewport}.png"
            browser.screenshot(SHOTS / name, viewport)
            problems = browser.errors()
            images = browser.evaluate(BROKEN_IMAGES)
            if browser.evaluate(OVERFLOW):
                problems.append(f"wider than the {viewport} screen")
            if images:
                problems.append(f"broken images {images}")
            if not browser.evaluate("document.querySelector('article h1') !== null"):
                problems.append("no heading in the article")
            bad += [f"/{page} ({viewport}): {p}" for p in problems]
    assert not bad, bad


def test_search_finds_the_allreduce_reference(browser, served):
    browser.call("Emulation.setDeviceMetricsOverride", width=1366, height=900, deviceScaleFactor=1, mobile=False)
    browser.open(served + "?q=allreduce")
    found = []
    for _ in range(100):   # the search index loads in a worker: poll for its results
        found = browser.evaluate("Array.from(document.querySelectorAll('.md-search-result__item a')).map(a => a.href)")
        if found:
            break
        time.sleep(0.1)
    assert any(re.search(r"/reference/comm/(\?h=[^#]*)?#npddp\.comm\.Communicator\.allreduce$", href) for href in found), found
    assert not browser.errors()


def test_the_navigation_reaches_every_page(browser, served):
    browser.open(served)
    links = set(browser.evaluate("Array.from(document.querySelectorAll('nav.md-nav--primary a.md-nav__link[href]'))"
                                 ".map(a => a.href.split('#')[0])"))
    expected = {served + url_of(p) for p in nav_pages()}
    assert not expected - links, sorted(expected - links)
    missing = []
    for url in sorted(links):   # each page the navigation links is served, with its heading
        with urllib.request.urlopen(url, timeout=10) as reply:
            if reply.status != 200 or "<h1" not in reply.read().decode("utf-8"):
                missing.append(url)
    assert not missing, missing
    assert not browser.errors()
