"""The web review queue's pages: pure functions from records to HTML.

Server-rendered HTML with one small stylesheet (served by the face itself, no external
asset), readable at a phone's width. Every value written into a page goes through
:func:`html.escape`, attributes included: agent-written text is data (invariant 9). The
arguments are drawn by :func:`shown_args` and nowhere else, so masking sensitive ones
is one function to change.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from html import escape
from typing import Any

from approvald.runtime import (
    WORDS,
    ApprovalPolicy,
    OperatorInsights,
    OutcomeName,
    asker,
    binding,
    outcome_of,
    shown_packet,
    will_run,
)
from approvald.runtime import shown_args as packet_shown_args
from approvald.store.records import ApprovalRecord

STYLE = """
*{box-sizing:border-box}
body{margin:0;font:16px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;
 background:#f4f5f7;color:#1d1c1d}
header{background:#1d1c1d;color:#fff;padding:.6rem 1rem;display:flex;
 justify-content:space-between;align-items:center;gap:.5rem;flex-wrap:wrap}
header h1{font-size:1.05rem;margin:0}
header form{margin:0}
header .who{color:#ddd;font-size:.88rem}
main{max-width:46rem;margin:0 auto;padding:.75rem}
.card{background:#fff;border:1px solid #ddd;border-radius:8px;padding:.9rem;margin:0 0 1rem;
 overflow-wrap:anywhere;min-width:0}
.card h2{font-size:1.1rem;margin:0 0 .4rem;overflow-wrap:anywhere}
.risk{display:inline-block;border-radius:4px;padding:0 .4rem;font-size:.8rem;
 font-weight:600;vertical-align:middle}
.risk-low{background:#d7f5dd}.risk-medium{background:#fff1c2}.risk-high{background:#ffd6d6}
.meta{color:#555;font-size:.88rem;margin:.3rem 0;overflow-wrap:anywhere}
.label{font-weight:600;margin:.6rem 0 .2rem}
pre{background:#f6f8fa;border:1px solid #e1e4e8;border-radius:6px;padding:.6rem;
 overflow-x:auto;white-space:pre-wrap;overflow-wrap:anywhere;font-size:.85rem;margin:0}
.actions{display:flex;flex-direction:column;gap:.5rem;margin-top:.8rem}
button{font:inherit;border:0;border-radius:6px;padding:.7rem 1rem;cursor:pointer;
 width:100%;min-height:44px}
.approve{background:#007a5a;color:#fff}.deny{background:#e01e5a;color:#fff}
.other{background:#e8e8e8;color:#1d1c1d}
header button{width:auto;min-height:0;padding:.3rem .7rem}
details{border:1px solid #ddd;border-radius:6px;padding:.4rem .6rem}
summary{cursor:pointer;font-weight:600;min-height:32px}
textarea,input[type=email]{width:100%;font:inherit;padding:.5rem;border:1px solid #bbb;
 border-radius:6px;margin:.3rem 0 .5rem}
textarea.args{font-family:ui-monospace,monospace;font-size:.85rem;min-height:8rem}
.notice{background:#e8f5fa;border:1px solid #9ccbe0;border-radius:6px;padding:.6rem;
 margin:0 0 1rem}
.error{background:#fdecee;border-color:#e8a0ae}
.empty{color:#555;text-align:center;padding:2rem 0}
.insights table{border-collapse:collapse;width:100%;font-size:.85rem;display:block;
 overflow-x:auto}
.insights th,.insights td{border-bottom:1px solid #e1e4e8;padding:.25rem .4rem;
 text-align:left}
"""

EDITABLE_CHARS = 20000  # past this, the arguments are not offered for editing here


def e(value: Any) -> str:
    """Escape anything for HTML text or a quoted attribute."""
    return escape("" if value is None else str(value), quote=True)


def shown_args(a: ApprovalRecord, raw: str | None) -> str:
    """The arguments as a person sees them on this face: pretty JSON of the stored text,
    the request's sensitive paths and what the detectors find masked."""
    value = packet_shown_args(a, raw or "{}")
    if isinstance(value, str):
        return value
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=False, default=str)


def _packet(a: ApprovalRecord) -> dict[str, Any]:
    """The decision packet, what the detectors find in it masked (as on the card)."""
    return shown_packet(a)


def _text(value: Any) -> str:
    if value is None:
        return ""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False,
                                                           default=str)


def risk_of(a: ApprovalRecord) -> str:
    for source in (_packet(a), _policy(a)):
        if source.get("risk") in ("low", "medium", "high"):
            return str(source["risk"])
    return "medium"


def _policy(a: ApprovalRecord) -> dict[str, Any]:
    try:
        value = json.loads(a.policy or "{}")
    except (TypeError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def _when(t: datetime) -> str:
    return t.strftime("%Y-%m-%d %H:%M UTC")


def page(title: str, body: str, *, user: str | None = None, csrf: str | None = None,
         status_line: str | None = None, then: str | None = None) -> str:
    """A whole page: the header (who is signed in, and a sign-out button), then ``body``."""
    who = ""
    if user is not None and csrf is not None:
        who = (f'<form method="post" action="/review/sign-out">'
               f'<input type="hidden" name="csrf" value="{e(csrf)}">'
               f'<span class="who">{e(user)}</span> '
               f'<button class="other" type="submit">Sign out</button></form>')
    notice = f'<div class="notice">{e(status_line)}</div>' if status_line else ""
    return ("<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width,initial-scale=1\">"
            + (f'<meta http-equiv="refresh" content="0;url={e(then)}">' if then else "") +
            f"<title>{e(title)} · approvald</title>"
            "<link rel=\"stylesheet\" href=\"/review/style.css\"></head><body>"
            f"<header><h1>approvald · {e(title)}</h1>{who}</header>"
            f"<main>{notice}{body}</main></body></html>")


def message(title: str, text: str, *, error: bool = False, back: bool = True,
            user: str | None = None, csrf: str | None = None) -> str:
    link = '<p><a href="/review">Back to the review queue</a></p>' if back else ""
    return page(title, f'<div class="notice{" error" if error else ""}">{e(text)}</div>{link}',
                user=user, csrf=csrf)


def sign_in_form(pre_csrf: str, *, note: str | None = None, slack: bool = False) -> str:
    """Ask for an address to mail a sign-in link to (and, where the operator configured
    it, offer Sign in with Slack)."""
    with_slack = ""
    if slack:
        with_slack = (
            '<form method="post" action="/review/sign-in/slack">'
            f'<input type="hidden" name="csrf" value="{e(pre_csrf)}">'
            '<button class="other" type="submit">Sign in with Slack</button></form>'
            '<p class="meta">Or by mail:</p>')
    return page("Sign in", (
        '<div class="card"><h2>Sign in to review requests</h2>' + with_slack +
        '<p class="meta">Enter the address approvald knows you by. A link that signs you in '
        'once, for 15 minutes, is mailed to it.</p>'
        '<form method="post" action="/review/sign-in/mail">'
        f'<input type="hidden" name="csrf" value="{e(pre_csrf)}">'
        '<input type="email" name="email" required autocomplete="email" '
        'placeholder="you@example.com" aria-label="Email address">'
        '<button class="approve" type="submit">Mail me a sign-in link</button></form></div>'),
        status_line=note)


def signed_in(user: str) -> str:
    """After Sign in with Slack: on to the queue (a page that goes there, not a redirect,
    so that the browser sends the new session's cookie along)."""
    return page("Signed in", (
        f'<div class="notice">Signed in as <strong>{e(user)}</strong>.</div>'
        '<p><a href="/review">Open the review queue</a></p>'), then="/review")


def confirm_sign_in(token: str, pre_csrf: str, user: str) -> str:
    """What opening a mailed link shows: a button, never a sign-in by itself (a mail
    scanner that fetches the link signs nobody in)."""
    return page("Sign in", (
        '<div class="card"><h2>Sign in</h2>'
        f'<p>Sign in to the review queue as <strong>{e(user)}</strong>?</p>'
        '<form method="post" action="/review/sign-in">'
        f'<input type="hidden" name="csrf" value="{e(pre_csrf)}">'
        f'<input type="hidden" name="token" value="{e(token)}">'
        '<button class="approve" type="submit">Sign in</button></form>'
        '<p class="meta">The link works once and for 15 minutes.</p></div>'))


def _args_block(a: ApprovalRecord) -> str:
    edited = a.edited_args is not None
    title = "Arguments as originally requested" if edited else "Exact arguments"
    out = f'<div class="label">{title}</div><pre>{e(shown_args(a, a.args))}</pre>'

    if edited:
        out += (f'<div class="label">Arguments that will run (edited by {e(a.edited_by)})</div>'
                f'<pre>{e(shown_args(a, a.edited_args))}</pre>')
    return out


def _hidden(a: ApprovalRecord, csrf: str, token: str | None, verdict: str) -> str:
    fields = {"csrf": csrf, "digest": binding.shown(a.effective_digest), "verdict": verdict}
    if token is not None:
        fields["token"] = token
    return "".join(f'<input type="hidden" name="{k}" value="{e(v)}">'
                   for k, v in fields.items())


def _at(value: Any) -> str:
    try:
        return _when(datetime.fromisoformat(str(value)))
    except ValueError:
        return "?"


def question_card(a: ApprovalRecord, *, csrf: str, token: str | None) -> str:
    """A question about a call whose outcome is unknown: what a person needs to go and
    check (which attempt, when it started and was last heard from, the idempotency key,
    the exact arguments, what reconcile said), and the card's answers: it did not run
    (retry, after a confirmation), it ran (mark done), or abort the run (with a reason)."""
    p = _packet(a)
    agent = asker(p.get("agent"))
    requester = a.requested_by or _text(p.get("requested_by"))
    parts = [f'<article class="card" id="r-{e(a.id)}">',
             f'<h2>Did <code>{e(a.tool)}</code> happen?</h2>',
             f'<p><strong>{e(agent)}</strong> started <code>{e(a.tool)}</code> for '
             f'{e(requester)}; whether it took effect is unknown. Check the system it acts '
             'on, then say what happened.</p>']
    task = _text(p.get("task"))
    if task:
        parts.append(f'<p class="meta">Task: {e(task)}</p>')
    if isinstance(p.get("attempt"), int):
        parts.append(f'<p class="meta">attempt {e(p["attempt"])}, started '
                     f'{e(_at(p.get("started_at")))}, last heard from '
                     f'{e(_at(p.get("heard_at")))}</p>')
    if p.get("idempotency_key"):
        parts.append(f'<div class="label">Idempotency key (look it up)</div>'
                     f'<pre>{e(_text(p["idempotency_key"]))}</pre>')
    if p.get("reconcile"):
        parts.append(f'<div class="label">What reconcile said</div>'
                     f'<p>{e(_text(p["reconcile"]))}</p>')
    if p.get("why"):
        parts.append(f'<div class="label">Why a human is asked</div><p>{e(_text(p["why"]))}</p>')
    parts.append(f'<div class="label">Exact arguments</div><pre>{e(shown_args(a, a.args))}</pre>')
    parts.append(f'<p class="meta">Question {e(a.id)} · arguments {e(binding.short(a.digest))}</p>')
    action = f"/review/requests/{e(a.id)}"
    parts += ['<div class="actions">',
              f'<form method="post" action="{action}">{_hidden(a, csrf, token, "mark_done")}'
              '<button class="approve" type="submit">It happened: mark done</button></form>',
              f'<details><summary>It did not happen: retry…</summary>'
              f'<form method="post" action="{action}">{_hidden(a, csrf, token, "retry")}'
              '<p class="meta">If the first attempt did take effect, retrying makes it happen '
              'twice. Retry only if you checked that it did not.</p>'
              '<button class="other" type="submit">Retry</button></form></details>',
              f'<details><summary>Abort the run…</summary><form method="post" action="{action}">'
              f'{_hidden(a, csrf, token, "abort")}'
              '<textarea name="reason" required maxlength="2000" rows="3" '
              'placeholder="What happened? This goes into the audit log." '
              'aria-label="Reason"></textarea>'
              '<button class="deny" type="submit">Abort</button></form></details>',
              "</div></article>"]
    return "".join(parts)


def request_card(a: ApprovalRecord, *, csrf: str, token: str | None, now: datetime) -> str:
    """One pending request: the same decision packet and exact arguments as its Slack card,
    and its answers (approve; deny with a reason; redirect with guidance; edit within
    what the operator's policy allows). An outcome question: :func:`question_card`."""
    if a.kind == "outcome_unknown":
        return question_card(a, csrf=csrf, token=token)
    p = _packet(a)
    w = will_run(a)
    policy = ApprovalPolicy.from_snapshot(a.policy)
    risk = risk_of(a)
    agent = asker(p.get("agent"))
    requester = a.requested_by or _text(p.get("requested_by"))
    parts = [f'<article class="card" id="r-{e(a.id)}">',
             f'<h2><code>{e(a.tool)}</code> <span class="risk risk-{e(risk)}">'
             f'{e(risk)} risk</span></h2>',
             f'<p><strong>{e(agent)}</strong> wants to run <code>{e(a.tool)}</code> for '
             f'{e(requester)}.</p>']
    task = _text(p.get("task"))
    if task:
        parts.append(f'<p class="meta">Task: {e(task)}</p>')
    if w.doing:
        label = "" if w.words_current else "(about the arguments first asked for) "
        parts.append(f'<div class="label">What it is doing</div><p>{e(label)}{e(w.doing)}</p>')
        if w.code:  # what the call runs or writes (a shell command), as it is
            parts.append(f'<pre>{e(w.code)}</pre>')
    evidence = p.get("evidence")
    if isinstance(evidence, list) and evidence:
        items = "".join(
            f'<li><code>{e(_text(i.get("tool") if isinstance(i, dict) else "?"))}</code>: '
            f'{e(_text(i.get("result") if isinstance(i, dict) else i)[:300])}</li>'
            for i in evidence[:5])
        parts.append(f'<div class="label">Evidence</div><ul>{items}</ul>')
    if w.impact:
        parts.append(f'<div class="label">Impact{" of the edited arguments" if w.edited else ""}'
                     f'</div><p>{e(w.impact)}</p>')
    elif w.original_impact:
        parts.append(f'<div class="label">Impact of the arguments first asked for</div>'
                     f'<p>{e(w.original_impact)}</p>')
    if p.get("why"):
        parts.append(f'<div class="label">Why approval is needed</div><p>{e(_text(p["why"]))}</p>')
    parts.append(_args_block(a))
    ctx = [f"Expires {_when(a.expires_at)}" if now < a.expires_at
           else f"Overdue since {_when(a.expires_at)}"]
    if a.quorum > 1:
        ctx.append(f"{a.approve_count} of {a.quorum} approvals")
    ctx.append("If nobody decides: escalated to the next approvers"
               if policy.on_expire == "escalate" else "If nobody decides: cancelled, "
               "never approved")
    rule = _policy(a).get("rule")
    if isinstance(rule, str) and rule:
        ctx.append(f"Rule: {rule}")
    approvers = a.approvers_value()
    ctx.append("Approvers: " + (", ".join(str(x) for x in approvers) if approvers
                                else "anyone but the requester"))
    ctx.append(f"Request {a.id} · arguments {binding.short(a.effective_digest)}")
    parts.extend(f'<p class="meta">{e(c)}</p>' for c in ctx)
    action = f"/review/requests/{e(a.id)}"
    parts.append('<div class="actions">')
    parts.append(f'<form method="post" action="{action}">{_hidden(a, csrf, token, "approve")}'
                 '<button class="approve" type="submit">Approve</button></form>')
    parts.append(f'<details><summary>Deny…</summary><form method="post" action="{action}">'
                 f'{_hidden(a, csrf, token, "deny")}'
                 '<textarea name="reason" required maxlength="2000" rows="3" '
                 'placeholder="Why (the agent reads this)" aria-label="Reason"></textarea>'
                 '<button class="deny" type="submit">Deny</button></form></details>')
    parts.append(f'<details><summary>Redirect…</summary><form method="post" action="{action}">'
                 f'{_hidden(a, csrf, token, "redirect")}'
                 '<textarea name="reason" required maxlength="2000" rows="3" '
                 'placeholder="What the agent should do instead" aria-label="Guidance">'
                 '</textarea><button class="other" type="submit">Redirect</button>'
                 '</form></details>')
    current = shown_args(a, a.edited_args or a.args)
    if len(current) <= EDITABLE_CHARS:
        verb = "Propose" if policy.edits == "propose" else "Approve with"
        parts.append(f'<details><summary>Edit…</summary><form method="post" action="{action}">'
                     f'{_hidden(a, csrf, token, "edit")}'
                     f'<textarea class="args" name="args" required aria-label="Arguments">'
                     f'{e(current)}</textarea>'
                     f'<button class="other" type="submit">{e(verb)} these arguments</button>'
                     '</form></details>')
    parts.append("</div></article>")
    return "".join(parts)


def queue(items: Sequence[tuple[ApprovalRecord, str | None]], *, user: str, csrf: str,
          now: datetime, note: str | None = None, error: bool = False,
          insights: OperatorInsights | None = None) -> str:
    """The queue: the pending requests ``user`` may decide, oldest first; then, for an
    operator, the insights (``insights``)."""
    body = "".join(request_card(a, csrf=csrf, token=t, now=now) for a, t in items)
    if not items:
        body = '<p class="empty">Nothing waits for you.</p>'
    if note:
        body = f'<div class="notice{" error" if error else ""}">{e(note)}</div>' + body
    if insights is not None:
        body += insights_section(insights)
    return page("Review queue", body, user=user, csrf=csrf)


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}"


def _wait(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:.0f}s" if x < 90 else f"{x / 60:.1f}m" if x < 5400 else f"{x / 3600:.1f}h"


def insights_section(view: OperatorInsights) -> str:
    """What an operator sees under the queue: per tool, how often people are asked, what
    they answer and how fast, who decides; shadow rules' records; suggested rules, each a
    snippet to paste (``approvald insights``, the same figures)."""
    title = f"Insights: the last {e(view.window)}"
    found = view.insights
    if found is None:
        why = e(view.broken[0]) if view.broken else ""
        return (f'<section class="card insights"><h2>{title}</h2><p class="notice error">'
                f"The audit log does not verify, so its record is not read: {why}</p>"
                "</section>")
    out = [f'<section class="card insights"><h2>{title}</h2>',
           f'<p class="meta">{found.requests} requests, as of {e(_when(view.at))}</p>']
    if found.tools:
        out.append('<table><thead><tr><th>tool</th><th>asked</th><th>approve</th>'
                   '<th>edit</th><th>deny</th><th>expire</th><th>median</th><th>p90</th>'
                   '</tr></thead><tbody>')
        for st in found.tools:
            d = st.document()
            out.append(f"<tr><td>{e(st.name)}</td><td>{st.asked}</td>"
                       f"<td>{_pct(d['approve_rate'])}</td><td>{_pct(d['edit_rate'])}</td>"
                       f"<td>{_pct(d['deny_rate'])}</td><td>{_pct(d['expire_rate'])}</td>"
                       f"<td>{_wait(d['median_seconds'])}</td>"
                       f"<td>{_wait(d['p90_seconds'])}</td></tr>")
        out.append("</tbody></table>")
        for st in found.tools:
            d = st.document()
            said = []
            if d["top_denial_reasons"]:
                said.append("denied for: " + "; ".join(
                    f"{e(r['reason'])} ({r['count']})" for r in d["top_denial_reasons"]))
            if d["deciders"]:
                said.append("decided by: " + ", ".join(
                    f"{e(k)} ({n})" for k, n in d["deciders"].items()))
            if d["asked_of"]:
                said.append("asked of: " + ", ".join(
                    f"{e(k)} ({n})" for k, n in d["asked_of"].items()))
            if said:
                out.append(f'<p class="meta"><strong>{e(st.name)}</strong>: '
                           + " · ".join(said) + "</p>")
    else:
        out.append('<p class="empty">No requests in the window.</p>')
    for sh in found.shadows:
        out.append(f'<p class="meta">Shadow rule {e(sh.where)} ({e(sh.when or "the entry")})'
                   f": held for {sh.matched}; people agreed on {sh.agreed} of {sh.settled}"
                   "</p>")
    if found.suggestions:
        out.append('<div class="label">Suggested rules (paste into the policy file; nothing '
                   "is applied)</div>")
        for sg in found.suggestions:
            out.append(f"<p>{e(sg.text)}</p><pre>{e(sg.snippet)}</pre>")
    out.append("</section>")
    return "".join(out)


def request_text(a: ApprovalRecord, link: str, *, slack: bool) -> str:
    """A request as a plain-text mail: the packet, the exact arguments, and where to
    decide it: the review queue, and its card in Slack where this deployment posts cards
    (``slack``). (Plain text: no markup an argument could smuggle in.)"""
    p = _packet(a)
    w = will_run(a)
    lines = [f"{asker(p.get('agent'))} wants to run {a.tool} for "
             f"{a.requested_by or _text(p.get('requested_by'))} ({risk_of(a)} risk)."]
    task = _text(p.get("task"))
    if task:
        lines.append(f"Task: {task}")
    if w.doing:
        lines += ["", "What it is doing" + ("" if w.words_current else
                                            " (about the arguments first asked for)") + ":",
                  w.doing, *([w.code] if w.code else [])]
    if w.impact:
        lines += ["", "Impact:", w.impact]
    if p.get("why"):
        lines += ["", "Why approval is needed:", _text(p["why"])]
    lines += ["", "Exact arguments:", shown_args(a, a.edited_args or a.args), "",
              f"Expires {_when(a.expires_at)}. Request {a.id}, arguments "
              f"{binding.short(a.effective_digest)}.", "",
              f"Review and decide (sign-in needed): {link}"]
    if slack:
        lines.append("Or decide on its card in Slack.")
    return "\n".join(lines) + "\n"


VIA_WORDS = {"web": "on the web review queue", "slack": "in Slack", "standing":
             "by a standing approval"}


def _where(via: str) -> str:
    return VIA_WORDS.get(via, "from the command line" if via.startswith("cli") else via)


def edit_text(a: ApprovalRecord, edit: dict[str, Any], link: str) -> str:
    """An edit of a mailed request, told in its thread: who changed what (the values as
    the edit's outbox row holds them: masked where sensitive), and that the request now
    binds to the new arguments."""
    by, via = _text(edit.get("by")), _text(edit.get("via"))
    try:
        when = _when(datetime.fromisoformat(str(edit.get("at"))))
    except ValueError:
        when = "?"
    lines = [f"{by} edited the arguments of {a.tool} (request {a.id})"
             + (f" {_where(via)}" if via else "") + f" at {when}.", "", "What changed:"]
    for change in edit.get("changes") or []:
        path, before, after = [*list(change), None, None, None][:3]
        lines.append(f"  {path}: " + ("(added)" if before is None else str(before))
                     + " -> " + ("(removed)" if after is None else str(after)))
    more = edit.get("more")
    if isinstance(more, int) and more > 0:
        lines.append(f"  (and {more} more)")
    digest, previous = _text(edit.get("digest")), _text(edit.get("previous_digest"))
    lines += ["", "The request now binds to the new arguments (digest "
                  f"{binding.short(digest)}, was {binding.short(previous)}): an approval "
                  "counts only for them, and if the request is approved, exactly they run. A "
                  "link or a card showing the old ones can no longer decide it."]
    if edit.get("mode") == "propose":
        lines.append(f"Someone other than {by} must approve them.")
    else:
        lines.append(f"The edit is {by}'s approval of them.")
    discarded = [str(x) for x in edit.get("discarded") or []]
    if discarded:
        lines.append(f"Approvals given on the old arguments ({', '.join(discarded)}) no "
                     "longer count.")
    lines += ["", f"The request: {link}"]
    return "\n".join(lines) + "\n"


def outcome_line(a: ApprovalRecord) -> str:
    """What became of a closed request (or question), in its outcome's words (as every
    view says it): by whom, when, where, and why."""
    named = outcome_of(a)
    text = f"{a.tool} (request {a.id}) was {WORDS[named].words}"
    if a.decided_by and named is not OutcomeName.APPROVED_STANDING \
            and a.status not in ("expired", "superseded"):
        where = _where(a.decided_via or "")
        text += f" by {a.decided_by}" + (f" {where}" if where else "")
    when = a.decided_at or (a.expires_at if a.status in ("expired", "superseded") else None)
    if when is not None:
        text += f" at {_when(when)}"
    text += "."
    if a.reason:
        text += f" {'Guidance' if a.status == 'redirected' else 'Reason'}: {a.reason}"
    return text
