"""Whose a stdio server's sampling request or log message is (bot/mcp/inflight.py): the one
client whose requests are in flight on its session, else nobody's, said at once."""

from __future__ import annotations

from typing import Any

import mcp_types as types
from approvald.bot.mcp.inflight import InFlight

SAMPLE = types.CreateMessageRequestParams(
    messages=[types.SamplingMessage(role="user",
                                    content=types.TextContent(type="text", text="hi"))],
    max_tokens=5)


class FakeRelay:
    """A client request's relay: its session (its client connection) and what it declared."""

    def __init__(self, session: object, sampling: bool = True) -> None:
        self.ctx = type("Ctx", (), {"session": session})()
        self.capabilities = types.ClientCapabilities(
            sampling=types.SamplingCapability() if sampling else None)
        self.asked: list[str] = []
        self.logged: list[Any] = []

    async def sample(self, context: Any, params: types.CreateMessageRequestParams) -> str:
        self.asked.append("sample")
        return "answered"

    async def log_message(self, params: types.LoggingMessageNotificationParams) -> None:
        self.logged.append(params.data)


async def test_a_request_goes_to_the_one_client_in_flight_and_else_is_refused_at_once(
        ) -> None:
    inflight = InFlight()
    nobody = await inflight.sample(None, SAMPLE)  # type: ignore[arg-type]
    assert isinstance(nobody, types.ErrorData) and "no client request is in flight" in \
        nobody.message

    dana_session, erin_session = object(), object()
    dana, dana_again, erin = FakeRelay(dana_session), FakeRelay(dana_session), \
        FakeRelay(erin_session)
    with inflight.forwarding(dana), inflight.forwarding(dana_again):  # type: ignore[arg-type]
        # two requests of one client: its newest is asked
        assert await inflight.sample(None, SAMPLE) == "answered"  # type: ignore[arg-type]
        assert dana_again.asked == ["sample"] and dana.asked == []
        with inflight.forwarding(erin):  # type: ignore[arg-type]
            both = await inflight.sample(None, SAMPLE)  # type: ignore[arg-type]
            await inflight.log_message(types.LoggingMessageNotificationParams(
                level="info", data="whose?"))
        assert isinstance(both, types.ErrorData) and "requests of 2 clients" in both.message
        assert erin.asked == [] and erin.logged == [] and dana_again.logged == []
        await inflight.log_message(types.LoggingMessageNotificationParams(
            level="info", data="dana's"))
        assert dana_again.logged == ["dana's"]
    mute = FakeRelay(object(), sampling=False)
    with inflight.forwarding(mute):  # type: ignore[arg-type]
        refused = await inflight.sample(None, SAMPLE)  # type: ignore[arg-type]
    assert isinstance(refused, types.ErrorData) and "did not declare the sampling" in \
        refused.message and mute.asked == []
    assert inflight.owner("x").__class__ is types.ErrorData  # nothing left in flight
