"""How ``approvald trace`` shows a run's timeline: text for a terminal, one HTML page.

The HTML page is self-contained (inline CSS and SVG, no script, no external URL), so it
can be mailed or attached to a ticket. Every string that came from a model, a tool or a
person (arguments, results, reasons) is escaped: it is data, never markup.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime
from html import escape
from typing import Any

from approvald.runtime import Entry, Totals, Trace, summarize

LANES = (("model", "model"), ("tools", "tools"), ("humans", "humans"))
BAR_H, ROW_GAP, LANE_PAD = 18, 4, 8
LEFT, PLOT_W, AXIS_H, MARK_H = 90, 1000, 26, 22
MIN_BAR = 4  # px: a 1 ms model step next to a 2-hour wait must still be seen


def duration(ms: float | None) -> str:
    """``0.4 ms``, ``812 ms``, ``3.2 s``, ``4m 10s``, ``2h 5m``, ``3d 4h``."""
    if ms is None:
        return "?"
    if ms < 10:
        return f"{ms:.1f} ms"
    if ms < 1000:
        return f"{ms:.0f} ms"
    s = ms / 1000
    if s < 60:
        return f"{s:.1f} s"
    m, s = divmod(int(s), 60)
    if m < 60:
        return f"{m}m {s}s"
    h, m = divmod(m, 60)
    if h < 24:
        return f"{h}h {m}m"
    d, h = divmod(h, 24)
    return f"{d}d {h}h"


def _rel(t: datetime, t0: datetime) -> str:
    return "+" + duration((t - t0).total_seconds() * 1000).replace(" ", "")


def _span_ms(e: Entry) -> float | None:
    """How long it took: a measured latency (exact even under a coarse clock), else the
    bar's length; None while it goes on."""
    if e.latency_ms is not None:
        return e.latency_ms
    if e.end is None:
        return None
    return (e.end - e.start).total_seconds() * 1000


def _tokens(e: Entry | Totals) -> str:
    parts = []
    if e.input_tokens is not None or e.output_tokens is not None:
        parts.append(f"tokens {e.input_tokens if e.input_tokens is not None else '?'} in / "
                     f"{e.output_tokens if e.output_tokens is not None else '?'} out")
    if e.cost_usd is not None:
        parts.append(f"${e.cost_usd:.4f}")
    return ", ".join(parts)


def _args(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=False)


def describe(e: Entry) -> tuple[str, list[str]]:
    """One entry as a headline and detail lines (plain text; the page escapes them)."""
    more: list[str] = []
    if e.kind == "model_step":
        bits = [b for b in (e.model, f"instructions {e.instructions_version}"
                            if e.instructions_version else None,
                            duration(e.latency_ms) if e.latency_ms is not None else None,
                            _tokens(e) or None) if b]
        head = e.title + (f"  [{', '.join(bits)}]" if bits else "")
        if e.content:
            more.append(f"says: {summarize(e.content)}")
        return head, more
    if e.kind == "tool_call":
        bits = [b for b in (duration(e.latency_ms) if e.latency_ms is not None else None,
                            f"attempts {e.attempts}" if e.attempts and e.attempts > 1 else None,
                            e.error_class) if b]
        head = e.title + "".join(f"  {b}" for b in bits)
        if e.outcome is not None:
            more.append(f"outcome {e.outcome}")
        more.append(f"args {_args(e.arguments)}")
        if e.result_summary is not None:
            more.append(f"result {e.result_summary}")
        if e.error:
            more.append(f"error {summarize(e.error)}")
        more.append(f"idempotency key {e.idempotency_key}")
        return head, more
    if e.kind == "approval":
        waited = ("waiting " if e.pending else "after ") + duration(e.wait_ms) \
            if e.wait_ms is not None else ""
        head = f"{e.title}  {waited}".rstrip()
        more.append(f"request {e.approval_id}, digest {e.effective_digest}"
                    + (f" (edited by {e.edited_by}; first {e.digest})"
                       if e.effective_digest != e.digest else ""))
        if e.decided_at is not None:
            more.append(f"decided {e.decided_at.isoformat()} via {e.decided_via}")
        if e.reason:
            more.append(f"reason {summarize(e.reason)}")
        for v in e.votes or []:
            more.append(f"vote {v.actor} {v.verdict} on {v.digest[:12]}… at "
                        f"{v.at.isoformat()} via {v.via}"
                        + ("" if v.counts else " (not counted: cast on other arguments)"))
        for d in e.disagrees or []:  # the row against the audit chain (issue 52)
            more.append(f"DISAGREES WITH THE AUDIT LOG: {d}")
        return head, more
    head = e.title + (f"  ({e.via})" if e.via and e.via != "runtime" else "")
    if e.details:
        more.append(" ".join(f"{k}={_args(v) if not isinstance(v, str) else v}"
                             for k, v in e.details.items() if v is not None))
    return head, more


