"""``approvals list --status WORD`` filters by the outcome every view names (issue 48):
the vocabulary's query of the stored columns (:func:`runtime.kernel.vocabulary.match_of`) finds
exactly the requests :func:`runtime.kernel.vocabulary.outcome_of` names with that word, on both
dialects: one request of each outcome, each found by its own word only."""

from __future__ import annotations

from dataclasses import asdict, replace

from approvald.runtime.kernel.vocabulary import REQUEST_OUTCOMES, match_of, outcome_of
from approvald.store.db import Database
from approvald.store.models import Approval, Run

from tests.helpers import Rows
from tests.unit.test_outcome_vocabulary import NOW, REQUESTS


async def test_each_outcome_word_finds_its_requests_only(db: Database) -> None:
    rows = Rows(db)
    await rows.insert(Run.__table__, [{
        "id": "r" * 32, "agent": "payer", "status": "running", "step": 0, "next_seq": 0,
        "task": "Pay INV-1", "requested_by": "U_DANA", "instructions_version": "1",
        "created_at": NOW, "updated_at": NOW}])
    await rows.insert(Approval.__table__, [
        asdict(replace(a, id=f"{n:032d}", call_id=f"call{n}", token_nonce=f"n{n}"))
        for n, a in enumerate(REQUESTS.values())])
    by_id = {f"{n:032d}": name for n, name in enumerate(REQUESTS)}
    assert set(REQUEST_OUTCOMES) == set(REQUESTS)
    for name in REQUEST_OUTCOMES:
        found, counted = await rows.approvals_matching(match_of(name))
        assert [by_id[a.id] for a in found] == [name], name
        assert [outcome_of(a) for a in found] == [name] and counted == 1
