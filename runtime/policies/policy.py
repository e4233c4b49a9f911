"""Approval policy: who may approve a gated call, how many, for how long, and what silence does.

Declared in code next to the tool (``@tool(approval=ApprovalPolicy(...))``) and overridable
per deployment by a TOML file named by ``APPROVALD_POLICY_FILE``::

    [tools.issue_refund]
    approvers = ["U_ALICE", "S_FINANCE"]
    quorum = 1
    ttl = "30m"
    reminders = ["50%", "90%"]
    on_expire = "escalate"
    escalate = [{ approvers = ["U_CFO"], ttl = "1h" }]

Unknown keys and bad values are a :class:`ConfigError` naming the file and the key, and so
is a policy that could never be satisfied: an id that is not a Slack user (``U…``/``W…``) or
user-group (``S…``) id, a quorum above the users listed, a ladder that ``on_expire =
"cancel"`` would never use. Ids are normalised to Slack's upper-case form (``u_alice`` is
``U_ALICE``). A snapshot of the effective policy is stored with each approval, so editing
the file never changes the rules of a request already made; a stored snapshot is read back
by the rules it was written under (see :func:`_stored`).
"""

from __future__ import annotations

import fnmatch
import functools
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any, Literal

from approvald.runtime.kernel.canonical import canonical_json, sha256_hex
from approvald.runtime.kernel.errors import ConfigError
from approvald.runtime.kernel.identity import (
    InvalidIdentity,
    normalize_approver,
    normalize_group_id,
    normalize_user_id,
)
from approvald.runtime.kernel.tomlfile import read_toml_text
from approvald.runtime.policies.rule_check import check_rule
from approvald.runtime.policies.rules import RuleError, compile_condition, holds
from approvald.runtime.policies.sensitive import normalize_path
from approvald.store.jsontext import loads
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    PrivateAttr,
    SerializerFunctionWrapHandler,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_serializer,
    model_validator,
)

PolicyKind = Literal["auto", "notify_after", "approve_before", "forbidden"]
# "enforce" (what a rule or an entry is unless it says): it decides; "shadow": it is
# evaluated on every call and its verdict recorded, and it decides nothing
Mode = Literal["enforce", "shadow"]
POLICY_KINDS: tuple[str, ...] = ("auto", "notify_after", "approve_before", "forbidden")

