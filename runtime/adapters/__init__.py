"""Framework adapters: approvald's gate for agents built on LangGraph, Pydantic AI or the
OpenAI Agents SDK, without rewriting them on approvald's loop.

Each framework's module imports the framework, so import it only with its extra
installed: ``runtime.adapters.langgraph`` (the ``langgraph`` extra),
``runtime.adapters.pydantic_ai`` (the ``pydantic-ai`` extra),
``runtime.adapters.openai_agents`` (the ``openai-agents`` extra). What they share (the
requests, running an approved call once, the paused state in approvald's store) is here
and in :mod:`runtime.adapters.gate`; nothing here knows Slack or an SQL dialect.
"""

from approvald.runtime.adapters.base import Adapter, Finished, Outcome, Paused, Waiting
from approvald.runtime.adapters.gate import (
    ApprovalGate,
    Call,
    CallFailedBefore,
    CallNotApproved,
    CallOutcomeUnknown,
    Decision,
    Executed,
)

__all__ = ["Adapter", "ApprovalGate", "Call", "CallFailedBefore", "CallNotApproved",
           "CallOutcomeUnknown", "Decision", "Executed", "Finished", "Outcome", "Paused",
           "Waiting"]
