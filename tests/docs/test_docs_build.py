"""The docs site builds with no warning, its links inside the site lead somewhere, and it
looks right in a browser.

``mkdocs build --strict`` (the command docs/index.md gives; any warning fails the build:
a link to a missing page, a page that cannot be read, a broken anchor where the config
validates them) into the test's directory; then every ``href`` and ``src`` of the built
HTML that points inside the site is followed: the file must exist and a ``#fragment`` must
name an element of that page. The built site is served on a local port and the home page
and one reference page are screenshotted in headless chromium (Playwright driving Debian's
chromium, as the sandbox's browser test does), under the test's directory, copied to
``test-artifacts/docs/`` (ignored by git) and, with ``APPROVALD_DOCS_SCREENSHOTS=1``, to
``docs/screenshots/``.
"""

from __future__ import annotations

import functools
import http.server
import os
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urljoin, urlsplit

import pytest

from tests.acceptance.browser_pages import LAUNCH, playwright

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "mkdocs.yml"
SCREENSHOTS = ROOT / "docs" / "screenshots"
ARTIFACTS = ROOT / "test-artifacts" / "docs"  # kept after the run, as the sandbox test's are
# until the site's mkdocs.yml (and its home page) are in the checkout, a copy of docs/ is
# built with the least a Material site needs: every page, found by walking the folder
FALLBACK_CONFIG = """\
site_name: approvald
docs_dir: docs
theme:
  name: material
  font: false
exclude_docs: |
  gen_reference.py
markdown_extensions:
  - toc:
      permalink: true
  - tables
validation:
  anchors: warn
"""


def build(tmp_path: Path) -> Path:
    config = CONFIG
    if not config.exists():
        config = tmp_path / "mkdocs.yml"
        config.write_text(FALLBACK_CONFIG)
        shutil.copytree(ROOT / "docs", tmp_path / "docs")
        home = tmp_path / "docs" / "index.md"
        if not home.exists():
            home.write_text("# approvald\n\n" + "".join(
                f"- [{p.stem}]({p.relative_to(home.parent).as_posix()})\n"
                for p in sorted(home.parent.rglob("*.md"))))
    site = tmp_path / "site"
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(config),
         "--site-dir", str(site)], cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"}, check=False)
    log = done.stdout + done.stderr
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{log[-4000:]}"
    warnings = [line for line in log.splitlines() if re.match(r"\s*(WARNING|ERROR)\b", line)]
    assert not warnings, "\n".join(warnings)
    return site


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.links: list[str] = []
        self.ids: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if value is None:
                continue
            if name in ("id", "name") and (name == "id" or tag == "a"):
                self.ids.add(value)
            if name in ("href", "src") and not (tag == "link" and ("rel", "canonical") in attrs):
                self.links.append(value)


@functools.cache
def _parsed(path: Path) -> _Links:
    parser = _Links()
    parser.feed(path.read_text(encoding="utf-8"))
    return parser


def _target(site: Path, url_path: str) -> Path:
    path = site / unquote(url_path).lstrip("/")
    return path / "index.html" if url_path.endswith("/") or path.is_dir() else path


