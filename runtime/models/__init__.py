"""Model adapters."""

from runtime.models.base import Model, ModelReply, ToolSpec, Transcript
from runtime.models.scripted import ScriptedModel, reply

__all__ = ["Model", "ModelReply", "ScriptedModel", "ToolSpec", "Transcript", "reply"]