def text(trace: Trace) -> str:
    """The timeline for a terminal, times relative to the run's start."""
    t0, tt = trace.started_at, trace.totals
    lines = [
        f"run {trace.run_id}  {trace.agent}  {trace.status}",
        f"  task: {trace.task}",
        f"  requested by {trace.requested_by}; {trace.started_at.isoformat()} .. "
        f"{trace.ended_at.isoformat()} "
        f"({duration((trace.ended_at - t0).total_seconds() * 1000)})",
        f"  model: {tt.model_steps} steps, {duration(tt.model_ms)}"
        + (f", {_tokens(tt)}" if _tokens(tt) else ""),
        f"  tools: {tt.tool_calls} calls, {duration(tt.tool_ms)}; approvals: {tt.approvals}, "
        f"humans took {duration(tt.human_wait_ms)}",
    ]
    if trace.result is not None:
        lines.append(f"  result: {summarize(trace.result)}")
    if trace.error:
        lines.append(f"  error: {summarize(trace.error)}")
    lines.append("")
    for e in trace.entries:
        head, more = describe(e)
        when = _rel(e.start, t0) + ("~" if e.estimated else "")
        lines.append(f"  {when:>10}  {e.lane:<6}  {head}")
        lines.extend(f"  {'':>10}  {'':<6}    {m}" for m in more)
    return "\n".join(lines) + "\n"


# -- HTML -------------------------------------------------------------------------------

CSS = """
body{font:14px/1.4 system-ui,-apple-system,"Segoe UI",sans-serif;margin:24px;color:#1d1c1d}
h1{font-size:20px;margin:0 0 4px} .sub{color:#616061;margin:0 0 16px}
dl{display:grid;grid-template-columns:max-content 1fr;gap:2px 12px;margin:0 0 16px}
dt{color:#616061} dd{margin:0}
svg{background:#fafafa;border:1px solid #ddd;border-radius:4px}
.lane-label{font-weight:600;fill:#444} .axis{fill:#888;font-size:11px}
.grid{stroke:#e4e4e4} .lane-sep{stroke:#ccc}
.bar.model{fill:#6b8fd6} .bar.tools{fill:#3aa675} .bar.humans{fill:#e0a030}
.bar.failed,.bar.error{fill:#d9534f}
.bar.denied,.bar.redirected,.bar.expired,.bar.cancelled{fill:#b07aa1}
.bar.open{fill-opacity:.45;stroke:#e0a030;stroke-dasharray:4 2}
.bar-label{font-size:11px;fill:#222}
.mark{stroke:#555;stroke-width:1.5} .mark-dot{fill:#555}
table{border-collapse:collapse;margin-top:20px;width:100%}
th,td{border-bottom:1px solid #e4e4e4;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#f4f4f4} td.t{white-space:nowrap;font-variant-numeric:tabular-nums}
td pre{margin:0;white-space:pre-wrap;word-break:break-word;font-size:12px}
.lane-model{color:#3b5fa8} .lane-tools{color:#23784f} .lane-humans{color:#a86d00}
.lane-run{color:#555}
"""


def _e(value: Any) -> str:
    return escape(str(value), quote=True)


def _rows(entries: list[Entry], x: Callable[[datetime], float]) -> list[tuple[Entry, int]]:
    """Bars of one lane in rows so that overlapping bars do not hide each other."""
    ends: list[float] = []
    out: list[tuple[Entry, int]] = []
    for e in entries:
        x0 = x(e.start)
        x1 = max(x(e.end) if e.end is not None else x0, x0 + MIN_BAR)
        row = next((i for i, end in enumerate(ends) if end <= x0), None)
        if row is None:
            ends.append(x1)
            row = len(ends) - 1
        else:
            ends[row] = x1
        out.append((e, row))
    return out


