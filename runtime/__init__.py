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

# public name -> the module that defines it (the module itself where the name is its last
# part; ``module:attribute`` where the facade names a thing otherwise)
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
    # what the faces (bot/) import besides, layer by layer: modules too (``binding``,
    # ``api_tokens``...: the value names the module itself), and two names under the
    # facade's own name where two layers use one (``BatchOutcome``, ``CallerWaiting``)
    # kernel
    "binding": "kernel.binding", "call_digest": "kernel.canonical",
    "canonical_json": "kernel.canonical", "compact_json": "kernel.canonical",
    "sha256_hex": "kernel.canonical", "FileClock": "kernel.clock",
    "ManualClock": "kernel.clock", "SystemClock": "kernel.clock",
    "failpoint": "kernel.failpoints", "failpoints": "kernel.failpoints",
    "InvalidIdentity": "kernel.identity", "normalize_user_id": "kernel.identity",
    "TokenSigner": "kernel.ids", "lease_id": "kernel.ids", "new_id": "kernel.ids",
    "MAX_DEPTH": "kernel.json_input", "TooDeep": "kernel.json_input",
    "parse_caller_json": "kernel.json_input:loads",
    "Busy": "kernel.outcomes", "Outcome": "kernel.outcomes",
    "Waiting": "kernel.outcomes", "Yielded": "kernel.outcomes",
    "repeat_every": "kernel.periodic:repeat",
    "id_help": "kernel.prefix", "read_toml": "kernel.tomlfile", "ANSWERS": "kernel.vocabulary",
    "CALL": "kernel.vocabulary", "OutcomeName": "kernel.vocabulary",
    "REQUEST_OUTCOMES": "kernel.vocabulary", "TOOL_CALL": "kernel.vocabulary",
    "WORDS": "kernel.vocabulary", "deadline": "kernel.vocabulary",
    "outcome_of": "kernel.vocabulary", "outcome_words": "kernel.vocabulary:word",
    "WebhookHosts": "kernel.webhook_hosts", "WebhookRefused": "kernel.webhook_hosts",
    # policies
    "Detectors": "policies.detectors", "mask_text": "policies.detectors",
    "Directory": "policies.directory", "DirectoryError": "policies.directory",
    "IntakeError": "policies.intake", "Source": "policies.intake", "Tighten": "policies.intake",
    "MAX_DURATION": "policies.policy", "PolicyFile": "policies.policy",
    "ToolOverride": "policies.policy", "format_duration": "policies.policy",
    "load_policy_file": "policies.policy", "parse_duration": "policies.policy",
    "MAX_EXPRESSION": "policies.rules", "RuleError": "policies.rules",
    "condition_holds": "policies.rules:holds",
    "Scope": "policies.scope", "scope_for": "policies.scope",
    "masked_json": "policies.sensitive", "sensitive": "policies.sensitive",
    "GONE": "policies.tools", "ToolIdentity": "policies.tools",
    # record
    "AuditKey": "record.audit", "AuditTrail": "record.audit", "audit": "record.audit",
    "record_checkpoint": "record.audit_checkpoint", "ExportUnreadable": "record.audit_file",
    "verify_export": "record.audit_file", "ChainBroken": "record.history",
    "History": "record.history", "DrainConfig": "record.outbox",
    "CARD_POST": "record.outbox_kinds", "CARD_UPDATE": "record.outbox_kinds",
    "DEAD_REPORT": "record.outbox_kinds", "EDIT_MAIL": "record.outbox_kinds",
    "HEAD_POST": "record.outbox_kinds", "MAIL_KINDS": "record.outbox_kinds",
    "Mail": "record.outbox_kinds", "MailSender": "record.outbox_kinds",
    "NOTICE": "record.outbox_kinds", "OUTCOME_MAIL": "record.outbox_kinds",
    "REMINDER": "record.outbox_kinds", "REMINDER_MAIL": "record.outbox_kinds",
    "REQUEST_MAIL": "record.outbox_kinds", "RUN_WAITING": "record.outbox_kinds",
    "RetryLater": "record.outbox_kinds", "Route": "record.outbox_kinds",
    "Routes": "record.outbox_kinds", "SIGN_IN_MAIL": "record.outbox_kinds",
    "Undeliverable": "record.outbox_kinds", "WEBHOOK": "record.outbox_kinds",
    "MIN_HORIZON": "record.retention", "retention": "record.retention",
    "OTHER_APPROVER": "record.review_state", "ReviewState": "record.review_state",
    "DataKey": "record.sealing", "OneLineRefusals": "record.sealing",
    "Sealer": "record.sealing", "sealing": "record.sealing", "RunMasking": "record.shown",
    "of_run": "record.shown", "AssistantMessage": "record.state",
    "FINAL_STATUSES": "record.state", "RunState": "record.state", "ToolCall": "record.state",
    "ToolMessage": "record.state", "switches": "record.switches",
    "OtelTracer": "record.tracing", "Tracer": "record.tracing",
    "decode_event": "record.transcript:decode",
    # requests
    "SIGNATURE_HEADER": "requests.api_tokens", "WebhookKeys": "requests.api_tokens",
    "api_tokens": "requests.api_tokens", "check_webhook_url": "requests.api_tokens",
    "webhook_keys": "requests.api_tokens", "WillRun": "requests.packet",
    "asker": "requests.packet", "sensitive_paths": "requests.packet",
    "shown_args": "requests.packet", "shown_packet": "requests.packet",
    "will_run": "requests.packet",
    # approvals
    "BatchOutcome": "approvals.batch:Outcome", "BatchVerdict": "approvals.batch",
    "MAX_BATCH": "approvals.batch", "Target": "approvals.batch", "Actor": "approvals.decide",
    "Decision": "approvals.decide", "Verdict": "approvals.decide",
    "quorum_voters": "approvals.decide:counted", "MAX_WINDOW": "approvals.standing",
    "MIN_WINDOW": "approvals.standing", "StandingRefused": "approvals.standing",
    # runs
    "run_version": "runs.agent", "DemoLedger": "runs.demo", "demo_agents": "runs.demo",
    "DeployReport": "runs.deploy_check", "ExternalError": "runs.external",
    "NewRequest": "runs.external", "Report": "runs.external", "TOOL_CHANGED": "runs.external",
    "TOOL_LIMIT": "runs.external", "external": "runs.external", "status_outcome": "runs.runner",
    # top
    "CallerGate": "callers", "CallerOff": "callers", "CallerWaiting": "callers:Waiting",
    "HEARTBEAT": "callers", "OPEN": "callers", "Refused": "callers",
    "describe_outcome": "callers:describe",
    "refusal": "callers", "time_or_unknown": "callers:when",
    "Insights": "insights", "MIN_REQUESTS": "insights",
    "CHANGES": "replay", "Change": "replay", "Replay": "replay", "Claim": "threads",
    "MAX_REPOSTS": "threads", "Place": "threads", "Entry": "trace", "Totals": "trace",
    "Trace": "trace", "summarize": "trace",
}

