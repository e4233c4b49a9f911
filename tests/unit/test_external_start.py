"""External requests: the optional start (the intent row before the caller runs the call),
which the MCP gateway records so a caller dying mid-call leaves "outcome unknown"."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from approvald.runtime.approvals.decide import Actor
from approvald.runtime.engine import Engine
from approvald.runtime.kernel.canonical import call_digest
from approvald.runtime.kernel.clock import ManualClock
from approvald.runtime.policies.intake import Source
from approvald.runtime.policies.policy import PolicyFile
from approvald.runtime.runs.external import CALL_ID, ExternalError, NewRequest, Report, current

from tests.helpers import Rows

POLICY = PolicyFile.model_validate({"tools": {
    "mcp:test/deploy": {"approvers": ["U_ALICE"], "ttl": "30m"}}})


async def opened(make_engine: Callable[..., Engine]) -> tuple[Engine, Any, dict[str, Any]]:
    engine = make_engine(policy=POLICY)
    # the credential an MCP gateway named "test" makes its requests under
    token = await engine.caller_credential(Source("mcp", "test"))
    doc, _ = await engine.open_request(token, NewRequest(
        tool="deploy", args={"service": "api"}, requested_by="U_DANA"))
    return engine, token, doc


async def approve(engine: Engine, request_id: str) -> None:
    a = current(await Rows.of(engine).approvals(request_id))
    assert a is not None
    await engine.decide(a.id, actor=Actor("U_ALICE", "cli:test"), verdict="approve")


async def test_start_records_the_intent_and_the_report_completes_it(
        make_engine, clock: ManualClock) -> None:
    engine, token, doc = await opened(make_engine)
    digest = doc["effective_digest"]
    with pytest.raises(ExternalError) as refused:  # not approved yet
        await engine.start_request(token, doc["id"], args_digest=digest, owner="w1")
    assert refused.value.code == "not_approved"
    await approve(engine, doc["id"])
    with pytest.raises(ExternalError) as refused:  # only the approved arguments run
        await engine.start_request(token, doc["id"], args_digest=call_digest("deploy", {}),
                                    owner="w1")
    assert refused.value.code == "digest_mismatch"

    await engine.start_request(token, doc["id"], args_digest=digest, owner="w1")
    intent = await Rows.of(engine).execution(doc["id"], CALL_ID)
    assert intent is not None and (intent.status, intent.owner) == ("started", "w1")
    with pytest.raises(ExternalError) as refused:  # a second attempt is never started
        await engine.start_request(token, doc["id"], args_digest=digest, owner="w2")
    assert refused.value.code == "already_started"
    assert refused.value.fields["owner"] == "w1"

    clock.advance(timedelta(seconds=2))
    reported, new = await engine.report_request(
        token, doc["id"], Report("succeeded", digest, {"ok": True}))
    assert new and reported["result"]["status"] == "succeeded"
    done = await Rows.of(engine).execution(doc["id"], CALL_ID)
    entries = await Rows.of(engine).audit(run_id=doc["id"])
    assert done is not None and done.status == "succeeded" and done.latency_ms == 2000
    assert done.started_at == intent.started_at  # the one row, completed
    assert [(e.action, e.via) for e in entries][-1] == ("executed", "mcp")
    with pytest.raises(ExternalError) as refused:
        await engine.start_request(token, doc["id"], args_digest=digest, owner="w1")
    assert refused.value.code == "already_reported"


async def test_a_cancelled_request_is_not_started(make_engine) -> None:
    engine, token, doc = await opened(make_engine)
    await approve(engine, doc["id"])
    await engine.cancel(doc["id"], actor=Actor("cli:ops", "cli:ops"), reason="not today")
    with pytest.raises(ExternalError) as refused:
        await engine.start_request(token, doc["id"], args_digest=doc["effective_digest"],
                                    owner="w1")
    assert refused.value.code == "cancelled" and "cancelled" in str(refused.value)