def _svg(trace: Trace, svg_id: str = "swimlane") -> str:
    t0 = trace.started_at
    span = max((trace.ended_at - t0).total_seconds(), 0.001)

    def x(t: datetime) -> float:
        return LEFT + (t - t0).total_seconds() / span * PLOT_W

    parts: list[str] = []
    y = AXIS_H + MARK_H
    lanes: list[tuple[str, int, int]] = []  # (name, top, height)
    bars: list[str] = []
    for lane, label in LANES:
        placed = _rows([e for e in trace.entries if e.lane == lane], x)
        rows = max((r for _, r in placed), default=0) + 1
        height = LANE_PAD * 2 + rows * BAR_H + (rows - 1) * ROW_GAP
        lanes.append((label, y, height))
        for e, row in placed:
            top = y + LANE_PAD + row * (BAR_H + ROW_GAP)
            x0 = x(e.start)
            width = max((x(e.end) - x0) if e.end is not None else 0.0, MIN_BAR)
            head, more = describe(e)
            classes = f"bar {lane} {_e(e.status or '')}" + (" open" if e.pending else "")
            tip = "\n".join([head, *more])
            bars.append(
                f'<g class="item" data-kind="{e.kind}" data-lane="{lane}">'
                f'<rect class="{classes}" x="{x0:.1f}" y="{top}" width="{width:.1f}" '
                f'height="{BAR_H}" rx="3"><title>{_e(tip)}</title></rect>'
                f'<text class="bar-label" x="{x0 + width + 4:.1f}" y="{top + 13}">'
                f'{_e(summarize(e.title, 60))} · {_e(duration(_span_ms(e)))}</text></g>')
        y += height
    total_h = y + 6
    width = LEFT + PLOT_W + 260  # room for the labels of bars that end at the right
    parts.append(f'<svg id="{_e(svg_id)}" class="swimlane" role="img" aria-label="timeline of run '
                 f'{_e(trace.run_id)}" width="{width}" height="{total_h}" '
                 f'viewBox="0 0 {width} {total_h}">')
    for i in range(11):  # time axis: ten intervals over the run
        gx = LEFT + PLOT_W * i / 10
        parts.append(f'<line class="grid" x1="{gx:.1f}" y1="{AXIS_H - 6}" x2="{gx:.1f}" '
                     f'y2="{total_h}"/>'
                     f'<text class="axis" x="{gx:.1f}" y="14" text-anchor="middle">'
                     f'+{_e(duration(span * 1000 * i / 10))}</text>')
    parts.append(f'<text class="lane-label" x="8" y="{AXIS_H + 15}">run</text>')
    for e in trace.entries:
        if e.lane != "run":
            continue
        mx = x(e.start)
        head, more = describe(e)
        parts.append(f'<g class="mark-item" data-kind="transition"><line class="mark" '
                     f'x1="{mx:.1f}" y1="{AXIS_H + 2}" x2="{mx:.1f}" y2="{AXIS_H + MARK_H - 2}"/>'
                     f'<circle class="mark-dot" cx="{mx:.1f}" cy="{AXIS_H + 4}" r="3">'
                     f'<title>{_e(chr(10).join([head, *more]))}</title></circle></g>')
    for label, top, height in lanes:
        parts.append(f'<g class="lane" data-lane="{label}">'
                     f'<line class="lane-sep" x1="0" y1="{top}" x2="{width}" y2="{top}"/>'
                     f'<text class="lane-label" x="8" y="{top + height / 2 + 5:.0f}">'
                     f'{label}</text></g>')
    parts.extend(bars)
    parts.append("</svg>")
    return "".join(parts)


def body(trace: Trace, *, ids: str = "", heading: str = "h1") -> str:
    """The page's content without the page around it (the eval report embeds it):
    ``ids`` prefixes the swimlane's and the table's element ids, which must be unique
    where several traces share a page; ``heading`` is the run title's element."""
    t0, tt = trace.started_at, trace.totals
    rows = []
    for i, e in enumerate(trace.entries, 1):
        head, more = describe(e)
        rows.append(
            f'<tr data-kind="{e.kind}"><td class="t">{i}</td>'
            f'<td class="t" title="{_e(e.start.isoformat())}">{_e(_rel(e.start, t0))}'
            f'{"~" if e.estimated else ""}</td>'
            f'<td class="lane-{e.lane}">{_e(e.lane)}</td>'
            f'<td class="t">{_e(duration(_span_ms(e))) if e.end is not None else ""}</td>'
            f'<td><strong>{_e(head)}</strong>'
            + (f'<pre>{_e(chr(10).join(more))}</pre>' if more else "") + "</td></tr>")
    facts = [
        ("agent", trace.agent), ("status", trace.status), ("task", trace.task),
        ("requested by", trace.requested_by),
        ("instructions", trace.instructions_version),
        ("started", trace.started_at.isoformat()), ("ended", trace.ended_at.isoformat()),
        ("model", f"{tt.model_steps} steps, {duration(tt.model_ms)}"
         + (f", {_tokens(tt)}" if _tokens(tt) else "")),
        ("tools", f"{tt.tool_calls} calls, {duration(tt.tool_ms)}"),
        ("humans", f"{tt.approvals} requests, {duration(tt.human_wait_ms)} waiting"),
    ]
    if trace.result is not None:
        facts.append(("result", trace.result))
    if trace.error:
        facts.append(("error", trace.error))
    dl = "".join(f"<dt>{_e(k)}</dt><dd>{_e(v)}</dd>" for k, v in facts)
    return (
        f'<{heading}>Run {_e(trace.run_id)}</{heading}>'
        f'<p class="sub">{_e(trace.agent)} · {_e(trace.status)} · '
        f'{_e(duration((trace.ended_at - t0).total_seconds() * 1000))}; hover a bar for '
        f"details, times are from the run's start (~ marks a time the store does not "
        f"know, taken from the step before)</p>"
        f"<dl>{dl}</dl>{_svg(trace, f'{ids}swimlane')}"
        f'<table id="{_e(ids)}entries" class="entries"><thead><tr><th>#</th><th>at</th>'
        '<th>lane</th><th>took</th>'
        f'<th>what</th></tr></thead><tbody>{"".join(rows)}</tbody></table>'
    )


def html(trace: Trace) -> str:
    """One self-contained page: a swimlane of model / tools / humans, then a table."""
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>trace of run {_e(trace.run_id)}</title><style>{CSS}</style></head>"
        f"<body>{body(trace)}</body></html>\n"
    )
