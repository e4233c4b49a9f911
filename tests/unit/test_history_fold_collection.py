"""Taking the kept requests (issue 51) makes tens of thousands of small objects a batch;
the cyclic collector, run again and again over them as they pile up, cost a kept read
about half its time. No collection runs while a batch is checked and decoded, the
collector is on again afterwards, and the read gives what it gave."""

from __future__ import annotations

import gc

from approvald.runtime.record.audit import AuditKey

KEY = AuditKey("audit-key-kept-in-a-vault-0123456789")


async def test_no_collection_runs_while_the_kept_requests_are_decoded(make_engine):
    engine = make_engine(audit_key=KEY)
    for i in range(3):
        await engine.run("demo-refund", f"Refund order A-{i}", requested_by="U_DANA")
    first = await engine.history(since=None, keys=[KEY])
    assert not first.problems
    collected: list[int] = []

    def seen(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            collected.append(info["generation"])

    threshold = gc.get_threshold()
    gc.set_threshold(1)  # any allocation of a tracked object would collect
    gc.callbacks.append(seen)
    try:
        from approvald.runtime.record import history_fold

        real = history_fold.load

        def load(*args, **kwargs):  # a collection here would be one in the batch
            before = len(collected)
            out = real(*args, **kwargs)
            [[] for _ in range(10)]  # tracked objects: each would collect
            assert len(collected) == before, "a collection ran while decoding a batch"
            return out

        history_fold.load = load
        try:
            again = await engine.history(since=None, keys=[KEY])
        finally:
            history_fold.load = real
    finally:
        gc.callbacks.remove(seen)
        gc.set_threshold(*threshold)
    assert gc.isenabled()
    assert not again.problems
    assert [(r.seq, r.tool, r.outcome) for r in again.requests] == \
        [(r.seq, r.tool, r.outcome) for r in first.requests]
