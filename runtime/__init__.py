"""approvald's runtime: every gated call's life, in layers (docs/explanation/architecture.md).

Import what you use from here, not from the layer that holds it::

    from approvald.runtime import Agent, ScriptedModel, reply, tool

The names are read lazily (PEP 562): importing ``approvald.runtime`` loads nothing until a name
is asked for, so a module of a low layer importing its neighbour does not load the engine.
The layers, bottom to top, are ``kernel``, ``policies``, ``record``, ``requests``,
``approvals`` and ``runs``; the engine and the read models the faces see sit here, on top.
``tests/unit/test_layers.py`` keeps every import pointing down.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# public name -> the module that defines it
_EXPORTS: dict[str, str] = {
    # the front door
    "Engine": "engine", "EngineConfig": "engine", "CallResult": "engine", "assemble": "engine",
    # read models the faces show
    "Views": "views", "CardView": "views", "HomeView": "views", "TurnView": "views",
    "NoticeView": "views", "DeadView": "views", "StandingItem": "views",
    "Documents": "documents", "RequestThread": "documents", "Figures": "documents",
    "RunFile": "documents", "RunThreads": "threads",
    "InsightsBoard": "insights_board", "OperatorInsights": "insights_board",
    # errors (one root: ApprovaldError)
    "ApprovaldError": "kernel.errors", "AuditChainBroken": "kernel.errors",
    "ConfigError": "kernel.errors", "DecisionRefused": "kernel.errors",
    "DigestMismatch": "kernel.errors", "InvalidArguments": "kernel.errors",
    "LeaseLost": "kernel.errors", "ModelError": "kernel.errors",
    "ModelUnavailable": "kernel.errors", "NotFound": "kernel.errors",
    "PayloadTooLarge": "kernel.errors", "Refusal": "kernel.errors",
    "SchemaOutOfDate": "kernel.errors", "StateVersionError": "kernel.errors",
    # what an agent module is written with
    "Agent": "runs.agent", "Registry": "runs.agent",
    "tool": "policies.tools", "ToolContext": "policies.tools", "Reconciled": "policies.tools",
    "ApprovalPolicy": "policies.policy", "Rung": "policies.policy",
    "Masking": "policies.masking", "mask_args": "policies.sensitive",
    "ScriptedModel": "models.scripted", "reply": "models.scripted",
    "assistant_turns": "models.scripted", "OpenAIChatModel": "models.openai",
    # adapters of other agent frameworks (each needs its framework installed)
    "LangGraphAdapter": "adapters.langgraph", "OpenAIAgentsAdapter": "adapters.openai_agents",
    "PydanticAIAdapter": "adapters.pydantic_ai",
    # what the process around the runtime plugs in or checks
    "Meter": "kernel.metrics", "Clock": "kernel.clock", "signature": "requests.api_tokens",
}

__all__ = [
    "Agent", "ApprovalPolicy", "ApprovaldError", "AuditChainBroken", "CallResult",
    "CardView", "Clock", "ConfigError", "DeadView", "DecisionRefused", "DigestMismatch",
    "Documents", "Engine", "EngineConfig", "Figures", "HomeView", "InsightsBoard",
    "InvalidArguments", "LangGraphAdapter", "LeaseLost", "Masking", "Meter", "ModelError",
    "ModelUnavailable", "NotFound", "NoticeView", "OpenAIAgentsAdapter", "OpenAIChatModel",
    "OperatorInsights", "PayloadTooLarge", "PydanticAIAdapter", "Reconciled", "Refusal",
    "Registry", "RequestThread", "RunFile", "RunThreads", "Rung", "SchemaOutOfDate",
    "ScriptedModel", "StandingItem", "StateVersionError", "ToolContext", "TurnView",
    "Views", "assemble", "assistant_turns", "mask_args", "reply", "signature", "tool",
]  # = sorted(_EXPORTS) (tests/unit/test_layers.py)

if TYPE_CHECKING:
    from approvald.runtime.adapters.langgraph import LangGraphAdapter
    from approvald.runtime.adapters.openai_agents import OpenAIAgentsAdapter
    from approvald.runtime.adapters.pydantic_ai import PydanticAIAdapter
    from approvald.runtime.documents import Documents, Figures, RequestThread, RunFile
    from approvald.runtime.engine import CallResult, Engine, EngineConfig, assemble
    from approvald.runtime.insights_board import InsightsBoard, OperatorInsights
    from approvald.runtime.kernel.clock import Clock
    from approvald.runtime.kernel.errors import (
        ApprovaldError,
        AuditChainBroken,
        ConfigError,
        DecisionRefused,
        DigestMismatch,
        InvalidArguments,
        LeaseLost,
        ModelError,
        ModelUnavailable,
        NotFound,
        PayloadTooLarge,
        Refusal,
        SchemaOutOfDate,
        StateVersionError,
    )
    from approvald.runtime.kernel.metrics import Meter
    from approvald.runtime.models.openai import OpenAIChatModel
    from approvald.runtime.models.scripted import ScriptedModel, assistant_turns, reply
    from approvald.runtime.policies.masking import Masking
    from approvald.runtime.policies.policy import ApprovalPolicy, Rung
    from approvald.runtime.policies.sensitive import mask_args
    from approvald.runtime.policies.tools import Reconciled, ToolContext, tool
    from approvald.runtime.requests.api_tokens import signature
    from approvald.runtime.runs.agent import Agent, Registry
    from approvald.runtime.threads import RunThreads
    from approvald.runtime.views import (
        CardView,
        DeadView,
        HomeView,
        NoticeView,
        StandingItem,
        TurnView,
        Views,
    )


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # the next look-up is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
