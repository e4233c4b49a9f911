"""The eval report (``approvald eval --report``): built from a real evaluation of a small
dataset, it counts each score's passes in its bars, says why each failing journey failed,
links each failing journey to its embedded trace, and keeps dataset text inert."""

from __future__ import annotations

import json
import re
from html import escape
from html.parser import HTMLParser
from pathlib import Path

import pytest
from approvald.bot import eval_report
from approvald.bot.evals.dataset import load_dataset
from approvald.bot.evals.evaluate import Report, Row, evaluate
from approvald.bot.evals.journey import Journey
from approvald.bot.evals.score import SCORES
from approvald.runtime.runs.demo import DemoLedger, demo_agents
from approvald.store.scratch import ScratchDatabases

from tests.fixtures.eval_agents import broken_agents

EVIL = 'refund <script>alert("x")</script> & "A-1"'
DATASET = f"""
interruptions = ["baseline", "duplicate_callback", "policy_auto_while_paused"]

[[tasks]]
name = '{EVIL}'
task = "Refund order A-1 for the duplicate charge"
decisions = [{{ tool = "issue_refund", action = "approve" }}]
[tasks.expect]
status = "completed"
result_contains = "was issued"
gated = ["issue_refund"]
max_calls = {{ issue_refund = 1 }}

[[tasks]]
name = "deny-with-reason"
task = "Refund order B-7 for the duplicate charge"
decisions = [{{ tool = "issue_refund", action = "deny", reason = "already refunded" }}]
[tasks.expect]
result_contains = "already refunded"
not_calls = [{{ tool = "send_customer_email" }}]
max_calls = {{ issue_refund = 0 }}
"""
TWICE = "tools: issue_refund ran 2 times, at most 1 expected (call_1_0, call_2_0)"
UNAPPROVED = "approvals: a gated call ran without an approval (issue_refund call_2_0)"


async def evaluated(tmp_path: Path, agent: str,
                    monkeypatch: pytest.MonkeyPatch) -> Report:
    """The small dataset above, evaluated for real (in-process interruptions only)."""
    path = tmp_path / "ds.toml"
    path.write_text(DATASET)
    ledger = str(tmp_path / "ledger.jsonl")
    monkeypatch.setenv("APPROVALD_DEMO_LEDGER", ledger)
    scratch = ScratchDatabases(tmp_path)
    try:
        return await evaluate(load_dataset(path, agent=agent),
                              agents=demo_agents(ledger) + broken_agents(DemoLedger(ledger)),
                              databases=scratch.new, ledger_path=ledger)
    finally:
        scratch.cleanup()


class Anchors(HTMLParser):
    """Every element id (in order) and every in-page link of a page."""

    def __init__(self) -> None:
        super().__init__()
        self.ids: list[str] = []
        self.links: list[str] = []
        self.trace_links: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if a.get("id"):
            self.ids.append(str(a["id"]))
        href = a.get("href") or ""
        if tag == "a" and href.startswith("#"):
            self.links.append(href[1:])
            if "trace-link" in (a.get("class") or ""):
                self.trace_links.append(href[1:])


def parsed(page: str) -> Anchors:
    p = Anchors()
    p.feed(page)
    return p


def bars(page: str) -> dict[str, tuple[int, int, str]]:
    """score -> (passed, total, the numbers written beside the bar)."""
    out = {}
    for m in re.finditer(r'<g class="score-bar" data-score="(\w+)" data-passed="(\d+)" '
                         r'data-total="(\d+)">.*?<text class="score-numbers"[^>]*>([^<]*)'
                         r"</text></g>", page):
        out[m[1]] = (int(m[2]), int(m[3]), m[4])
    return out


