"""``approvald eval --report`` in a real browser (Playwright driving Debian's chromium,
headless, as in test_trace_browser.py): the demo dataset's report says PASS, a broken
agent's says FAIL; both open without a console error, a page error or a request leaving
the file; the bars count each score's passes; a failing journey's trace link scrolls to
its run's timeline; a script in a task name stays text. Screenshots go to
``test-artifacts/eval-report/`` (the test prints their paths).

Without chromium (or Playwright) the browser test is skipped, saying what to install,
unless ``APPROVALD_REQUIRE_BROWSER=1`` (CI sets it) makes that a failure.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.acceptance.browser_pages import launch, open_clean, playwright
from tests.helpers import make_cli

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "bot" / "evals" / "datasets" / "demo_refund.toml"
ARTIFACTS = ROOT / "test-artifacts" / "eval-report"
SCORES = ["completion", "tools", "arguments", "approvals", "recovery", "cost", "latency"]
EVIL = "approve <script>window.pwned = 1</script> A-1"


def _dataset(tmp_path: Path, name: str, *, evil: bool = False) -> Path:
    """The demo dataset's four tasks under two interruptions (eight journeys, quick);
    ``evil``: the first task's name carries a script."""
    tasks = "[[tasks]]".join(DEMO.read_text().split("[[tasks]]")[1:5])  # the first four
    if evil:
        tasks = tasks.replace('name = "approve-duplicate-charge"', f'name = "{EVIL}"')
    path = tmp_path / name
    path.write_text('agent = "demo-refund"\n'
                    'interruptions = ["baseline", "duplicate_callback"]\n\n[[tasks]]' + tasks)
    return path


def _report(cli: Any, dataset: Path, out: Path, *extra: str, code: int) -> str:
    done = cli("eval", str(dataset), "--report", str(out), *extra)
    assert done.returncode == code, (done.stdout, done.stderr)
    assert done.stderr.splitlines() == [f"approvald eval: wrote the report to {out}"]
    assert out.read_text().startswith("<!DOCTYPE html>")
    return done.stdout


@pytest.mark.slow  # starts a process
def test_the_eval_report_opens_cleanly_and_links_failures_to_traces(
        sqlite_url: str, tmp_path: Path) -> None:
    sync_playwright = playwright()
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    cli = make_cli(sqlite_url, tmp_path, in_process=True)
    cli.env_extra.update(APPROVALD_AGENTS="tests.fixtures.eval_agents", PYTHONPATH=str(ROOT))
    passing = tmp_path / "pass.html"
    table = _report(cli, _dataset(tmp_path, "demo.toml"), passing, code=0)
    assert table.splitlines()[-1] == "8/8 journeys passed: PASS"
    failing = tmp_path / "fail.html"
    doc = json.loads(_report(cli, _dataset(tmp_path, "evil.toml", evil=True), failing,
                             "--agent", "refund-twice", "--json", code=1))
    assert doc["ok"] is False
    want = {s: sum(j["scores"][s] for j in doc["journeys"]) for s in SCORES}
    failed = [j for j in doc["journeys"] if not j["ok"]]
    assert [(j["task"], j["interruption"]) for j in failed] == [
        (EVIL, "baseline"), (EVIL, "duplicate_callback")]
    with sync_playwright() as pw:
        browser = launch(pw)
        try:
            for name, path, verdict, passed in (("pass", passing, "PASS", dict.fromkeys(
                    SCORES, 8)), ("fail", failing, "FAIL", want)):
                page, problems = open_clean(browser, path)
                assert page.locator("#verdict").inner_text() == verdict
                colour = page.locator("header.verdict").evaluate(
                    "h => getComputedStyle(h).backgroundColor")
                assert colour == ("rgb(230, 244, 234)" if verdict == "PASS"
                                  else "rgb(253, 236, 234)"), colour
                # a bar per score: the journeys that passed it, the numbers written out
                bars = page.locator("svg#scores g.score-bar")
                assert bars.count() == len(SCORES)
                got = bars.evaluate_all(
                    "gs => gs.map(g => [g.dataset.score, +g.dataset.passed, +g.dataset.total,"
                    " g.querySelector('text.score-numbers').textContent])")
                assert [g[0] for g in got] == SCORES
                for score, n, total, words in got:
                    assert (n, total) == (passed[score], 8), score
                    assert words.startswith(f"{n}/8 passed"), words
                    fill = page.locator(f'g.score-bar[data-score="{score}"] rect.passed')
                    box = fill.bounding_box()
                    assert box is not None and abs(box["width"] - 420 * n / 8) < 1.5, box
                rows = page.locator("#journeys tr.journey")
                assert rows.count() == 8
                assert page.locator("#journeys tr.journey.failed").count() == \
                    (0 if verdict == "PASS" else len(failed))
                assert page.evaluate("window.pwned") is None  # the task name is data
                assert page.locator("script").count() == 0
                shot = ARTIFACTS / f"eval-report-{name}.png"
                page.screenshot(path=str(shot), full_page=True)
                print(f"screenshot: {shot}")
                if verdict == "FAIL":
                    _follow_the_trace_links(page, failed)
                    shot = ARTIFACTS / "eval-report-fail-trace.png"
                    page.screenshot(path=str(shot))
                    print(f"screenshot: {shot}")
                    assert problems == [], problems
                page.close()
        finally:
            browser.close()
    assert "&lt;script&gt;window.pwned = 1&lt;/script&gt;" in failing.read_text()


