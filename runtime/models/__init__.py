"""Model adapters."""

from runtime.models.base import Model, ModelReply, ToolSpec, Transcript
from runtime.models.openai import OpenAIChatModel
from runtime.models.scripted import ScriptedModel, reply

__all__ = [
    "Model", "ModelReply", "OpenAIChatModel", "ScriptedModel", "ToolSpec", "Transcript", "reply",
]