__all__ = [
    "ANSWERS",
    "CALL",
    "CARD_POST",
    "CARD_UPDATE",
    "CHANGES",
    "DEAD_REPORT",
    "EDIT_MAIL",
    "FINAL_STATUSES",
    "GONE",
    "HEAD_POST",
    "HEARTBEAT",
    "MAIL_KINDS",
    "MAX_BATCH",
    "MAX_DEPTH",
    "MAX_DURATION",
    "MAX_EXPRESSION",
    "MAX_REPOSTS",
    "MAX_WINDOW",
    "MIN_HORIZON",
    "MIN_REQUESTS",
    "MIN_WINDOW",
    "NOTICE",
    "OPEN",
    "OTHER_APPROVER",
    "OUTCOME_MAIL",
    "REMINDER",
    "REMINDER_MAIL",
    "REQUEST_MAIL",
    "REQUEST_OUTCOMES",
    "RUN_WAITING",
    "SIGNATURE_HEADER",
    "SIGN_IN_MAIL",
    "TOOL_CALL",
    "TOOL_CHANGED",
    "TOOL_LIMIT",
    "WEBHOOK",
    "WORDS",
    "Actor",
    "Agent",
    "ApprovalPolicy",
    "ApprovaldError",
    "AssistantMessage",
    "AuditChainBroken",
    "AuditKey",
    "AuditTrail",
    "BatchOutcome",
    "BatchVerdict",
    "Busy",
    "CallResult",
    "CallerGate",
    "CallerOff",
    "CallerWaiting",
    "CardView",
    "ChainBroken",
    "Change",
    "Claim",
    "Clock",
    "ConfigError",
    "DataKey",
    "DeadView",
    "Decision",
    "DecisionRefused",
    "DemoLedger",
    "DeployReport",
    "Detectors",
    "DigestMismatch",
    "Directory",
    "DirectoryError",
    "Documents",
    "DrainConfig",
    "Engine",
    "EngineConfig",
    "Entry",
    "ExportUnreadable",
    "ExternalError",
    "Figures",
    "FileClock",
    "History",
    "HomeView",
    "Insights",
    "InsightsBoard",
    "IntakeError",
    "InvalidArguments",
    "InvalidIdentity",
    "LangGraphAdapter",
    "LeaseLost",
    "Mail",
    "MailSender",
    "ManualClock",
    "Masking",
    "Meter",
    "ModelError",
    "ModelUnavailable",
    "NewRequest",
    "NotFound",
    "NoticeView",
    "OneLineRefusals",
    "OpenAIAgentsAdapter",
    "OpenAIChatModel",
    "OperatorInsights",
    "OtelTracer",
    "Outcome",
    "OutcomeName",
    "PayloadTooLarge",
    "Place",
    "PolicyFile",
    "PydanticAIAdapter",
    "Reconciled",
    "Refusal",
    "Refused",
    "Registry",
    "Replay",
    "Report",
    "RequestThread",
    "RetryLater",
    "ReviewState",
    "Route",
    "Routes",
    "RuleError",
    "RunFile",
    "RunMasking",
    "RunState",
    "RunThreads",
    "Rung",
    "SchemaOutOfDate",
    "Scope",
    "ScriptedModel",
    "Sealer",
    "Source",
    "StandingItem",
    "StandingRefused",
    "StateVersionError",
    "SystemClock",
    "Target",
    "Tighten",
    "TokenSigner",
    "TooDeep",
    "ToolCall",
    "ToolContext",
    "ToolIdentity",
    "ToolMessage",
    "ToolOverride",
    "Totals",
    "Trace",
    "Tracer",
    "TurnView",
    "Undeliverable",
    "Verdict",
    "Views",
    "Waiting",
    "WebhookHosts",
    "WebhookKeys",
    "WebhookRefused",
    "WillRun",
    "Yielded",
    "api_tokens",
    "asker",
    "assemble",
    "assistant_turns",
    "audit",
    "binding",
    "call_digest",
    "canonical_json",
    "check_webhook_url",
    "compact_json",
    "condition_holds",
    "deadline",
    "decode_event",
    "demo_agents",
    "describe_outcome",
    "external",
    "failpoint",
    "failpoints",
    "format_duration",
    "id_help",
    "lease_id",
    "load_policy_file",
    "mask_args",
    "mask_text",
    "masked_json",
    "new_id",
    "normalize_user_id",
    "of_run",
    "outcome_of",
    "outcome_words",
    "parse_caller_json",
    "parse_duration",
    "quorum_voters",
    "read_toml",
    "record_checkpoint",
    "refusal",
    "repeat_every",
    "reply",
    "retention",
    "run_version",
    "scope_for",
    "sealing",
    "sensitive",
    "sensitive_paths",
    "sha256_hex",
    "shown_args",
    "shown_packet",
    "signature",
    "status_outcome",
    "summarize",
    "switches",
    "time_or_unknown",
    "tool",
    "verify_export",
    "webhook_keys",
    "will_run",
]  # = _EXPORTS' names, in ruff's order (RUF022; tests/unit/test_layers.py)

