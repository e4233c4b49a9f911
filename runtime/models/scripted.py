"""A deterministic model for demos and tests.

The reply is a pure function of the transcript, so a run that crashes and resumes (in
another process, days later) gets exactly the reply it would have got the first time.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from approvald.runtime.kernel.errors import ModelError
from approvald.runtime.models.base import ModelReply, ToolSpec, Transcript
from approvald.runtime.record.state import AssistantMessage, ToolCall

Script = Callable[[Transcript], ModelReply]


def reply(content: str | None = None, *calls: tuple[str, dict[str, Any]],
          turn: int = 0) -> ModelReply:
    """Build a reply; call ids are ``call_<turn>_<i>``, unique within a run."""
    return ModelReply(
        content=content,
        tool_calls=tuple(
            ToolCall(id=f"call_{turn}_{i}", name=name, arguments=args)
            for i, (name, args) in enumerate(calls)
        ),
    )


def assistant_turns(messages: Transcript) -> int:
    return sum(1 for m in messages if isinstance(m, AssistantMessage))


class ScriptedModel:
    """A model whose next reply is computed from the transcript by ``script``.

    ``ScriptedModel.sequence([...])`` replays a fixed list of replies by turn number.
    """

    def __init__(self, script: Script) -> None:
        self._script = script
        self.calls = 0

    @classmethod
    def sequence(cls, replies: Sequence[ModelReply]) -> ScriptedModel:
        items = list(replies)

        def script(messages: Transcript) -> ModelReply:
            turn = assistant_turns(messages)
            if turn >= len(items):
                raise ModelError(f"scripted model has no reply for turn {turn}")
            return items[turn]

        return cls(script)

    async def complete(
        self, *, instructions: str, messages: Transcript, tools: Sequence[ToolSpec]
    ) -> ModelReply:
        self.calls += 1
        return self._script(messages)
