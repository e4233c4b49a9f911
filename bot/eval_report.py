"""``approvald eval --report``: the journey evals of a dataset as one HTML file.

The file is self-contained (inline CSS and SVG, no script, no external URL), so it can be
attached to a ticket or kept as a CI artifact: a verdict, a bar per score (how many
journeys passed it), a table of journeys (task x interruption x score) with each failing
journey's reasons under it, and the timeline of every failing journey (the same one
``approvald trace --format html`` draws), linked from its row. Every string that came
from the dataset, a model, a tool or a person is escaped: it is data, never markup.
"""

from __future__ import annotations

import re
from html import escape
from typing import Any

from approvald.bot import trace_view
from approvald.bot.evals.evaluate import Report, Row
from approvald.bot.evals.score import SCORES
from approvald.runtime import mask_text

WHAT = {  # what each score checks, for the bars' and the columns' tooltips
    "completion": "the run's final status and its final answer",
    "tools": "the tools called, not called, and how often each ran",
    "arguments": "the arguments of the expected calls (a JSON subset match)",
    "approvals": "every gated call that ran had an approved request with its exact "
                 "arguments; nothing denied or expired ran; the decisions were accepted",
    "recovery": "no duplicate side effect; an interrupted journey ends as the "
                "uninterrupted one did",
    "cost": "model steps, and money where the model reports it",
    "latency": "the wall time of the whole journey",
}
LABEL_W, TRACK_W, BAR_H, BAR_GAP, NUMBERS_W = 110, 420, 20, 10, 230

_CSS = """
.verdict{padding:12px 16px;border-radius:6px;margin:0 0 16px;border:2px solid}
.verdict.pass{background:#e6f4ea;border-color:#2e7d32;color:#1b5e20}
.verdict.fail{background:#fdecea;border-color:#c62828;color:#8e1c1c}
.verdict h1{color:#1d1c1d} .verdict p{margin:4px 0 0;font-size:16px}
.verdict-word{font-weight:700;letter-spacing:.05em}
h2{font-size:17px;margin:28px 0 8px}
svg#scores{background:#fff;border:none}
.score-label{fill:#1d1c1d;font-size:13px} .score-numbers{fill:#1d1c1d;font-size:13px}
.track{fill:#f0d0cd} .passed{fill:#3aa675} .track.empty{fill:#e4e4e4}
table.journeys{margin-top:8px;width:auto}
table.journeys td,table.journeys th{white-space:nowrap}
table.journeys td.num{text-align:right;font-variant-numeric:tabular-nums}
.ok{color:#23784f} .fail{color:#b3261e;font-weight:700}
tr.journey.failed td{background:#fff5f4}
tr.details td{background:#fff5f4;white-space:normal;padding:2px 8px 10px 28px}
tr.details.passed td{background:#fff}
tr.details ul{margin:0;padding-left:18px} tr.details li{margin:2px 0}
.reason{font-family:ui-monospace,SFMono-Regular,Menlo,monospace;font-size:12px;
 white-space:pre-wrap;word-break:break-word}
.asked{color:#5a4a00} .answer{color:#444}
section.trace{border-top:3px solid #c62828;margin-top:32px;padding-top:4px;
 scroll-margin-top:8px}
section.trace:target{outline:3px solid #e0a030;outline-offset:4px}
section.trace h3{font-size:15px;margin:12px 0 4px}
.scroll{overflow-x:auto}
"""


def _e(value: Any) -> str:
    # a report is read by people: secrets in what a run said or did are masked (issue 34)
    return escape(mask_text(str(value)), quote=True)


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "x"


def journey_ids(report: Report) -> list[str]:
    """A unique, valid element id part per row (``<task>-<interruption>`` made of
    ``[a-z0-9-]``, numbered where two rows would otherwise meet)."""
    seen: set[str] = set()
    out: list[str] = []
    for r in report.rows:
        base = f"{_slug(r.task)}--{_slug(r.variant)}"
        candidate, n = base, 1
        while candidate in seen:
            n += 1
            candidate = f"{base}-{n}"
        seen.add(candidate)
        out.append(candidate)
    return out


def _bars(report: Report) -> str:
    """One horizontal bar per score: the journeys that passed it out of all of them, the
    numbers written beside it (readable without the colours)."""
    total = len(report.rows)
    width = LABEL_W + TRACK_W + NUMBERS_W
    height = len(SCORES) * (BAR_H + BAR_GAP) + BAR_GAP
    parts = [f'<svg id="scores" role="img" aria-label="journeys that passed each score" '
             f'width="{width}" height="{height}" viewBox="0 0 {width} {height}">']
    for i, s in enumerate(SCORES):
        passed = sum(not r.failures.get(s) for r in report.rows)
        top = BAR_GAP + i * (BAR_H + BAR_GAP)
        w = TRACK_W * passed / total if total else 0.0
        words = f"{passed}/{total} passed" + (f", {total - passed} failed"
                                              if passed < total else "")
        parts.append(
            f'<g class="score-bar" data-score="{s}" data-passed="{passed}" '
            f'data-total="{total}"><title>{_e(s)}: {_e(words)} ({_e(WHAT[s])})</title>'
            f'<text class="score-label" x="{LABEL_W - 8}" y="{top + 15}" '
            f'text-anchor="end">{_e(s)}</text>'
            f'<rect class="track{"" if total else " empty"}" x="{LABEL_W}" y="{top}" '
            f'width="{TRACK_W}" height="{BAR_H}" rx="3"/>'
            f'<rect class="passed" x="{LABEL_W}" y="{top}" width="{w:.1f}" '
            f'height="{BAR_H}" rx="3"/>'
            f'<text class="score-numbers" x="{LABEL_W + TRACK_W + 8}" y="{top + 15}">'
            f"{_e(words)}</text></g>")
    parts.append("</svg>")
    return "".join(parts)


