"""What a long-lived process keeps per run is released when the run is through with it
(issue 50, "serve memory flat"; issue 9 item 12): bench_soak's 10,000 runs through one
``serve`` must not leave an entry behind for each run that was decided."""

from __future__ import annotations

from approvald.runtime.approvals.decide import Actor

from tests.helpers import parts

ALICE = Actor("U_ALICE", "slack")


async def test_a_denied_run_leaves_no_decided_mark_behind(make_engine) -> None:
    """A denied call never starts, so the run never *reaches* it: the mark a decision
    left for the click-to-tool-start figure must still go when the run is advanced.
    Before the fix each denied run stayed (up to 10,000 of them: 137 bytes each in a
    soak's serve, 250 more every 1,000 runs)."""
    engine = make_engine()
    decided = parts(engine).decided_runs
    for i in range(4):
        paused = await engine.run("demo-refund", f"Refund order A-{1000 + i}",
                                  requested_by="U_DANA")
        verdict = "deny" if i % 2 else "approve"
        decision = await engine.decide(paused.approval_ids[0], actor=ALICE, verdict=verdict,
                                       reason="not today" if verdict == "deny" else None)
        assert decision.run_ready
        assert len(decided) == 1  # marked until the run goes on
        outcome = await engine.advance(decision.approval.run_id)
        assert outcome.status == "completed"
        assert len(decided) == 0, f"run {i} ({verdict}) left its mark behind"
