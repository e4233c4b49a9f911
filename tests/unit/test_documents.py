"""The read models the faces other than Slack's draw from (issue 47: ``engine.documents``):
what the store holds, read together, and frozen: a face cannot change what it was shown."""

from __future__ import annotations

import dataclasses
import json
from datetime import timedelta

import pytest
from approvald.runtime.kernel.outcomes import Paused
from approvald.runtime.record.outbox_kinds import REQUEST_MAIL, RequestMail, mail_group, queue

from tests.helpers import Rows
from tests.unit.test_decisions import ALICE, DANA, TASK, engine_with


async def test_a_request_its_mail_thread_and_the_run_file(make_engine, db, ledger_path):
    engine = engine_with(make_engine, ledger_path)
    paused = await engine.run("demo-refund", TASK, requested_by=DANA)
    assert isinstance(paused, Paused)
    aid = paused.approval_ids[0]

    a = await engine.documents.request(aid)
    assert a is not None and a.id == aid and a.status == "pending"
    assert await engine.documents.request("nope") is None
    assert [c.id for c in await engine.documents.review_candidates(limit=10)] == [aid]

    thread = await engine.documents.request_thread(aid)  # never mailed: no thread
    assert thread.approval == a and dict(thread.sent) == {}
    sent = {"to": ["alice@example.com"], "message_id": "<m@x>", "subject": "Approval"}
    # the request mail, delivered (as the drain marks it): what a thread mail replies to
    now = engine.now()

    async def delivered(tx):  # type: ignore[no-untyped-def]
        await queue(tx, RequestMail(approval_id=aid), group_key=mail_group(aid), now=now)
        [row] = await tx.outbox.in_group(mail_group(aid), kind=REQUEST_MAIL)
        assert await tx.outbox.claim_many([row.id], owner="test", now=now,
                                          until=now + timedelta(minutes=1)) == {row.id}
        await tx.outbox.delivered_many([(row.id, json.dumps(sent))], owner="test", now=now)

    await Rows(db).in_one_write(delivered)
    thread = await engine.documents.request_thread(aid)
    assert dict(thread.sent) == sent
    with pytest.raises(TypeError):
        thread.sent["to"] = []  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        thread.approval = None  # type: ignore[misc]

    file = await engine.documents.run_file(paused.run_id)
    assert file.run is not None and file.run.status == "awaiting_approval"
    assert [x.id for x in file.approvals] == [aid]
    assert (await engine.documents.run_file("nope")).run is None

    figures = await engine.documents.figures()
    assert figures.pending_approvals == 1 and figures.runs["awaiting_approval"] == 1
    with pytest.raises(TypeError):
        figures.runs["done"] = 1  # type: ignore[index]

    decided = await engine.decide(aid, actor=ALICE, verdict="approve")
    assert decided.final
    assert await engine.documents.review_candidates(limit=10) == ()
