"""The operators' insights read model (issue 51): only operators get them, the record is
read at most once per ``max_age`` of the injected clock, and a chain that does not verify
is said, not read."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from approvald.runtime.insights import Insights
from approvald.runtime.insights_board import InsightsBoard
from approvald.runtime.kernel.clock import ManualClock
from approvald.runtime.record.history import ChainBroken, History

T0 = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)


def _board(clock: ManualClock, reads: list[timedelta], *, broken: bool = False
           ) -> InsightsBoard:
    async def read(window: timedelta) -> History:
        reads.append(window)
        if broken:
            raise ChainBroken(["entry 3 (approved by U_ALICE at …) was edited"])
        return History([], None, (0, "0" * 64), 0)

    def figure(history: History, window: str) -> Insights:
        return Insights(window, len(history.requests), [], [], [], [])

    return InsightsBoard(clock, ["U_BOB"], read, figure)


async def test_only_operators_get_them_and_the_record_is_read_once_per_max_age() -> None:
    clock, reads = ManualClock(T0), []
    board = _board(clock, reads)
    assert await board.for_viewer("U_ALICE") is None and reads == []
    first = await board.for_viewer("U_BOB")
    assert first is not None and first.insights is not None
    assert first.window == "30 days" and reads == [timedelta(days=30)]
    clock.advance(timedelta(minutes=4))
    assert await board.for_viewer("U_BOB") is first and len(reads) == 1
    clock.advance(timedelta(minutes=1))
    again = await board.for_viewer("U_BOB")
    assert again is not first and again is not None and again.at == T0 + timedelta(minutes=5)
    assert len(reads) == 2


async def test_a_broken_chain_is_said_and_nothing_is_read() -> None:
    board = _board(ManualClock(T0), [], broken=True)
    found = await board.for_viewer("U_BOB")
    assert found is not None and found.insights is None
    assert found.broken == ["entry 3 (approved by U_ALICE at …) was edited"]
