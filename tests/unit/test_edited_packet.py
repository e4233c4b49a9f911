"""An edit's impact is worked out where the tool is known, when the edit is recorded, and
kept with the request; a request's words (the agent's, or an external caller's) stay what
they were and are shown only as words about the original arguments. On both dialects.

The cards and Home entries are built from the stored rows, so what these check is what
an approver would see after each path: an edit, an escalation of an edited request, and
an external request (whose impact is the caller's text: nothing can work it out again).
"""

from __future__ import annotations

import json
import re
from datetime import timedelta
from typing import Any

from approvald.bot import documents
from approvald.bot.slack import cards, messages
from approvald.bot.slack import texts as T
from approvald.runtime.approvals.decide import Actor
from approvald.runtime.kernel.clock import ManualClock
from approvald.runtime.policies.policy import ApprovalPolicy, PolicyFile
from approvald.runtime.requests import api_tokens
from approvald.runtime.runs.demo import REFUND_POLICY, DemoLedger, refund_agent
from approvald.runtime.runs.external import NewRequest
from slack_sdk.models.blocks import Block

from tests.conftest import SIGNER
from tests.helpers import Rows, create_token

ALICE = Actor("U_ALICE", "slack")
TASK = "Refund order A-1001, customer was double charged"
EDIT = {"order_id": "A-1001", "amount_cents": 2000, "reason": "partial refund"}
IMPACT_42 = "$42.00 goes back to the customer's card for order A-1001."
IMPACT_20 = "$20.00 goes back to the customer's card for order A-1001."
LABELS = [*T.DOING_BEFORE_EDIT.values(), *T.IMPACT_BEFORE_EDIT.values()]
LABELLED = re.compile("(?:" + "|".join(re.escape(x) for x in LABELS) + r")[*_]*\s*[^\n]*")


