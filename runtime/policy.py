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

Unknown keys and bad values are a :class:`ConfigError` naming the file and the key.
A snapshot of the effective policy is stored with each approval, so editing the file
never changes the rules of a request already made.
"""

from __future__ import annotations

import functools
import json
import re
import tomllib
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    ValidationError,
    field_validator,
    model_validator,
)

from runtime.errors import ConfigError

PolicyKind = Literal["auto", "notify_after", "approve_before", "forbidden"]
POLICY_KINDS: tuple[str, ...] = ("auto", "notify_after", "approve_before", "forbidden")

_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*(d|h|m|s)")
_UNIT_SECONDS = {"d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0}


def parse_duration(value: object) -> timedelta:
    """Parse ``"30m"``, ``"1h30m"``, ``"45s"``, ``"2d"``, a number of seconds, or a timedelta."""
    if isinstance(value, timedelta):
        result = value
    elif isinstance(value, int | float) and not isinstance(value, bool):
        result = timedelta(seconds=float(value))
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
        result = timedelta(seconds=total)
    else:
        raise ValueError(f"not a duration: {value!r}")
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
Duration = Annotated[timedelta, BeforeValidator(parse_duration), PlainSerializer(format_duration)]


class Rung(BaseModel):
    """One step of the escalation ladder: who is asked next, and for how long."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    approvers: list[str] = Field(min_length=1)
    ttl: Duration
    quorum: int = Field(default=1, ge=1)


class ApprovalPolicy(BaseModel):
    """Rules for an ``approve_before`` tool."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    approvers: list[str] = Field(default_factory=list)
    quorum: int = Field(default=1, ge=1, le=20)
    allow_self_approval: bool = False
    ttl: Duration = timedelta(minutes=30)
    reminders: list[float] = Field(default_factory=lambda: [0.5, 0.9])
    on_expire: Literal["cancel", "escalate"] = "cancel"
    escalate: list[Rung] = Field(default_factory=list)
    risk: Literal["low", "medium", "high"] = "medium"
    why: str = ""
    channel: str | None = None

    @field_validator("reminders", mode="before")
    @classmethod
    def _reminders(cls, v: object) -> list[float]:
        if not isinstance(v, list):
            raise ValueError("reminders is a list such as ['50%', '90%']")
        return sorted(_parse_fraction(x) for x in v)

    @field_validator("approvers")
    @classmethod
    def _approver_ids(cls, v: list[str]) -> list[str]:
        for a in v:
            if not re.fullmatch(r"[A-Za-z0-9_:.@-]{1,64}", a):
                raise ValueError(f"not a user or group id: {a!r}")
        return list(dict.fromkeys(v))

    @model_validator(mode="after")
    def _consistent(self) -> ApprovalPolicy:
        only_users = self.approvers and not any(is_group(a) for a in self.approvers)
        if only_users and self.quorum > len(self.approvers):
            raise ValueError(
                f"quorum {self.quorum} needs more approvers than the {len(self.approvers)} listed"
            )
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
        """JSON-ready copy stored with each approval."""
        return self.model_dump(mode="json")

    @classmethod
    def from_snapshot(cls, data: Mapping[str, Any] | str) -> ApprovalPolicy:
        """Rebuild from a stored snapshot (a dict, or its JSON text, which is cached)."""
        if isinstance(data, str):
            return _from_snapshot_text(data)
        return cls.model_validate(dict(data))


def is_group(approver: str) -> bool:
    """Slack user-group ids start with ``S``; user ids with ``U`` or ``W``."""
    return approver.startswith("S")


class ToolOverride(BaseModel):
    """What a deployment may override for one tool."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    policy: PolicyKind | None = None
    approvers: list[str] | None = None
    quorum: int | None = None
    allow_self_approval: bool | None = None
    ttl: str | int | None = None
    reminders: list[str | float] | None = None
    on_expire: Literal["cancel", "escalate"] | None = None
    escalate: list[dict[str, Any]] | None = None
    risk: Literal["low", "medium", "high"] | None = None
    why: str | None = None
    channel: str | None = None

    def apply(self, base: ApprovalPolicy) -> ApprovalPolicy:
        fields = self.model_dump(exclude_none=True, exclude={"policy"})
        return ApprovalPolicy.model_validate({**base.model_dump(), **fields})


class PolicyFile(BaseModel):
    """The parsed ``APPROVALD_POLICY_FILE``: per-tool overrides and static group membership."""

    model_config = ConfigDict(extra="forbid")

    tools: dict[str, ToolOverride] = Field(default_factory=dict)
    groups: dict[str, list[str]] = Field(default_factory=dict)
    source: str = Field(default="", exclude=True)

    def effective(
        self, tool: str, kind: PolicyKind, base: ApprovalPolicy
    ) -> tuple[PolicyKind, ApprovalPolicy]:
        """The deployment's policy kind and approval rules for ``tool``."""
        override = self.tools.get(tool)
        if override is None:
            return kind, base
        try:
            return override.policy or kind, override.apply(base)
        except ValidationError as exc:
            raise ConfigError(
                f"APPROVALD_POLICY_FILE: {self.source or 'policy'}: "
                f"{_first_error(exc, f'tools.{tool}')}"
            ) from None


def load_policy_file(path: str | Path) -> PolicyFile:
    """Read and validate a policy file; any problem is one :class:`ConfigError` line."""
    p = Path(path)
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"APPROVALD_POLICY_FILE: {p} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"APPROVALD_POLICY_FILE: cannot read {p}: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"APPROVALD_POLICY_FILE: {p} is not valid TOML: {exc}") from None
    try:
        parsed = PolicyFile.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"APPROVALD_POLICY_FILE: {p}: {_first_error(exc)}") from None
    parsed.source = str(p)
    return parsed


def _first_error(exc: ValidationError, prefix: str = "") -> str:
    err = exc.errors()[0]
    where = ".".join(str(x) for x in (prefix, *err["loc"]) if x != "")
    return f"{where}: {err['msg']}" if where else str(err["msg"])


@functools.lru_cache(maxsize=256)
def _from_snapshot_text(text: str) -> ApprovalPolicy:
    # approvals of one tool share one snapshot text; parse it once (the model is frozen)
    return ApprovalPolicy.model_validate(json.loads(text))