def _details(r: Row) -> str:
    """What goes under a journey's row: its reasons, its final answer when it failed,
    and the questions a person was asked."""
    items = [f'<li><strong>{_e(s)}</strong>: <span class="reason">{_e(why)}</span></li>'
             for s in SCORES for why in r.failures.get(s, [])]
    if not r.ok:
        j = r.journey
        answer = j.error if j.error and not j.result else j.result
        items.append(f'<li class="answer">the run ended <strong>{_e(j.status)}</strong>'
                     + (f'; final answer: <span class="reason">{_e(answer)}</span>'
                        if answer else "") + "</li>")
    items.extend(f'<li class="asked">a person was asked whether {_e(what)}</li>'
                 for what in r.journey.asked)
    return f"<ul>{''.join(items)}</ul>" if items else ""


def _table(report: Report, ids: list[str]) -> str:
    heads = "".join(f'<th title="{_e(WHAT[s])}">{_e(s)}</th>' for s in SCORES)
    span = 2 + len(SCORES) + 4
    rows = []
    for r, rid in zip(report.rows, ids, strict=True):
        cells = "".join(
            f'<td class="score fail" data-score="{s}" title="{_e("; ".join(r.failures[s]))}">'
            "FAIL</td>" if r.failures.get(s) else
            f'<td class="score ok" data-score="{s}">ok</td>' for s in SCORES)
        link = (f'<a class="trace-link" href="#trace-{rid}">trace</a>' if not r.ok else "")
        verdict = '<td class="result ok">PASS</td>' if r.ok else \
            '<td class="result fail">FAIL</td>'
        rows.append(
            f'<tr id="journey-{rid}" class="journey {"passed" if r.ok else "failed"}" '
            f'data-ok="{str(r.ok).lower()}"><td>{_e(r.task)}</td><td>{_e(r.variant)}</td>'
            f'{cells}<td class="num">{r.journey.steps}</td>'
            f'<td class="num">{r.journey.latency_ms:.0f}</td>{verdict}<td>{link}</td></tr>')
        details = _details(r)
        if details:
            rows.append(f'<tr class="details {"passed" if r.ok else "failed"}">'
                        f'<td colspan="{span}">{details}</td></tr>')
    return ('<table id="journeys" class="journeys"><thead><tr><th>task</th>'
            f'<th>interruption</th>{heads}<th>steps</th><th>ms</th><th>result</th>'
            f'<th>trace</th></tr></thead><tbody>{"".join(rows)}</tbody></table>')


def _trace_section(r: Row, rid: str) -> str:
    sid = f"trace-{rid}"
    trace = r.journey.trace
    inner = (f'<div class="scroll">{trace_view.body(trace, ids=f"{sid}-", heading="h3")}'
             "</div>" if trace is not None else
             "<p>No timeline: the run's trace could not be read.</p>")
    reasons = "".join(f'<li><span class="reason">{_e(x)}</span></li>' for x in r.reasons())
    return (f'<section id="{sid}" class="trace"><h2>Trace: {_e(r.task)} · {_e(r.variant)}'
            f' · <span class="fail">FAIL</span></h2>'
            + (f"<ul>{reasons}</ul>" if reasons else "")
            + f'<p><a href="#journey-{rid}">back to its row</a> · '
            f'<a href="#journeys">the table</a></p>{inner}</section>')


def html(report: Report) -> str:
    """The whole report, one self-contained page."""
    ids = journey_ids(report)
    passed, total = sum(r.ok for r in report.rows), len(report.rows)
    word = "PASS" if report.ok else "FAIL"
    failing = [(r, rid) for r, rid in zip(report.rows, ids, strict=True) if not r.ok]
    tasks = len(dict.fromkeys(r.task for r in report.rows))
    header = (
        f'<header class="verdict {word.lower()}"><h1>Journey evals: {_e(report.dataset)}</h1>'
        f'<p><span class="verdict-word" id="verdict">{word}</span>: {passed}/{total} '
        f'journeys passed' + (f", {total - passed} failed" if passed < total else "")
        + f" ({tasks} task{'s' if tasks != 1 else ''}, each uninterrupted and under its "
        "interruptions)</p></header>")
    traces = ("<h2>Traces of the failing journeys</h2>"
              + "".join(_trace_section(r, rid) for r, rid in failing)) if failing else ""
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{word} · journey evals: {_e(report.dataset)}</title>"
        f"<style>{trace_view.CSS}{_CSS}</style></head><body>{header}"
        "<h2>Scores</h2><p class=\"sub\">Each bar: the journeys that passed that score, "
        "out of all of them (hover a bar for what the score checks).</p>"
        f"{_bars(report)}<h2>Journeys</h2>"
        '<p class="sub">Under each failing journey, why it failed; its trace link goes to '
        "its run's timeline, further down.</p>"
        f'<div class="scroll">{_table(report, ids)}</div>{traces}</body></html>\n'
    )
