"""What ``serve`` keeps of each auto call it started with its request, for the call's
report (``runtime.runs.external``, up to ``KEPT`` = 10,000 of them: a hook's calls whose
PostToolUse has not come), leaves the cyclic garbage collector nothing to walk (issue 50).
Kept as a dataclass instance, each was one more object in the oldest generation that
every full collection walked again for as long as it was kept: at 1,000 auto decisions a
second, thousands of them, in each full collection's stall of the one event loop."""

from __future__ import annotations

import gc
from collections.abc import Callable

from approvald.runtime.engine import Engine
from approvald.runtime.policies.policy import PolicyFile
from approvald.runtime.requests import api_tokens
from approvald.runtime.runs.external import NewRequest, Report

from tests.helpers import Rows, create_token, parts

POLICY = PolicyFile.model_validate({"tools": {"api:*/read_metrics": {"policy": "auto"}}})
KEYS = api_tokens.WebhookKeys("approvald-test-secret-0123456789")


async def test_a_kept_call_is_no_object_the_collector_walks_and_its_report_reads_nothing(
        make_engine: Callable[..., Engine]) -> None:
    engine = make_engine(policy=POLICY)
    token = (await create_token(engine, KEYS, "bot", created_by="test", via="test",
                                tools="*")).record
    kept = parts(engine).external._kept
    docs = [(await engine.open_request(token, NewRequest(
        tool="read_metrics", args={"i": i, "note": ["a", {"b": i}]}, requested_by="U_DANA",
        start_owner="gw")))[0] for i in range(20)]
    assert len(kept) == 20
    gc.collect()  # the collector's first look at each
    assert [v for v in kept.values() if gc.is_tracked(v)] == []
    # and none holds anything it walks: nothing of it is in any generation
    walked = {id(o) for o in gc.get_objects()}
    assert [x for v in kept.values() for x in (v, *v) if id(x) in walked] == []
    # the report still reads nothing it kept: one started by this process, reported whole
    doc = docs[7]
    assert await engine.record_request_report(token, doc["id"], Report(
        "succeeded", doc["effective_digest"], {"ok": 7}, None))
    assert doc["id"] not in kept and len(kept) == 19
    run = await Rows.of(engine).run(doc["id"])
    assert run.status == "completed"
    actions = [e.action for e in await Rows.of(engine).audit() if e.run_id == doc["id"]]
    assert actions == ["requested", "approved", "executed"]