def _follow_the_trace_links(page: Any, failed: list[dict[str, Any]]) -> None:
    """Each failing journey's row links to its trace, further down; clicking the link
    brings that trace into view: its run, its reasons, its swimlane."""
    links = page.locator("#journeys tr.journey.failed a.trace-link")
    assert links.count() == len(failed)
    targets = links.evaluate_all("as => as.map(a => a.getAttribute('href'))")
    assert len(set(targets)) == len(failed)
    for i, (target, journey) in enumerate(zip(targets, failed, strict=True)):
        page.evaluate("window.scrollTo(0, 0)")
        section = page.locator(f'section.trace[id="{target[1:]}"]')
        assert section.count() == 1
        top = section.evaluate("s => s.getBoundingClientRect().top")
        assert top > 900, top  # below the fold before the click
        links.nth(i).click()
        page.wait_for_function(f"location.hash === {json.dumps(target)}")
        top = section.evaluate("s => s.getBoundingClientRect().top")
        assert 0 <= top < 100, top  # scrolled to the top of the window
        assert page.evaluate("window.scrollY") > 0
        assert section.is_visible()
        heading = section.locator("h2").inner_text()
        assert journey["task"] in heading and journey["interruption"] in heading
        assert journey["run_id"] in section.inner_text()
        assert "issue_refund ran 2 times, at most 1 expected" in section.inner_text()
        lanes = section.locator("svg.swimlane g.lane").evaluate_all(
            "gs => gs.map(g => g.dataset.lane)")
        assert lanes == ["model", "tools", "humans"]
        # two refunds ran: both on the tools lane of this run's timeline
        assert section.locator('svg.swimlane g.item[data-kind="tool_call"]').count() == 4


def test_a_report_path_that_cannot_be_written_is_one_line_and_exit_2(
        sqlite_url: str, tmp_path: Path) -> None:
    cli = make_cli(sqlite_url, tmp_path, in_process=True)
    dataset = str(_dataset(tmp_path, "demo.toml"))
    for path, why in ((tmp_path / "nope" / "r.html", f"no such directory {tmp_path / 'nope'}"),
                      (tmp_path, "it is a directory")):
        done = cli("eval", dataset, "--report", str(path))
        assert done.returncode == 2, (done.stdout, done.stderr)
        assert done.stderr.splitlines() == [
            f"approvald eval: cannot write the report to {path}: {why}"]
        assert done.stdout == ""  # refused before any journey ran
