"""Model adapters. ``OpenAIChatModel`` is imported on first use (it pulls in aiohttp)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from approvald.runtime.models.base import Model, ModelReply, ToolSpec, Transcript, Usage
from approvald.runtime.models.scripted import ScriptedModel, reply

if TYPE_CHECKING:
    from approvald.runtime.models.openai import OpenAIChatModel

__all__ = [
    "Model", "ModelReply", "OpenAIChatModel", "ScriptedModel", "ToolSpec", "Transcript", "Usage",
    "reply",
]


def __getattr__(name: str) -> Any:
    if name == "OpenAIChatModel":
        from approvald.runtime.models.openai import OpenAIChatModel

        return OpenAIChatModel
    raise AttributeError(name)