if TYPE_CHECKING:
    from approvald.runtime.adapters.langgraph import LangGraphAdapter
    from approvald.runtime.adapters.openai_agents import OpenAIAgentsAdapter
    from approvald.runtime.adapters.pydantic_ai import PydanticAIAdapter
    from approvald.runtime.approvals.batch import MAX_BATCH, BatchVerdict, Target
    from approvald.runtime.approvals.batch import Outcome as BatchOutcome
    from approvald.runtime.approvals.decide import Actor, Decision, Verdict
    from approvald.runtime.approvals.decide import counted as quorum_voters
    from approvald.runtime.approvals.standing import MAX_WINDOW, MIN_WINDOW, StandingRefused
    from approvald.runtime.callers import (
        HEARTBEAT,
        OPEN,
        CallerGate,
        CallerOff,
        Refused,
        refusal,
    )
    from approvald.runtime.callers import Waiting as CallerWaiting
    from approvald.runtime.callers import (
        describe as describe_outcome,
    )
    from approvald.runtime.callers import (
        when as time_or_unknown,
    )
    from approvald.runtime.documents import Documents, Figures, RequestThread, RunFile
    from approvald.runtime.engine import CallResult, Engine, EngineConfig, assemble
    from approvald.runtime.insights import MIN_REQUESTS, Insights
    from approvald.runtime.insights_board import InsightsBoard, OperatorInsights
    from approvald.runtime.kernel import binding, failpoints
    from approvald.runtime.kernel.canonical import (
        call_digest,
        canonical_json,
        compact_json,
        sha256_hex,
    )
    from approvald.runtime.kernel.clock import Clock, FileClock, ManualClock, SystemClock
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
    from approvald.runtime.kernel.failpoints import failpoint
    from approvald.runtime.kernel.identity import InvalidIdentity, normalize_user_id
    from approvald.runtime.kernel.ids import TokenSigner, lease_id, new_id
    from approvald.runtime.kernel.json_input import MAX_DEPTH, TooDeep
    from approvald.runtime.kernel.json_input import loads as parse_caller_json
    from approvald.runtime.kernel.metrics import Meter
    from approvald.runtime.kernel.outcomes import Busy, Outcome, Waiting, Yielded
    from approvald.runtime.kernel.periodic import repeat as repeat_every
    from approvald.runtime.kernel.prefix import id_help
    from approvald.runtime.kernel.tomlfile import read_toml
    from approvald.runtime.kernel.vocabulary import (
        ANSWERS,
        CALL,
        REQUEST_OUTCOMES,
        TOOL_CALL,
        WORDS,
        OutcomeName,
        deadline,
        outcome_of,
    )
    from approvald.runtime.kernel.vocabulary import (
        word as outcome_words,
    )
    from approvald.runtime.kernel.webhook_hosts import WebhookHosts, WebhookRefused
    from approvald.runtime.models.openai import OpenAIChatModel
    from approvald.runtime.models.scripted import ScriptedModel, assistant_turns, reply
    from approvald.runtime.policies import sensitive
    from approvald.runtime.policies.detectors import Detectors, mask_text
    from approvald.runtime.policies.directory import Directory, DirectoryError
    from approvald.runtime.policies.intake import IntakeError, Source, Tighten
    from approvald.runtime.policies.masking import Masking
    from approvald.runtime.policies.policy import (
        MAX_DURATION,
        ApprovalPolicy,
        PolicyFile,
        Rung,
        ToolOverride,
        format_duration,
        load_policy_file,
        parse_duration,
    )
    from approvald.runtime.policies.rules import MAX_EXPRESSION, RuleError
    from approvald.runtime.policies.rules import holds as condition_holds
    from approvald.runtime.policies.scope import Scope, scope_for
    from approvald.runtime.policies.sensitive import mask_args, masked_json
    from approvald.runtime.policies.tools import GONE, Reconciled, ToolContext, ToolIdentity, tool
    from approvald.runtime.record import audit, retention, sealing, switches
    from approvald.runtime.record.audit import AuditKey, AuditTrail
    from approvald.runtime.record.audit_checkpoint import record_checkpoint
    from approvald.runtime.record.audit_file import ExportUnreadable, verify_export
    from approvald.runtime.record.history import ChainBroken, History
    from approvald.runtime.record.outbox import DrainConfig
    from approvald.runtime.record.outbox_kinds import (
        CARD_POST,
        CARD_UPDATE,
        DEAD_REPORT,
        EDIT_MAIL,
        HEAD_POST,
        MAIL_KINDS,
        NOTICE,
        OUTCOME_MAIL,
        REMINDER,
        REMINDER_MAIL,
        REQUEST_MAIL,
        RUN_WAITING,
        SIGN_IN_MAIL,
        WEBHOOK,
        Mail,
        MailSender,
        RetryLater,
        Route,
        Routes,
        Undeliverable,
    )
    from approvald.runtime.record.retention import MIN_HORIZON
    from approvald.runtime.record.review_state import OTHER_APPROVER, ReviewState
    from approvald.runtime.record.sealing import DataKey, OneLineRefusals, Sealer
    from approvald.runtime.record.shown import RunMasking, of_run
    from approvald.runtime.record.state import (
        FINAL_STATUSES,
        AssistantMessage,
        RunState,
        ToolCall,
        ToolMessage,
    )
    from approvald.runtime.record.tracing import OtelTracer, Tracer
    from approvald.runtime.record.transcript import decode as decode_event
    from approvald.runtime.replay import CHANGES, Change, Replay
    from approvald.runtime.requests import api_tokens
    from approvald.runtime.requests.api_tokens import (
        SIGNATURE_HEADER,
        WebhookKeys,
        check_webhook_url,
        signature,
        webhook_keys,
    )
    from approvald.runtime.requests.packet import (
        WillRun,
        asker,
        sensitive_paths,
        shown_args,
        shown_packet,
        will_run,
    )
    from approvald.runtime.runs import external
    from approvald.runtime.runs.agent import Agent, Registry, run_version
    from approvald.runtime.runs.demo import DemoLedger, demo_agents
    from approvald.runtime.runs.deploy_check import DeployReport
    from approvald.runtime.runs.external import (
        TOOL_CHANGED,
        TOOL_LIMIT,
        ExternalError,
        NewRequest,
        Report,
    )
    from approvald.runtime.runs.runner import status_outcome
    from approvald.runtime.threads import MAX_REPOSTS, Claim, Place, RunThreads
    from approvald.runtime.trace import Entry, Totals, Trace, summarize
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
    path, _, attribute = module.partition(":")
    found = importlib.import_module(f"{__name__}.{path}")
    value = found if found.__name__.endswith(f".{name}") else getattr(found, attribute or name)
    globals()[name] = value  # the next look-up is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
