"""Every outcome (runtime.kernel.vocabulary) through every view that names one: each names it
with the one definition's name, words, label and emoji, and no view has words of its own
(issue 48 item 2, design invariant 24). The audit log's side is in
tests/integration/test_outcome_audit.py."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from approvald.bot import documents
from approvald.bot.cli.approvals import list_line
from approvald.bot.slack import cards, messages
from approvald.bot.slack import texts as T
from approvald.bot.web import pages
from approvald.runtime import callers, trace
from approvald.runtime.approvals import decide
from approvald.runtime.kernel.errors import Refusal
from approvald.runtime.kernel.vocabulary import (
    CALL,
    KINDS,
    QUESTIONS,
    TOOL_CALL,
    WORDS,
    OutcomeName,
    deadline,
    outcome_of,
    policy_outcome,
)
from approvald.runtime.record.shown import RunMasking
from approvald.runtime.runs import external
from approvald.store.records import ApprovalRecord, RunRecord
from approvald.store.repos.external import ExternalRecord

NOW = datetime(2026, 6, 1, 9, 0, tzinfo=UTC)
N = OutcomeName


def request(kind: str = TOOL_CALL, **kw: Any) -> ApprovalRecord:
    fields: dict[str, Any] = dict(
        id="a" * 32, run_id="r" * 32, call_id="call1", kind=kind, tool="pay",
        args=json.dumps({"invoice": "INV-1"}), digest="d1", edited_args=None,
        edited_digest=None, edited_by=None, edited_at=None, status="pending", rung=0,
        supersedes=None, approvers=json.dumps(["U_ALICE"]), quorum=1, approve_count=0,
        policy=json.dumps({"approvers": ["U_ALICE"], "quorum": 1, "ttl": "30m",
                           "on_expire": "cancel", "escalate": [], "risk": "medium"}),
        packet=json.dumps({"agent": "payer", "task": "Pay INV-1", "doing": "Paying.",
                           "requested_by": "U_DANA"}),
        requested_by="U_DANA", token_nonce="n0", requested_at=NOW - timedelta(minutes=5),
        expires_at=NOW + timedelta(days=3650 if kind in QUESTIONS else 0, minutes=25),
        reminders_sent=0, next_reminder_at=None, decided_at=None, decided_by=None,
        decided_via=None, verdict=None, reason=None, channel="C0OPS", message_ts="1.2")
    fields.update(kw)
    return ApprovalRecord(**fields)


def closed(status: str, verdict: str | None, kind: str = TOOL_CALL, **kw: Any) -> ApprovalRecord:
    base: dict[str, Any] = {"status": status, "verdict": verdict, "decided_at": NOW,
                            "decided_by": "U_ALICE", "decided_via": "slack"}
    return request(kind, **{**base, **kw})


# one request (or question) for each outcome a request can have
REQUESTS: dict[OutcomeName, ApprovalRecord] = {
    N.PENDING: request(),
    N.APPROVED: closed("approved", "approve"),
    N.APPROVED_WITH_EDITS: closed("approved", "edit", edited_args=json.dumps(
        {"invoice": "INV-2"}), edited_digest="d2", edited_by="U_BOB", edited_at=NOW),
    N.APPROVED_STANDING: closed("approved", "approve", decided_by="standing:s1",
                                decided_via="standing", reason="covered by standing s1"),
    N.DENIED: closed("denied", "deny", reason="no"),
    N.REDIRECTED: closed("redirected", "redirect", reason="pay INV-2 instead"),
    N.EXPIRED: closed("expired", None, decided_by=None, decided_via=None, decided_at=None),
    N.ESCALATED: closed("superseded", None, decided_by=None, decided_via=None,
                        decided_at=None),
    N.CANCELLED: closed("cancelled", "cancelled", decided_via="cli:op"),
    N.RETRIED: closed("approved", "retry", "outcome_unknown"),
    N.MARKED_DONE: closed("approved", "mark_done", "outcome_unknown"),
    N.ABORTED: closed("denied", "abort", "cannot_run", reason="paid by hand"),
    N.REPLANNED: closed("approved", "replan", "cannot_run"),
    N.UNKNOWN: closed("mystery", None),
}
CALLS = [name for name, w in WORDS.items() if CALL in w.kinds]


def test_the_definition_is_whole() -> None:
    """Each outcome has its words, a kind it applies to, and one emoji name; each request
    outcome and each policy answer is walked below; names are tokens."""
    assert set(REQUESTS) | set(CALLS) == set(OutcomeName)
    for name, w in WORDS.items():
        assert w.name is name and re.fullmatch(r"[a-z_]+", name.value)
        assert w.words and w.label and w.icon and re.fullmatch(r"[a-z_]+", w.emoji)
        assert w.kinds and w.kinds <= KINDS and w.meaning
    # the words tell outcomes apart: no two say the same
    assert len({w.words for w in WORDS.values()}) == len(WORDS)
    assert len({w.label for w in WORDS.values()}) == len(WORDS)
    for name, a in REQUESTS.items():
        assert outcome_of(a) is name
        assert a.kind in WORDS[name].kinds or name is N.UNKNOWN
    for name in CALLS:
        assert policy_outcome(name.value) is name
    with pytest.raises(ValueError, match="approve_before"):
        policy_outcome("approve_before")


@pytest.mark.parametrize("name", list(REQUESTS), ids=str)
def test_every_view_names_a_request_outcome_alike(name: OutcomeName) -> None:
    a, w = REQUESTS[name], WORDS[name]
    # the JSON documents (approvals list/show --json, runs show --json) and the CLI line
    doc = documents.approval_document(a)
    assert doc["outcome"] == name.value and doc["expires_at"] == (
        None if a.kind in QUESTIONS else a.expires_at.isoformat())
    assert f"  {name.value} " in list_line(a)
    assert deadline(a) is None or a.kind not in QUESTIONS
    # the trace (text and JSON)
    entry = trace._approval(a, [], NOW, RunMasking())
    assert entry.outcome == name.value and f": {w.words}" in entry.title
    # Slack: the card (its heading, its notification text, its emoji), App Home's recent
    # line, the run thread's line; the web queue's and the outcome mail's line
    card = cards.approval_card(a, token=None, now=NOW)
    body = json.dumps(card)
    if name is not N.PENDING:
        template = T.HEADER_CANNOT_RUN_DONE if a.kind == "cannot_run" else T.HEADER_DONE
        assert card["blocks"][0]["text"]["text"] == template.format(label=w.label, tool="pay")
        assert card["text"] == T.FALLBACK_DONE.format(tool="pay", status=w.words)
        assert f"*{w.label}*" in body or name is N.UNKNOWN
        assert cards.recent_line(a).startswith(f":{w.emoji}: `pay` {w.words}")
        # the run thread tells a decision from its audit entry (issue 52, bot/slack/story:
        # people as mentions); its words are the thread's own sentence about the request
        line = _thread_line(a)
        assert line == "" or "`pay`" in line, line
        assert pages.outcome_line(a).startswith(f"pay (request {a.id}) was {w.words}")
    assert f":{w.emoji}:" in body
    # the HTTP API's document (and so MCP's and the hooks' answers), for a call request
    if a.kind == TOOL_CALL and name is not N.UNKNOWN:
        api = external.document(external_request("approve_before"), run(), a, None)
        assert api["outcome"] == name.value
        if not w.kinds & {CALL} and name in (N.DENIED, N.REDIRECTED, N.EXPIRED, N.CANCELLED):
            assert w.words in callers.refusal(api).message


def external_request(kind: str) -> ExternalRecord:
    return ExternalRecord(id="r" * 32, token_id="t1", idempotency_key=None, fingerprint="f",
                          tool="pay", args=json.dumps({"invoice": "INV-1"}), digest="d1",
                          policy_name="pay", kind=kind, reason=None, webhook_url=None,
                          decided_approval=None, result_digest=None, reported_at=None,
                          created_at=NOW)


def run(**kw: Any) -> RunRecord:
    fields: dict[str, Any] = dict(
        id="r" * 32, agent="external:ci", status="external", step=0, next_seq=0,
        task="Pay INV-1", requested_by="U_DANA", instructions_version="v1", result=None,
        error=None, inflight=None, cancel_requested=False, cancel_requested_by=None,
        cancel_reason=None, lease_owner=None, lease_expires_at=None, wait_until=None,
        wait_reason=None, failures=0, created_at=NOW, updated_at=NOW)
    fields.update(kw)
    return RunRecord(**fields)


@pytest.mark.parametrize("name", CALLS, ids=str)
def test_a_call_the_policy_answered_is_named_by_its_policy(name: OutcomeName) -> None:
    w = WORDS[name]
    doc = external.document(external_request(name.value), run(), None, None)
    assert doc["outcome"] == name.value
    if name is N.FORBIDDEN:
        assert w.words in callers.refusal(doc).message


def test_a_cancelled_run_names_its_approved_request_cancelled() -> None:
    doc = external.document(external_request("approve_before"),
                            run(status="cancelled"), REQUESTS[N.APPROVED], None)
    assert doc["status"] == doc["outcome"] == N.CANCELLED.value


def test_no_view_keeps_words_of_its_own() -> None:
    """The tables of words the views had (Slack's STATUS_WORDS, VERDICT_WORDS, EDITED_WORD,
    STATUS_EMOJI; the web's STATUS_WORDS, ANSWER_WORDS) are gone: the vocabulary is the
    one place."""
    for module, names in ((T, ("STATUS_WORDS", "VERDICT_WORDS", "EDITED_WORD",
                                "STATUS_EMOJI", "CLOSED_WORD")),
                          (pages, ("STATUS_WORDS", "ANSWER_WORDS"))):
        assert not [n for n in names if hasattr(module, n)], module.__name__


def test_an_approved_call_that_could_not_run_stays_approved() -> None:
    """The request was approved; the question about it names what came of that (its
    card says it was not executed)."""
    approved = replace(REQUESTS[N.APPROVED], packet=json.dumps(
        {"agent": "payer", "not_executed": "no such tool", "cannot_run_question": "q1"}))
    assert outcome_of(approved) is N.APPROVED
    assert "Not executed" in json.dumps(cards.approval_card(approved, token=None, now=NOW))


@pytest.mark.parametrize("name", [N.RETRIED, N.MARKED_DONE, N.ABORTED, N.REPLANNED],
                         ids=str)
def test_a_late_answer_to_an_answered_question_is_told_its_answer(name: OutcomeName) -> None:
    """A click (or command) on a question someone answered names their answer, not the
    status it is stored with ("already approved" for a re-plan)."""
    a, w = REQUESTS[name], WORDS[name]
    message = decide.not_pending_message(a)
    assert message == f"approval {a.id} is already {w.words} by U_ALICE at {NOW.isoformat()}"
    exc = decide._refuse(a, Refusal.NOT_PENDING, message)  # as the decider raises it
    for mentions in (True, False):
        text = messages.refusal_of(exc, mentions=mentions)
        assert w.words in text and a.status not in text, text


def _thread_line(a: ApprovalRecord) -> str:
    """What the run's thread says of ``a``'s deciding audit entry."""
    from approvald.bot.slack import story
    from approvald.store.records import AuditRecord

    action = {"superseded": "escalated"}.get(a.status, a.status)
    entry = AuditRecord(seq=1, at=NOW, action=action, actor=a.decided_by or "system:expiry",
                        via=a.decided_via or "scheduler", run_id=a.run_id, approval_id=a.id,
                        digest=None, details=json.dumps({"tool": a.tool}), key_id="",
                        prev_hash="", hash="")
    return "\n".join(ln.text for ln in story.entry_lines(entry, {a.id: a}, {}, {},
                                                           RunMasking()))