_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*(d|h|m|s)")
_UNIT_SECONDS = {"d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0}
# no duration anyone types is longer: beyond it, times computed from it could overflow
# (a datetime past the year 9999), so every parsed duration is refused above it
MAX_DURATION = timedelta(days=3650)
# the longest an approval request (or one rung of its ladder) may wait, unless the
# operator says otherwise (APPROVALD_MAX_TTL)
DEFAULT_MAX_TTL = timedelta(days=30)


def parse_duration(value: object, *, longest: timedelta = MAX_DURATION) -> timedelta:
    """Parse ``"30m"``, ``"1h30m"``, ``"45s"``, ``"2d"``, a number of seconds, or a timedelta;
    a ValueError above ``longest`` (a stored snapshot is read with ``timedelta.max``: the
    stored request decides, as it was accepted then)."""
    if isinstance(value, timedelta):
        result = value
    elif isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
        if not math.isfinite(seconds) or seconds > longest.total_seconds():
            raise ValueError(f"not a duration: {value!r} (at most {longest.days}d)")
        result = timedelta(seconds=seconds)
    elif isinstance(value, str):
        text = value.strip().lower()
        pos, total = 0, 0.0
        for m in _DURATION.finditer(text):
            if text[pos:m.start()].strip():
                break
            total += float(m.group(1)) * _UNIT_SECONDS[m.group(2)]
            pos = m.end()
        if pos == 0 or text[pos:].strip():
            raise ValueError(f"not a duration: {value!r} (use e.g. '30m', '1h', '90s', '2d')")
        if not total <= longest.total_seconds():
            raise ValueError(f"{value!r} is longer than any duration approvald accepts "
                             f"({longest.days}d)")
        result = timedelta(seconds=total)
    else:
        raise ValueError(f"not a duration: {value!r}")
    if result > longest:
        raise ValueError(f"{format_duration(result)} is longer than any duration approvald "
                         f"accepts ({longest.days}d)")
    if result <= timedelta(0):
        raise ValueError("a duration must be positive")
    return result


def format_duration(value: timedelta) -> str:
    """``timedelta(minutes=90)`` -> ``"1h30m"`` (whole seconds; the inverse of parse)."""
    seconds = int(value.total_seconds())
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if seconds >= size:
            parts.append(f"{seconds // size}{unit}")
            seconds %= size
    return "".join(parts) or "0s"


def _parse_fraction(value: object) -> float:
    if isinstance(value, str):
        text = value.strip()
        if not text.endswith("%"):
            raise ValueError(f"a reminder is a percentage of the TTL like '50%', got {value!r}")
        number = float(text[:-1]) / 100.0
    elif isinstance(value, int | float) and not isinstance(value, bool):
        number = float(value)
    else:
        raise ValueError(f"not a reminder: {value!r}")
    if not 0.0 < number < 1.0:
        raise ValueError(f"a reminder must fall strictly inside the TTL, got {value!r}")
    return number


# a TTL: "30m", "1h30m", seconds or a timedelta in; "30m" out (snapshots stay readable)
def _duration(value: object, info: ValidationInfo) -> timedelta:
    return parse_duration(value, longest=timedelta.max if _stored(info) else MAX_DURATION)


Duration = Annotated[timedelta, BeforeValidator(_duration), PlainSerializer(format_duration)]

def _parse_window(value: object, info: ValidationInfo | None = None) -> timedelta:
    """A duration, or ``"0"`` / ``0`` for none at all."""
    if isinstance(value, str):
        value = value.strip()
    if value in ("0", "0s", 0) or (isinstance(value, timedelta) and value == timedelta(0)):
        return timedelta(0)
    return parse_duration(value, longest=timedelta.max if info is not None and _stored(info)
                          else MAX_DURATION)


# a duration that may also be zero (max_standing = "0" turns standing approvals off)
Window = Annotated[timedelta, BeforeValidator(_parse_window), PlainSerializer(format_duration)]

_STORED = "stored_snapshot"  # validation context key set by ApprovalPolicy.from_snapshot
_UNUSED_LADDER = ("an escalate ladder is never used with on_expire = 'cancel' "
                  "(set on_expire = 'escalate', or remove the ladder)")


def _stored(info: ValidationInfo) -> bool:
    """Is this a snapshot stored with an approval, rather than a policy being declared?

    The stored request decides (invariant 12): an approval already made is governed by its
    snapshot as it was accepted then, so the rules added since (Slack id forms, rung quorums,
    unused ladders) apply to policies being declared or loaded, never to stored snapshots.
    A snapshot that could no longer be read would stall its sweep and its decisions.
    """
    return bool(info.context and info.context.get(_STORED))


def _slack_id(normalize: Callable[[str], str]) -> Callable[[str, ValidationInfo], str]:
    def check(value: str, info: ValidationInfo) -> str:
        if _stored(info):
            return value  # checked, by the rules of its day, when it was written
        try:
            return normalize(value)
        except InvalidIdentity as exc:  # pydantic reports ValueErrors with their location
            raise ValueError(str(exc)) from None
    return check


# a Slack user or user-group id, upper-cased: "u_alice" in a file is U_ALICE
Approver = Annotated[str, AfterValidator(_slack_id(normalize_approver))]
UserId = Annotated[str, AfterValidator(_slack_id(normalize_user_id))]
GroupId = Annotated[str, AfterValidator(_slack_id(normalize_group_id))]


def _reachable(quorum: int, approvers: list[str]) -> None:
    """A quorum above the number of listed users could never be met (groups may be larger)."""
    if approvers and not any(is_group(a) for a in approvers) and quorum > len(approvers):
        raise ValueError(f"quorum {quorum} needs more approvers than the {len(approvers)} listed")


def _refuse_unused_ladder(escalate: list[Any] | None, info: ValidationInfo) -> None:
    if escalate and info.data.get("on_expire") == "cancel" and not _stored(info):
        raise ValueError(_UNUSED_LADDER)


class Rung(BaseModel):
    """One step of the escalation ladder: who is asked next, and for how long.

    The ladder's timing is the operator's, and so is who decides when: a caller's
    ``tighten`` of ``ttl`` shorter than the policy's on a policy that escalates is refused
    (``looser_than_policy``), since a shorter first window would hand the request to the
    next rung before the operator's time (a caller choosing its approver). On a policy
    that cancels, a shorter wait is stricter and is taken.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    approvers: list[Approver] = Field(min_length=1)
    ttl: Duration
    quorum: int = Field(default=1, ge=1)

    @field_validator("approvers")
    @classmethod
    def _distinct(cls, v: list[str]) -> list[str]:
        return list(dict.fromkeys(v))

    @model_validator(mode="after")
    def _satisfiable(self, info: ValidationInfo) -> Rung:
        if not _stored(info):
            _reachable(self.quorum, self.approvers)
        return self


Channel = Literal["slack", "email"]


def _slack_only() -> list[Channel]:
    return ["slack"]


class ApprovalPolicy(BaseModel):
    """Rules for an ``approve_before`` tool."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    approvers: list[Approver] = Field(default_factory=list)  # [] = anyone but the requester
    quorum: int = Field(default=1, ge=1, le=20)
    allow_self_approval: bool = False
    ttl: Duration = timedelta(minutes=30)
    reminders: list[float] = Field(default_factory=lambda: [0.5, 0.9])
    on_expire: Literal["cancel", "escalate"] = "cancel"
    escalate: list[Rung] = Field(default_factory=list)
    risk: Literal["low", "medium", "high"] = "medium"
    why: str = ""
    channel: str | None = None
    # "approve": an edit is the editor's approval of the new arguments; "propose": the edit
    # replaces the arguments and someone other than the editor must approve them
    edits: Literal["approve", "propose"] = "approve"
    # where a request is brought to its approvers: its Slack card always; "email" also
    # mails it (with a link to the web review queue) to the approvers' addresses, and
    # its reminders, its escalation and its outcome follow by mail
    channels: list[Channel] = Field(default_factory=_slack_only)
    # the longest a standing approval of the tool may last ("0": none may be granted)
    max_standing: Window = timedelta(hours=1)
    # set when one of the tool's rules on arguments chose this policy: "tools.T.rules[i]:
    # <condition>", kept in the stored snapshot and the request's audit entry
    rule: str | None = None
    # argument paths whose values are secret ("card_number", "credentials.*"): masked
    # wherever a person or a log sees the request (runtime/policies/sensitive.py); the tool's own
    # and what the policy file adds, never fewer
    sensitive: list[str] = Field(default_factory=list)

    @field_validator("sensitive")
    @classmethod
    def _paths(cls, v: list[str]) -> list[str]:
        return list(dict.fromkeys(normalize_path(p) for p in v))

    @field_validator("reminders", mode="before")
    @classmethod
    def _reminders(cls, v: object) -> list[float]:
        if not isinstance(v, list):
            raise ValueError("reminders is a list such as ['50%', '90%']")
        return sorted(_parse_fraction(x) for x in v)

    @field_validator("approvers")
    @classmethod
    def _distinct(cls, v: list[str]) -> list[str]:
        return list(dict.fromkeys(v))

    @field_validator("channels")
    @classmethod
    def _channels(cls, v: list[Channel]) -> list[Channel]:
        if "slack" not in v:  # a card is where a decision is shown to everyone
            raise ValueError('channels must include "slack" (e.g. ["slack", "email"])')
        return list(dict.fromkeys(v))

    @field_validator("escalate")
    @classmethod
    def _ladder_used(cls, v: list[Rung], info: ValidationInfo) -> list[Rung]:
        _refuse_unused_ladder(v, info)
        return v

    @model_validator(mode="after")
    def _consistent(self) -> ApprovalPolicy:
        _reachable(self.quorum, self.approvers)
        if self.on_expire == "escalate" and not self.escalate:
            raise ValueError("on_expire = 'escalate' needs an escalate ladder")
        return self

    def rung(self, index: int) -> tuple[list[str], timedelta, int]:
        """Approvers, TTL and quorum of rung ``index`` (0 = the first request)."""
        if index == 0:
            return list(self.approvers), self.ttl, self.quorum
        r = self.escalate[index - 1]
        return list(r.approvers), r.ttl, r.quorum

    @property
    def rungs(self) -> int:
        return 1 + (len(self.escalate) if self.on_expire == "escalate" else 0)

    def snapshot(self) -> dict[str, Any]:
        """JSON-ready copy stored with each approval (``sensitive`` only when there are
        paths: a policy without any keeps the snapshot, and digest, it always had)."""
        data = self.model_dump(mode="json")
        if not data["sensitive"]:
            del data["sensitive"]
        return data

    @classmethod
    def from_snapshot(cls, data: Mapping[str, Any] | str) -> ApprovalPolicy:
        """Rebuild from a stored snapshot (a dict, or its JSON text, which is cached)."""
        if isinstance(data, str):
            return _from_snapshot_text(data)
        return cls.model_validate(dict(data), context={_STORED: True})


def _without_unset_mode(data: Any) -> Any:
    """A rule's or an entry's dump without ``mode`` when it is unset: a file that names no
    mode keeps the digest it always had."""
    if isinstance(data, dict) and data.get("mode") is None:
        data.pop("mode", None)
    return data


_BLANK = ApprovalPolicy()  # one object: [default] over it is applied (and cached) once


def is_group(approver: str) -> bool:
    """Slack user-group ids start with ``S``; user ids with ``U`` or ``W``."""
    return approver.startswith("S")


class _Fields(BaseModel):
    """What a deployment may set for a tool, or for the calls one of its rules matches."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    policy: PolicyKind | None = None
    approvers: list[Approver] | None = None
    quorum: int | None = None
    allow_self_approval: bool | None = None
    ttl: str | int | None = None
    reminders: list[str | float] | None = None
    on_expire: Literal["cancel", "escalate"] | None = None
    escalate: list[Rung] | None = None
    risk: Literal["low", "medium", "high"] | None = None
    why: str | None = None
    channel: str | None = None
    edits: Literal["approve", "propose"] | None = None
    channels: list[Channel] | None = None
    max_standing: str | int | None = None
    # ["args.card_number", "args.credentials.*"]: more argument values to mask, added to
    # the tool's own (a file can make a value sensitive, never make one shown)
    sensitive: list[str] | None = None

    @field_validator("escalate")
    @classmethod
    def _ladder_used(cls, v: list[Rung] | None, info: ValidationInfo) -> list[Rung] | None:
        _refuse_unused_ladder(v, info)  # both in the file: refused at load
        return v

    @field_validator("sensitive")
    @classmethod
    def _sensitive_paths(cls, v: list[str] | None) -> list[str] | None:
        if v is None:
            return None
        return list(dict.fromkeys(normalize_path(p, prefix=True) for p in v))

    def apply(self, base: ApprovalPolicy) -> ApprovalPolicy:
        fields = self.model_dump(exclude_none=True, exclude={"policy", "rules", "when",
                                                             "reason", "external", "mode"})
        if self.on_expire == "cancel" and self.escalate is None:
            fields["escalate"] = []  # the deployment turns the code's ladder off
        if self.sensitive is not None:  # added to the tool's own: only ever more is masked
            fields["sensitive"] = [*base.sensitive, *self.sensitive]
        return ApprovalPolicy.model_validate({**base.model_dump(), **fields})


class Rule(_Fields):
    """``[[tools.NAME.rules]]``: for the calls whose arguments satisfy ``when`` (a CEL
    condition over ``args``, ``tool`` and ``annotations``, what an MCP tool's server says
    of it, empty for other tools), these fields instead of the tool's. The first rule that
    matches wins; no match, the tool's own policy."""

    when: str
    reason: str | None = None  # why a forbidden call is refused, as the model is told
    # "shadow": evaluated on every call of the tool and recorded (what it would have
    # decided), never enforced
    mode: Mode | None = None

    @model_serializer(mode="wrap")
    def _unset_mode(self, handler: SerializerFunctionWrapHandler) -> Any:
        return _without_unset_mode(handler(self))

    @field_validator("when")
    @classmethod
    def _compiles(cls, v: str) -> str:
        compile_condition(v)  # a ValueError names the rule through its location
        return v

    @model_validator(mode="after")
    def _reason_for_forbidden(self) -> Rule:
        if self.reason is not None and self.policy != "forbidden":
            raise ValueError("reason goes with policy = 'forbidden' (it is what the model "
                             "is told when the rule refuses a call)")
        return self


class ToolOverride(_Fields):
    """What a deployment may override for one tool, and its rules on arguments."""

    @model_serializer(mode="wrap")
    def _unset_mode(self, handler: SerializerFunctionWrapHandler) -> Any:
        return _without_unset_mode(handler(self))

    rules: list[Rule] = Field(default_factory=list)
    # "shadow": evaluated on every call it names and recorded in the call's audit entry
    # (what it would have decided), never enforced: the call gets what it would without
    # this entry (on a rule: without this rule)
    mode: Mode | None = None
    # gone: a tool of an HTTP API caller is named by its source now (api:<token>/<tool>),
    # so an entry can no longer be "external" to lend its policy to any caller that names it
    external: bool | None = None

    @field_validator("external")
    @classmethod
    def _external_is_gone(cls, v: bool | None) -> None:
        if v is not None:
            raise ValueError(
                "external is no longer read: tools of other sources are named by source, "
                'e.g. [tools."api:TOKEN/TOOL"] for an HTTP API token\'s tool, '
                '[tools."mcp:GATEWAY/TOOL"] for an MCP gateway\'s, '
                '[tools."adapter:NAME/TOOL"] for a framework adapter\'s, or a glob such as '
                '[tools."api:*/deploy"]')
        return None


class DefaultPolicy(_Fields):
    """``[default]``: what a tool nobody named gets (a call an HTTP API caller, an MCP
    gateway or an adapter asks about that no ``[tools]`` entry matches): ask, with these
    approvers and limits, or refuse outright. Never ``auto``: silence in the file asks."""

    @field_validator("policy")
    @classmethod
    def _asks_or_refuses(cls, v: PolicyKind | None) -> PolicyKind | None:
        if v not in (None, "approve_before", "forbidden"):
            raise ValueError("the default is 'approve_before' or 'forbidden': a tool the "
                             "file does not name is never run without asking")
        return v


def is_pattern(name: str) -> bool:
    """Whether a ``[tools]`` key is a glob (``api:*/deploy``, ``mcp:files/*``)."""
    return any(c in name for c in "*?[")


def is_namespaced(name: str) -> bool:
    """Whether a policy name names a tool of another source than approvald's agents
    (``api:TOKEN/TOOL``, ``mcp:GATEWAY/TOOL``, ``adapter:NAME/TOOL``)."""
    return ":" in name


@dataclass(frozen=True)
class CallPolicy:
    """What the policy says about one call: its kind, its approval rules (naming the rule
    that matched, if one did), and, for a forbidden call, why."""

    kind: PolicyKind
    approval: ApprovalPolicy
    rule: int | None = None  # index of the matched rule; None: the tool's own policy
    reason: str | None = None
    entry: str | None = None  # the [tools] key that applied (None: no entry matched)
    # what each shadow rule or entry that holds for the call would have decided
    shadow: tuple[Shadow, ...] = ()


@dataclass(frozen=True)
class Shadow:
    """What a ``mode = "shadow"`` rule or entry would have decided for one call: recorded
    in the call's audit entry, never enforced. ``where``: ``tools.KEY.rules[i]`` or
    ``tools.KEY``."""

    where: str
    when: str | None
    kind: PolicyKind
    approvers: tuple[str, ...]
    quorum: int
    reason: str | None = None

    def record(self) -> dict[str, Any]:
        """As the call's audit entry keeps it (under ``shadow``)."""
        return {"where": self.where, "when": self.when, "would": self.kind,
                "approvers": list(self.approvers), "quorum": self.quorum}


class _Memo:
    """What a :class:`PolicyFile`'s reads worked out once: applied policies by (fields,
    base) identity (a gated call re-derives the same frozen policy each time, and
    validating one is the cost of choosing it: bench_rules.py), the entry governing each
    name, the file's text and digest, and whether it has shadows. A copy starts empty."""

    __slots__ = ("applied", "calls", "default", "digest", "entries", "shadows", "text")

    def __init__(self) -> None:
        # for_call's by (policy name, kind, base's id): (base, the policy for any call of
        # it, or None when its rules read the call's arguments, the entry that governs it)
        self.calls: dict[tuple[str, str, int], tuple[ApprovalPolicy, CallPolicy | None,
                                                     tuple[str, ToolOverride] | None]] = {}
        self.default: tuple[PolicyKind, ApprovalPolicy] | None = None
        self.applied: dict[tuple[int, int, str | None],
                           tuple[Any, ApprovalPolicy, ApprovalPolicy]] = {}
        self.entries: dict[tuple[str, bool], tuple[str, ToolOverride] | None] = {}
        self.text: str | None = None  # the file's text, as read
        self.digest: str | None = None
        self.shadows: bool | None = None


def _memo(policy: PolicyFile) -> _Memo:
    """``policy``'s memo, read from its private values directly (not through pydantic's
    ``__getattr__``, which each read of a private attribute goes through)."""
    return policy.__pydantic_private__["_memo"]  # type: ignore[no-any-return,index]


class PolicyFile(BaseModel):
    """The parsed ``APPROVALD_POLICY_FILE``: per-tool overrides, the default for tools it
    does not name, and static group membership.

    A ``[tools]`` key is a policy name, exact (``issue_refund``, ``api:billing/refund``) or
    a glob (``api:*/deploy``); an exact key wins over globs, and among globs the first in
    the file that matches. An MCP gateway's resources and prompts are named like its tools,
    ``mcp:GATEWAY/resource:URI`` and ``mcp:GATEWAY/prompt:NAME`` (rules see ``args.uri``, or
    the prompt's arguments); one no key names is read at once, one a key names is that
    key's, as a call.
    """

    model_config = ConfigDict(extra="forbid")

    tools: dict[str, ToolOverride] = Field(default_factory=dict)
    default: DefaultPolicy = Field(default_factory=DefaultPolicy)
    groups: dict[GroupId, list[UserId]] = Field(default_factory=dict)
    source: str = Field(default="", exclude=True)
    # what this file's reads worked out once (a plain object: a pydantic private attribute
    # costs a __getattr__ and a caught AttributeError per read, and a decision read five)
    _memo: _Memo = PrivateAttr(default_factory=lambda: _Memo())
    # the longest a request (or any rung of its ladder) may wait: APPROVALD_MAX_TTL
    _max_ttl: timedelta = PrivateAttr(default=DEFAULT_MAX_TTL)

    @property
    def max_ttl(self) -> timedelta:
        return self._max_ttl

    @max_ttl.setter
    def max_ttl(self, value: timedelta) -> None:
        self._max_ttl = value

    def model_copy(self, *, update: Mapping[str, Any] | None = None,
                   deep: bool = False) -> PolicyFile:
        """A copy (with ``update``) whose caches start empty: an entry, a digest or an
        applied policy found for this file says nothing of the copy's."""
        copied = super().model_copy(update=update, deep=deep)
        copied._memo = _Memo()
        return copied

    @property
    def text(self) -> str:
        """What the policy says, as an auditor reads it: the policy file's text exactly as
        read; for a policy not read from a file (the built-in defaults, one built in code),
        the canonical JSON of its fields (keys sorted, no whitespace, UTF-8)."""
        memo = _memo(self)
        if memo.text is None:
            memo.text = canonical_json(self.model_dump(mode="json"))
        return memo.text

    @property
    def digest(self) -> str:
        """Which policy was in force: the SHA-256 of :attr:`text` (UTF-8), so of a policy
        file's bytes, as ``sha256sum FILE`` prints it."""
        memo = _memo(self)
        if memo.digest is None:
            memo.digest = sha256_hex(self.text)
        return memo.digest

    def entry(self, name: str, *, shadow: bool = False) -> tuple[str, ToolOverride] | None:
        """The ``[tools]`` entry (key, fields) that governs policy name ``name`` (with
        ``shadow``: the shadow entry that would, were it in force; an entry in shadow
        mode governs nothing)."""
        cached = (name, shadow)
        entries = _memo(self).entries
        if cached in entries:
            return entries[cached]
        found: tuple[str, ToolOverride] | None = None
        exact = self.tools.get(name)
        if exact is not None and (exact.mode == "shadow") == shadow:
            found = (name, exact)
        else:
            for key, override in self.tools.items():
                if is_pattern(key) and (override.mode == "shadow") == shadow \
                        and fnmatch.fnmatchcase(name, key):
                    found = (key, override)
                    break
        if len(entries) >= 4096:
            entries.clear()
        entries[cached] = found
        return found

    def default_policy(self) -> tuple[PolicyKind, ApprovalPolicy]:
        """The operator's policy for a tool nobody declared: ``[default]`` over asking."""
        memo = _memo(self)
        if memo.default is None:
            memo.default = (self.default.policy or "approve_before",
                            self._apply(self.default, _BLANK, "default"))
        return memo.default

    def effective(
        self, tool: str, kind: PolicyKind, base: ApprovalPolicy
    ) -> tuple[PolicyKind, ApprovalPolicy]:
        """The deployment's policy kind and approval rules for ``tool`` (before its rules
        on arguments, which :meth:`for_call` applies)."""
        found = self.entry(tool)
        if found is None:
            return kind, base
        key, override = found
        return override.policy or kind, self._apply(override, base, f"tools.{key}")

    def check(self, tool: str, kind: PolicyKind, base: ApprovalPolicy,
              schema: Mapping[str, Any] | None = None, *, closed: bool = False) -> None:
        """Refuse, at start-up, a tool whose policy or any of whose rules could never be
        applied, that waits longer than ``max_ttl``, or, given the JSON ``schema`` of its
        arguments, whose condition fails on them (see
        :func:`runtime.policies.rule_check.check_rule`, and ``closed`` there): a ConfigError
        naming the file, the tool and the rule."""
        found = self.entry(tool)
        rules = found[1].rules if found else []
        for i, (where, approval) in enumerate(self.approvals(tool, kind, base)):
            self.check_bounds(approval, where)
            if i and schema is not None:
                check_rule(rules[i - 1].when, where, schema, tool=tool, source=self.source,
                           closed=closed)

    def approvals(self, tool: str, kind: PolicyKind,
                  base: ApprovalPolicy) -> list[tuple[str, ApprovalPolicy]]:
        """Every approval policy a call of ``tool`` may get, each with where it is set:
        the tool's own (``tools.KEY``, or ``tool NAME`` when no entry names it), then each
        of its rules' (``tools.KEY.rules[i]``)."""
        _, approval = self.effective(tool, kind, base)
        found = self.entry(tool)
        where = f"tools.{found[0]}" if found else f"tool {tool}"
        out = [(where, approval)]
        for i, rule in enumerate(found[1].rules if found else ()):
            label = f"{where}.rules[{i}]"
            out.append((label, self._apply(rule, approval, label)))
        return out

    def naming(self, channel: Channel,
               tools: Iterable[tuple[str, PolicyKind, ApprovalPolicy]]) -> str | None:
        """Where a policy in force names ``channel``: one of ``tools`` (the name, kind and
        code's policy of each tool an agent defines), an entry of the file for other
        sources' tools (over ``[default]``), or ``[default]`` itself; None when none does.
        A place of the file is named with the file."""
        kind, base = self.default_policy()
        places = [("default", base)]
        defined = set()
        for name, tool_kind, approval in tools:
            defined.add(name)
            places += self.approvals(name, tool_kind, approval)
        places += [p for name in self.tools if name not in defined
                   for p in self.approvals(name, kind, base)]
        for where, approval in places:
            if channel in approval.channels:
                in_file = self.source and not where.startswith("tool ")
                return f"{where} in {self.source}" if in_file else where
        return None

    def check_bounds(self, approval: ApprovalPolicy, where: str) -> None:
        """A policy whose request or any rung waits longer than ``max_ttl`` is refused."""
        for i in range(1 + len(approval.escalate)):
            ttl = approval.rung(i)[1]
            if ttl > self.max_ttl:
                rung = "ttl" if i == 0 else f"escalate[{i - 1}].ttl"
                raise ConfigError(
                    f"APPROVALD_POLICY_FILE: {self.source or 'policy'}: {where}.{rung}: "
                    f"{format_duration(ttl)} is longer than the longest wait allowed, "
                    f"{format_duration(self.max_ttl)} (APPROVALD_MAX_TTL)")

    def for_call(self, tool: str, kind: PolicyKind, base: ApprovalPolicy,
                 args: Mapping[str, Any],
                 annotations: Mapping[str, Any] | None = None) -> CallPolicy:
        """The policy for one call of ``tool`` with these (validated) arguments: the first
        of the tool's rules whose condition holds, else the tool's policy. A condition that
        cannot be evaluated on these arguments fails closed: the call is forbidden.
        Shadow rules and entries decide nothing: what each that holds would have decided
        is in ``shadow``."""
        calls = _memo(self).calls
        key = (tool, kind, id(base))
        hit = calls.get(key)
        if hit is not None and hit[0] is base:
            if hit[1] is not None:  # the same for every call of it (issue 50)
                return hit[1]
            found = hit[2]
        else:
            found = self.entry(tool)
        chosen, seen = self._decide(tool, kind, base, found, args, annotations)
        if not self.has_shadows:
            if hit is None or hit[0] is not base:
                # an entry without rules (or none) decides alike whatever the arguments
                same = chosen if found is None or not found[1].rules else None
                if len(calls) >= 4096:
                    calls.clear()
                calls[key] = (base, same, found)
            return chosen
        shadows = list(seen)
        other = self.entry(tool, shadow=True)
        if other is not None:
            theirs, _ = self._decide(tool, kind, base, other, args, annotations)
            where = f"tools.{other[0]}"
            if theirs.rule is not None:
                where += f".rules[{theirs.rule}]"
            rules = other[1].rules
            shadows.insert(0, _shadow(where, rules[theirs.rule].when
                                      if theirs.rule is not None else None, theirs))
        if not shadows:
            return chosen
        return CallPolicy(chosen.kind, chosen.approval, chosen.rule, chosen.reason,
                          chosen.entry, tuple(shadows))

    @property
    def has_shadows(self) -> bool:
        """Whether any entry or rule of the file is a shadow (else none is looked for)."""
        memo = _memo(self)
        if memo.shadows is None:
            memo.shadows = any(o.mode == "shadow" or any(r.mode == "shadow" for r in o.rules)
                               for o in self.tools.values())
        return memo.shadows

    def _decide(self, tool: str, kind: PolicyKind, base: ApprovalPolicy,
                found: tuple[str, ToolOverride] | None, args: Mapping[str, Any],
                annotations: Mapping[str, Any] | None) -> tuple[CallPolicy, list[Shadow]]:
        """What entry ``found`` decides for the call, and what each of its shadow rules
        that holds before the deciding rule would have decided instead."""
        if found is not None:
            key, override = found
            kind = override.policy or kind
            approval = self._apply(override, base, f"tools.{key}")
        else:
            key, approval = None, base
        seen: list[Shadow] = []
        for i, rule in enumerate(found[1].rules if found else ()):
            where = f"tools.{key}.rules[{i}]"
            try:
                matched = holds(rule.when, tool, args, annotations)
            except RuleError as exc:
                if rule.mode == "shadow":
                    seen.append(Shadow(where, rule.when, "forbidden", (), 1,
                                       f"cannot be evaluated: {exc}"))
                    continue
                return CallPolicy("forbidden", approval, i,
                                  f"{tool} is forbidden: policy rule {where} ({rule.when}) "
                                  f"cannot be evaluated on these arguments: {exc}",
                                  key), seen
            if not matched:
                continue
            rule_kind = rule.policy or kind
            labelled = self._apply(rule, approval, where, label=f"{where}: {rule.when}")
            reason = None
            if rule_kind == "forbidden":
                reason = rule.reason or f"{tool} is forbidden by policy rule {where} " \
                                        f"({rule.when})"
            verdict = CallPolicy(rule_kind, labelled, i, reason, key)
            if rule.mode == "shadow":
                seen.append(_shadow(where, rule.when, verdict))
                continue
            return verdict, seen
        reason = f"{tool} is forbidden by this deployment's policy" \
            if kind == "forbidden" else None
        return CallPolicy(kind, approval, None, reason, key), seen

    def _apply(self, fields: _Fields, base: ApprovalPolicy, where: str, *,
               label: str | None = None) -> ApprovalPolicy:
        """``fields`` over ``base`` (named by ``label`` when a rule chose it), once per
        pair of objects: both are frozen, and the cache holds them, so their ids stay
        theirs while the entry lives."""
        key = (id(fields), id(base), label)
        cache = _memo(self).applied
        hit = cache.get(key)
        if hit is not None and hit[0] is fields and hit[1] is base:
            return hit[2]
        try:
            applied = fields.apply(base)
        except ValidationError as exc:
            raise ConfigError(
                f"APPROVALD_POLICY_FILE: {self.source or 'policy'}: "
                f"{_first_error(exc, where)}"
            ) from None
        if label is not None:
            applied = applied.model_copy(update={"rule": label})
        if len(cache) >= 1024:
            cache.clear()
        cache[key] = (fields, base, applied)
        return applied


def _shadow(where: str, when: str | None, verdict: CallPolicy) -> Shadow:
    approvers, _, quorum = verdict.approval.rung(0)
    return Shadow(where, when, verdict.kind, tuple(approvers), quorum, verdict.reason)


def load_policy_file(path: str | Path, *, max_ttl: timedelta = DEFAULT_MAX_TTL) -> PolicyFile:
    """Read and validate a policy file; any problem is one :class:`ConfigError` line."""
    p = Path(path)
    data, text = read_toml_text(
        p, error=ConfigError, missing=f"APPROVALD_POLICY_FILE: {p} does not exist",
        unreadable=f"APPROVALD_POLICY_FILE: cannot read {p}",
        invalid=f"APPROVALD_POLICY_FILE: {p} is not valid TOML")
    try:
        parsed = PolicyFile.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"APPROVALD_POLICY_FILE: {p}: {_first_error(exc)}") from None
    parsed.source = str(p)
    parsed._memo.text = text  # its digest is the file's SHA-256
    parsed.max_ttl = max_ttl
    parsed.default_policy()  # a [default] that could never apply fails here, at start-up
    return parsed


def _first_error(exc: ValidationError, prefix: str = "") -> str:
    err = exc.errors()[0]
    # a bad [groups] key is located at (groups, <key>, "[key]"); the key names it already;
    # a list index reads as one: tools.issue_refund.rules[1].when
    where = ""
    for x in (prefix, *err["loc"]):
        if x in ("", "[key]"):
            continue
        where += f"[{x}]" if isinstance(x, int) else (f".{x}" if where else str(x))
    msg = str(err["msg"]).removeprefix("Value error, ")
    return f"{where}: {msg}" if where else msg


@functools.lru_cache(maxsize=256)
def _from_snapshot_text(text: str) -> ApprovalPolicy:
    # approvals of one tool share one snapshot text; parse it once (the model is frozen)
    return ApprovalPolicy.model_validate(loads(text), context={_STORED: True})
