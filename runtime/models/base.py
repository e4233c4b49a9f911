"""The model protocol: given instructions, a transcript and tool specs, return one reply."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from approvald.runtime.record.state import AssistantMessage, ToolCall, ToolMessage, UserMessage

Transcript = Sequence[UserMessage | AssistantMessage | ToolMessage]


@dataclass(frozen=True)
class ToolSpec:
    """What the model is told about a tool."""

    name: str
    description: str
    parameters: dict[str, Any]


@dataclass(frozen=True)
class Usage:
    """What one model call cost, as far as the model reports it (None: not reported)."""

    input_tokens: int | None = None
    output_tokens: int | None = None
    cost_usd: float | None = None


@dataclass(frozen=True)
class ModelReply:
    """One model turn: optional text and zero or more tool calls. No calls = final answer.

    ``usage``: token counts (and cost) when the model reports them; recorded in traces.
    """

    content: str | None
    tool_calls: tuple[ToolCall, ...] = ()
    usage: Usage | None = None


class Model(Protocol):
    """Anything that can produce the next assistant turn."""

    async def complete(
        self, *, instructions: str, messages: Transcript, tools: Sequence[ToolSpec]
    ) -> ModelReply: ...