def texts_of(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [t for k, v in value.items()
                for t in ([v] if k == "text" and isinstance(v, str) else texts_of(v))]
    if isinstance(value, list):
        return [t for v in value for t in texts_of(v)]
    return []


def unlabelled(value: Any, needle: str = "$42.00") -> list[str]:
    """Texts that present ``needle`` other than inside a passage labelled as words about
    the original arguments."""
    return [t for t in texts_of(value) if needle in LABELLED.sub("", t)]


def drawn(a: Any, clock: ManualClock) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The card and the App Home entry of ``a``, both validated with slack_sdk."""
    token = SIGNER.token(a.id, a.token_nonce, a.effective_digest)
    card = cards.approval_card(a, token=token, now=clock.now())
    entry = cards.compact_blocks(a, token, now=clock.now(), selectable=True)
    for b in [*card["blocks"], *entry]:
        assert Block.parse(b).to_dict() == b
    return card, entry


def refund_engine(make_engine, ledger_path, **policy: Any):
    base = {**REFUND_POLICY.model_dump(), **policy}
    agent = refund_agent(DemoLedger(str(ledger_path)),
                         approval=ApprovalPolicy.model_validate(base))
    return make_engine(agents=[agent])


async def requests(engine, run_id: str) -> list[Any]:
    return list(await Rows.of(engine).approvals(run_id))


async def test_a_proposed_edit_is_drawn_with_the_impact_of_the_edited_arguments(
        make_engine, ledger_path, clock: ManualClock) -> None:
    engine = refund_engine(make_engine, ledger_path, edits="propose")
    paused = await engine.run("demo-refund", TASK, requested_by="U_DANA")
    [aid] = paused.approval_ids
    decision = await engine.decide(aid, actor=ALICE, verdict="edit", args=EDIT)
    assert decision.outcome == "edited"
    [a] = await requests(engine, paused.run_id)
    # the request's words are kept as they were asked
    assert json.loads(a.packet)["impact"] == IMPACT_42
    card, entry = drawn(a, clock)
    assert unlabelled(card) == [] and unlabelled(entry) == []
    assert T.SECTION_IMPACT_EDITED.format(text=IMPACT_20) in texts_of(card)
    assert any(IMPACT_20 in t for t in texts_of(entry))
    assert any(T.DOING_BEFORE_EDIT["agent"] in t for t in texts_of(card))
    assert any(T.DOING_BEFORE_EDIT["agent"] in t for t in texts_of(entry))
    reminder = messages.reminder_text(a, now=clock.now())
    assert unlabelled(reminder) == [] and T.LINE_IMPACT_EDITED.format(text=IMPACT_20) in reminder
    shown = documents.approval_document(a)  # `approvald approvals show`
    assert (shown["effective_args"], shown["impact"], shown["words_about_original"],
            shown["original_impact"]) == (EDIT, IMPACT_20, True, None)


async def test_an_edited_request_escalated_to_the_next_rung_keeps_the_edits_impact(
        make_engine, ledger_path, clock: ManualClock) -> None:
    engine = refund_engine(make_engine, ledger_path, edits="propose", ttl="10m",
                           reminders=[], on_expire="escalate",
                           escalate=[{"approvers": ["U_CFO"], "ttl": "1h"}])
    paused = await engine.run("demo-refund", TASK, requested_by="U_DANA")
    [aid] = paused.approval_ids
    await engine.decide(aid, actor=ALICE, verdict="edit", args=EDIT)
    clock.advance(timedelta(minutes=11))
    await engine.sweep()
    old, new = await requests(engine, paused.run_id)
    assert (old.status, new.status, new.rung) == ("superseded", "pending", 1)
    # the next rung is asked about the arguments as they stand: the edit
    assert new.args_value() == EDIT and new.edited_args is None
    card, entry = drawn(new, clock)
    assert unlabelled(card) == [] and unlabelled(entry) == []
    assert T.SECTION_IMPACT_EDITED.format(text=IMPACT_20) in texts_of(card)
    assert any(T.DOING_BEFORE_EDIT["agent"] in t for t in texts_of(card))


POLICY = PolicyFile.model_validate({"tools": {
    "api:bot/refund_card": {"approvers": ["U_ALICE", "U_BOB"], "ttl": "30m",
                            "edits": "propose"}}})


async def test_an_edited_external_request_labels_the_callers_words(
        make_engine, clock: ManualClock) -> None:
    engine = make_engine(policy=POLICY)
    made = await create_token(engine, api_tokens.WebhookKeys("approvald-test-secret-0123456789"),
                              "bot", created_by="test", via="test", tools="*")
    doc, _ = await engine.open_request(made.record, NewRequest(
        tool="refund_card", args={"order": "A-1001", "cents": 4200}, requested_by="U_DANA",
        packet={"doing": "Refunding the duplicate charge, $42.00.",
                                      "impact": "$42.00 back to the customer's card"}))
    unedited, _ = drawn((await requests(engine, doc["id"]))[0], clock)
    assert T.SECTION_IMPACT.format(text="$42.00 back to the customer's card") \
        in texts_of(unedited)  # not edited: the caller's words are about what will run
    await engine.decide(doc["approval_id"], actor=Actor("U_BOB", "slack"), verdict="edit",
                        args={"order": "A-1001", "cents": 2000})
    [a] = await requests(engine, doc["id"])
    assert a.status == "pending" and a.effective_args()["cents"] == 2000
    card, entry = drawn(a, clock)
    assert unlabelled(card) == [] and unlabelled(entry) == []
    said = texts_of(card)
    assert T.SECTION_IMPACT_BEFORE_EDIT.format(
        label=T.IMPACT_BEFORE_EDIT["caller"], text="$42.00 back to the customer's card") in said
    assert T.SECTION_DOING_BEFORE_EDIT.format(
        label=T.DOING_BEFORE_EDIT["caller"], text="Refunding the duplicate charge, $42.00.") \
        in said
    assert not any(t.startswith("*Expected impact") for t in said)
    shown = documents.approval_document(a)
    assert (shown["impact"], shown["words_about_original"], shown["original_impact"]) == (
        None, True, "$42.00 back to the customer's card")