async def test_a_failing_report_counts_explains_and_links_every_failure(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    report = await evaluated(tmp_path, "refund-twice", monkeypatch)
    page = eval_report.html(report)
    failing = [r for r in report.rows if not r.ok]
    # the journeys the evaluator failed, and why (the agent refunds twice)
    assert [(r.task, r.variant) for r in failing] == [
        (EVIL, "baseline"), (EVIL, "duplicate_callback"), (EVIL, "policy_auto_while_paused")]
    assert '<span class="verdict-word" id="verdict">FAIL</span>: 3/6 journeys passed' in page
    # one bar per score, counting the journeys that passed it, the numbers as text
    assert bars(page) == {
        "completion": (6, 6, "6/6 passed"), "tools": (3, 6, "3/6 passed, 3 failed"),
        "arguments": (6, 6, "6/6 passed"), "approvals": (5, 6, "5/6 passed, 1 failed"),
        "recovery": (6, 6, "6/6 passed"), "cost": (6, 6, "6/6 passed"),
        "latency": (6, 6, "6/6 passed")}
    assert list(bars(page)) == list(SCORES)
    for s, (passed, total, _) in bars(page).items():  # as the evaluator counted
        assert (passed, total) == (sum(not r.failures[s] for r in report.rows), 6)
    # every failing journey's reasons, escaped as text
    for r in failing:
        assert TWICE in r.reasons()
        for reason in r.reasons():
            s, why = reason.split(": ", 1)
            assert (f'<li><strong>{s}</strong>: <span class="reason">{escape(why)}</span>'
                    "</li>") in page
    assert UNAPPROVED in failing[2].reasons()
    # each failing journey's row links to a trace section of its own in the same file
    a = parsed(page)
    assert len(a.ids) == len(set(a.ids)), "element ids are unique"
    assert all(re.fullmatch(r"[A-Za-z][A-Za-z0-9_-]*", i) for i in a.ids), a.ids
    assert set(a.links) <= set(a.ids), set(a.links) - set(a.ids)
    assert len(a.trace_links) == len(set(a.trace_links)) == len(failing) == 3
    for target, r in zip(a.trace_links, failing, strict=True):
        section = page[page.index(f'<section id="{target}"'):]
        section = section[:section.index("</section>")]
        assert f"{escape(EVIL)} · {r.variant}" in section
        assert r.journey.trace is not None and r.journey.run_id in section
        assert section.count('class="lane"') == 3  # the swimlane: model, tools, humans
        assert f'id="{target}-swimlane"' in section and f'id="{target}-entries"' in section
    # the passing journeys have no trace section
    assert page.count('<section id="trace-') == 3
    # the dataset's text is data: no element of its own, no external request
    assert "<script" not in page.lower()
    assert "refund &lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; &amp; &quot;A-1&quot;" \
        in page
    assert "http://" not in page and "https://" not in page


async def test_a_passing_report_says_pass_and_embeds_no_trace(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    report = await evaluated(tmp_path, "demo-refund", monkeypatch)
    assert report.ok
    page = eval_report.html(report)
    assert '<header class="verdict pass">' in page
    assert '<span class="verdict-word" id="verdict">PASS</span>: 6/6 journeys passed' in page
    assert {s: b[:2] for s, b in bars(page).items()} == {s: (6, 6) for s in SCORES}
    assert 'class="trace-link"' not in page and "<section" not in page
    assert page.count('<td class="result ok">PASS</td>') == 6


def test_ids_stay_unique_and_valid_whatever_the_task_names() -> None:
    names = ["a b", "a-b", "A B", "!!", "??", "返金", "a b--baseline"]
    rows = [Row(n, "baseline", Journey(task=n, variant="baseline", run_id=f"r{i}",
                                       status="failed", asked=["x (c1): <retry>"]),
                {"completion": ["the run ended failed, completed expected"]})
            for i, n in enumerate(names)]
    page = eval_report.html(Report(dataset="<d>.toml", rows=rows))
    a = parsed(page)
    assert len(a.ids) == len(set(a.ids))
    assert all(re.fullmatch(r"[A-Za-z][A-Za-z0-9_-]*", i) for i in a.ids), a.ids
    assert len(a.trace_links) == len(set(a.trace_links)) == len(names)
    assert set(a.links) <= set(a.ids)
    # without a trace the section says so; the question the operator answered is noted
    assert page.count("No timeline: the run's trace could not be read.") == len(names)
    assert "a person was asked whether x (c1): &lt;retry&gt;" in page
    assert "<d>" not in page and "&lt;d&gt;.toml" in page


async def test_a_report_masks_a_card_number_the_runs_and_their_expectations_quote(
        tmp_path: Path) -> None:
    """Secrets never reach a report (issue 34): the task, the final answer and the reasons
    quote a card number; the HTML report, its table and its JSON show it masked."""
    card = "4242 4242 4242 4242"
    path = tmp_path / "ds.toml"
    path.write_text(f"""
interruptions = ["baseline"]

[[tasks]]
name = "card"
task = "Refund order A-1 for the duplicate charge to card {card}"
decisions = [{{ tool = "issue_refund", action = "approve" }}]
[tasks.expect]
result_contains = "{card}"
""")
    ledger = str(tmp_path / "ledger.jsonl")
    scratch = ScratchDatabases(tmp_path)
    try:
        report = await evaluate(load_dataset(path, agent="demo-refund"),
                                agents=demo_agents(ledger), databases=scratch.new,
                                ledger_path=ledger)
    finally:
        scratch.cleanup()
    [row] = report.rows
    assert not row.ok and row.failures["completion"]
    shown = [eval_report.html(report), json.dumps([r.to_json() for r in report.rows]),
             "\n".join(row.reasons())]
    assert "•••• 4242" in shown[0]
    for text in shown:
        assert not re.search(r"4242[ -]?4242", text), text