def broken_links(site: Path) -> tuple[list[str], int]:
    """Every link inside the built site that leads nowhere (a missing file, or an anchor
    its page does not have), and how many links were followed."""
    broken, followed = [], 0
    base = "http://site.invalid/"
    for page in sorted(site.rglob("*.html")):
        here = base + page.relative_to(site).as_posix()
        for link in _parsed(page).links:
            url = urlsplit(urljoin(here, link))
            if url.scheme not in ("http", "https") or url.netloc != "site.invalid":
                continue  # another site, a mailto:, a data: URL
            followed += 1
            target = _target(site, url.path)
            where = f"{page.relative_to(site)}: {link}"
            if not target.is_file():
                broken.append(f"{where} (no {target.relative_to(site)})")
            elif url.fragment and target.suffix == ".html" and \
                    unquote(url.fragment) not in _parsed(target).ids:
                broken.append(f"{where} (no #{url.fragment} on {target.relative_to(site)})")
    return broken, followed


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    site = build(tmp_path)
    handler = functools.partial(_Quiet, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield site, f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


# what a reader sees that the markdown did not mean: a link written inside a code block
# (shown as its brackets and parentheses), and a paragraph that stops mid-sentence
_LITERAL_LINK = re.compile(r"\[[^\]\n]+\]\([^)\s]+\)")
_ENDS_A_SENTENCE = re.compile(r"[.:;!?)…\]`\"'”]$")
_SHOWN = """els => els.filter(e => !e.querySelector('p, ul, ol, pre'))
                      .map(e => e.innerText.trim())"""


def rendered_problems(page: object, where: str) -> list[str]:
    """What the page open in ``page`` (a Playwright page) shows wrong: literal markdown
    links in its code blocks, and prose paragraphs or list items that end mid-sentence
    (the generated reference pages' field lists are not prose, and are not read)."""
    found = []
    codes = page.eval_on_selector_all(  # type: ignore[attr-defined]
        "article pre code", "els => els.map(e => e.innerText)")
    found += [f"{where}: markdown shown literally in a code block: {m.group(0)}"
              for code in codes for m in _LITERAL_LINK.finditer(code)]
    if "reference/" not in where:
        prose = page.eval_on_selector_all("article p, article li", _SHOWN)  # type: ignore[attr-defined]
        found += [f"{where}: ends mid-sentence: …{text[-80:]}" for text in prose
                  if text and not _ENDS_A_SENTENCE.search(text)]
    return found


@pytest.mark.slow  # starts chromium
def test_the_rendered_check_finds_a_literal_link_and_a_cut_sentence(tmp_path: Path) -> None:
    sync_playwright = playwright()
    page_file = tmp_path / "index.html"
    page_file.write_text(
        "<article><pre><code>approvald db upgrade  # see [upgrades](operate.md#up)</code></pre>"
        "<p>A whole sentence.</p><p>Or install it from the command line; see</p>"
        "<ul><li>an item;</li><li>a last item.</li></ul></article>")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(**LAUNCH)
        try:
            page = browser.new_page()
            page.goto(page_file.as_uri())
            assert rendered_problems(page, "how-to/x/") == [
                "how-to/x/: markdown shown literally in a code block: "
                "[upgrades](operate.md#up)",
                "how-to/x/: ends mid-sentence: …Or install it from the command line; see"]
        finally:
            browser.close()


@pytest.mark.slow
def test_the_site_builds_strict_its_links_resolve_and_it_renders(
        served: tuple[Path, str], tmp_path: Path) -> None:
    site, url = served
    assert (site / "reference" / "cli" / "index.html").is_file()
    broken, followed = broken_links(site)
    assert not broken, "links inside the site that lead nowhere:\n" + "\n".join(broken)
    assert followed > 100  # the reference pages alone link to each command and schema

    sync_playwright = playwright()
    shots = tmp_path / "screenshots"
    shots.mkdir()
    home = url if (site / "index.html").is_file() else url + "reference/cli/"
    pages = {"home": home, "reference-cli": url + "reference/cli/"}
    with sync_playwright() as pw:
        browser = pw.chromium.launch(**LAUNCH)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            errors: list[str] = []
            outside: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))

            def only_the_site(route: object) -> None:
                request_url = route.request.url  # type: ignore[attr-defined]
                if request_url.startswith(url):
                    route.continue_()  # type: ignore[attr-defined]
                else:  # nothing is fetched from the internet (there is none in CI)
                    outside.append(request_url)
                    route.abort()  # type: ignore[attr-defined]

            page.route("**/*", only_the_site)
            for name, address in pages.items():
                answer = page.goto(address)
                assert answer is not None and answer.status == 200, address
                page.wait_for_load_state("load")
                assert page.locator("h1").first.is_visible()
                page.screenshot(path=str(shots / f"{name}.png"), full_page=False)
            assert "Command line" in page.locator("h1").first.inner_text()
            # every page, read as chromium renders it (issue 48 item 8)
            problems: list[str] = []
            for html in sorted(site.rglob("index.html")):
                where = html.parent.relative_to(site).as_posix() + "/"
                if where.startswith(("search/", "assets/")):
                    continue
                answer = page.goto(url + (where if where != "./" else ""))
                assert answer is not None and answer.status == 200, where
                problems += rendered_problems(page, where)
            assert problems == [], "\n".join(problems)
            assert errors == [], errors
        finally:
            browser.close()
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    for name in pages:
        assert (shots / f"{name}.png").stat().st_size > 10_000
        shutil.copyfile(shots / f"{name}.png", ARTIFACTS / f"{name}.png")
    if os.environ.get("APPROVALD_DOCS_SCREENSHOTS") == "1":
        SCREENSHOTS.mkdir(exist_ok=True)
        for name in pages:
            shutil.copyfile(shots / f"{name}.png", SCREENSHOTS / f"{name}.png")


def test_the_link_check_finds_a_missing_page_and_a_missing_anchor(tmp_path: Path) -> None:
    site = tmp_path / "site"
    (site / "a").mkdir(parents=True)
    (site / "index.html").write_text(
        '<h1 id="top">t</h1><a href="a/">ok</a><a href="a/#here">ok</a>'
        '<a href="#top">ok</a><a href="b/">no page</a><a href="a/#nowhere">no anchor</a>'
        '<a href="https://example.com/">elsewhere</a><img src="missing.png">')
    (site / "a" / "index.html").write_text('<p id="here">here</p><a href="../#top">up</a>')
    broken, followed = broken_links(site)
    assert broken == ["index.html: b/ (no b/index.html)",
                      "index.html: a/#nowhere (no #nowhere on a/index.html)",
                      "index.html: missing.png (no missing.png)"]
    assert followed == 7
