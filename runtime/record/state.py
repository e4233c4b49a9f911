"""Run state as versioned pydantic models.

A run's transcript is stored as append-only events, one per message; each event carries
the schema version it was written with. :func:`upgrade_part` brings an older part up to
:data:`SCHEMA_VERSION`; a newer or unknown version is refused, never guessed at. The whole
state can also be exported and re-loaded as one document (:meth:`RunState.to_document`,
:meth:`RunState.from_document`). No pickle anywhere.

Version history:
  1  tool-call arguments stored as a JSON *string* (as chat-completions APIs return them)
     and tool results as plain text.
  2  arguments stored as a JSON object; tool results are JSON values (dicts for
     structured outcomes such as ``{"status": "denied", ...}``).
  3  an assistant message may carry ``meta`` (:class:`ModelStep`: when the reply arrived,
     latency, model, instructions version, token counts and cost). Older messages have
     none; an older approvald refuses version 3 clearly instead of failing on the field.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime
from typing import Annotated, Any, Literal

from approvald.runtime.kernel.errors import StateVersionError
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

SCHEMA_VERSION = 3

# external: an HTTP API request's run, which its caller (not a worker) carries out
RunStatus = Literal[
    "running", "awaiting_approval", "completed", "failed", "cancelled", "needs_attention",
    "external",
]
RUN_STATUSES: tuple[str, ...] = (
    "running", "awaiting_approval", "completed", "failed", "cancelled", "needs_attention",
    "external",
)
FINAL_STATUSES = frozenset({"completed", "failed", "cancelled"})


class _Part(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ToolCall(_Part):
    """One call the model asked for: an id unique within the run, a tool name, arguments."""

    id: str
    name: str
    arguments: dict[str, Any]


class UserMessage(_Part):
    role: Literal["user"] = "user"
    content: str


class ModelStep(_Part):
    """How a fresh model reply came about, for traces: recorded when it arrived."""

    at: datetime  # the clock's time when the reply arrived
    latency_ms: float
    model: str
    # only where it differs from the run's own (its row keeps the version it started with):
    # a step stays small, and a redeploy's new instructions show where they took over
    instructions_version: str | None = None
    input_tokens: int | None = None  # as the model reports them; None when it does not
    output_tokens: int | None = None
    cost_usd: float | None = None  # reported by the API or priced by configuration, never guessed


class AssistantMessage(_Part):
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)
    meta: ModelStep | None = None  # absent on replies written before schema version 3


class ToolMessage(_Part):
    """The observation for one tool call: a JSON value the model reads."""

    role: Literal["tool"] = "tool"
    call_id: str
    name: str
    content: Any


Message = Annotated[UserMessage | AssistantMessage | ToolMessage, Field(discriminator="role")]
_message_adapter: TypeAdapter[UserMessage | AssistantMessage | ToolMessage] = TypeAdapter(Message)


def parse_message(body: dict[str, Any]) -> UserMessage | AssistantMessage | ToolMessage:
    return _message_adapter.validate_python(body)


class RunState(_Part):
    """Everything needed to continue a run, independent of any process."""

    schema_version: int = SCHEMA_VERSION
    run_id: str
    agent: str
    status: RunStatus
    step: int
    task: str
    requested_by: str
    instructions_version: str
    created_at: datetime
    result: str | None = None
    error: str | None = None
    cancel_requested: bool = False
    messages: list[UserMessage | AssistantMessage | ToolMessage] = Field(default_factory=list)

    def unresolved_calls(self) -> list[ToolCall]:
        """Tool calls of the last assistant message that have no tool result yet."""
        for i in range(len(self.messages) - 1, -1, -1):
            msg = self.messages[i]
            if isinstance(msg, AssistantMessage):
                done = {
                    m.call_id for m in self.messages[i + 1:] if isinstance(m, ToolMessage)
                }
                return [c for c in msg.tool_calls if c.id not in done]
        return []

    def call_ids(self) -> set[str]:
        return {
            c.id for m in self.messages if isinstance(m, AssistantMessage) for c in m.tool_calls
        }

    def to_document(self) -> dict[str, Any]:
        """The whole state as one JSON-ready document, tagged with its schema version."""
        return self.model_dump(mode="json")

    @classmethod
    def from_document(cls, doc: dict[str, Any]) -> RunState:
        """Load an exported state document, upgrading an older schema version."""
        version = doc.get("schema_version")
        _check_version(version, what="run state")
        assert isinstance(version, int)
        doc = dict(doc)
        doc["messages"] = [
            upgrade_part(version, dict(m)) for m in doc.get("messages", [])
        ]
        doc["schema_version"] = SCHEMA_VERSION
        return cls.model_validate(doc)


def _check_version(version: object, *, what: str) -> None:
    if not isinstance(version, int) or isinstance(version, bool):
        raise StateVersionError(f"{what} has no valid schema_version (got {version!r})")
    if version > SCHEMA_VERSION:
        raise StateVersionError(
            f"{what} has schema version {version}, newer than this approvald supports "
            f"({SCHEMA_VERSION}); upgrade approvald before loading it",
            version=version,
        )
    if version not in _UPGRADERS and version != SCHEMA_VERSION:
        raise StateVersionError(f"{what} has unknown schema version {version}", version=version)


def _v1_to_v2(body: dict[str, Any]) -> dict[str, Any]:
    role = body.get("role")
    if role == "assistant":
        calls = []
        for call in body.get("tool_calls") or []:
            call = dict(call)
            args = call.get("arguments")
            if isinstance(args, str):
                call["arguments"] = json.loads(args) if args.strip() else {}
            calls.append(call)
        body = {**body, "tool_calls": calls}
    elif role == "tool":
        content = body.get("content")
        if isinstance(content, str):
            try:
                content = json.loads(content)
            except ValueError:
                pass
        body = {**body, "content": content}
    return body


def _v2_to_v3(body: dict[str, Any]) -> dict[str, Any]:
    return body  # version 3 only adds an optional field


# version -> function lifting a message body from that version to the next one
_UPGRADERS: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {1: _v1_to_v2,
                                                                      2: _v2_to_v3}


def upgrade_part(
    version: int, body: dict[str, Any]
) -> UserMessage | AssistantMessage | ToolMessage:
    """Parse a stored message body written at schema ``version``, upgrading it as needed."""
    _check_version(version, what="run event")
    while version < SCHEMA_VERSION:
        body = _UPGRADERS[version](body)
        version += 1
    return parse_message(body)
