"""The one way in (DESIGN.md, invariants 16 and 17): how every face's request gets its policy.

approvald's own agent loop, the HTTP API, the MCP gateway and the framework adapters all
open their requests through :class:`Intake`, which

1. names the tool by its **source** (:class:`Source`): an agent's ``issue_refund`` is
   policy name ``issue_refund``; HTTP API token ``deploy-bot``'s ``deploy`` is
   ``api:deploy-bot/deploy``; MCP gateway ``files``' ``write_file`` is
   ``mcp:files/write_file``; adapter ``support``'s ``refund`` is ``adapter:support/refund``;
   Claude Code's ``Bash`` through ``approvald hook claude-code`` is ``hook:claude-code/Bash``.
   Two sources never share a policy entry or a standing approval unless the operator
   writes one glob that names both;
2. resolves the **operator's** policy for that name: the policy file's entry (exact, else
   the first glob that matches), over the agent's code for its own tools, and over the
   file's ``[default]`` (ask) for every other source. Nothing a caller sends chooses it;
3. lets a caller make a request **stricter** and never looser (:class:`Tighten`: fewer
   approvers drawn from the policy's, a higher quorum, a shorter wait, edits that need
   another approver, a shorter standing window, a higher risk);
4. normalises identities (``<@U123>``, ``u123`` and ``U123`` are one user) and bounds what
   a caller gives: JSON that does not round-trip (NaN, Infinity, 1e400) and oversized
   payloads are refused with the field named, before anything is written.

The request itself is then written by :meth:`runtime.requests.gate.Gate.insert_approval`, which
records the source and the policy's digest in its audit entry.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, cast

from approvald.runtime.kernel.canonical import canonical_json, compact_json, sha256_hex
from approvald.runtime.kernel.errors import ApprovaldError
from approvald.runtime.kernel.identity import InvalidIdentity, normalize_user_id
from approvald.runtime.kernel.json_input import MAX_DEPTH, depth_over
from approvald.runtime.policies.directory import Directory, DirectoryError, is_approver
from approvald.runtime.policies.policy import (
    ApprovalPolicy,
    Approver,
    CallPolicy,
    Duration,
    PolicyFile,
    PolicyKind,
    Window,
    is_group,
)
from pydantic import BaseModel, ConfigDict, Field, ValidationError

SourceKind = Literal["agent", "api", "mcp", "adapter", "hook"]
EXTERNAL_AGENT = "external:"  # the agent of a run that stands for a caller's request
# credential name prefixes that only approvald itself uses (never an operator's token)
MCP_CREDENTIAL = "mcp."
ADAPTER_CREDENTIAL = "adapter."
HOOK_CREDENTIAL = "hook."  # a coding assistant's permission hook (approvald hook claude-code)
RESERVED_CREDENTIALS = (MCP_CREDENTIAL, ADAPTER_CREDENTIAL, HOOK_CREDENTIAL)
# what an MCP gateway's reads are named by (mcp:NAME/resource:URI, mcp:NAME/prompt:NAME)
READS = ("resource:", "prompt:")
_VIA: dict[str, str] = {"agent": "runtime", "api": "http_api", "mcp": "mcp",
                        "adapter": "adapter", "hook": "hook"}
_RISK = {"low": 0, "medium": 1, "high": 2}
# the coding assistants whose hooks approvald has, as people call them
HOOK_LABELS = {"claude-code": "Claude Code"}


class IntakeError(ApprovaldError):
    """A request the intake refuses before anything is written. ``code`` is stable
    (``invalid_request``, ``looser_than_policy``, ``tool_not_allowed``) and ``field``
    names what was wrong, as the caller sent it."""

    def __init__(self, message: str, *, code: str, field: str | None = None,
                 **fields: Any) -> None:
        super().__init__(message, **fields)
        self.code = code
        self.field = field


@dataclass(frozen=True)
class Source:
    """Where a request comes from: an approvald agent, or a caller's credential."""

    kind: SourceKind
    name: str

    def policy_name(self, tool: str) -> str:
        """The name the policy file knows this source's ``tool`` by."""
        return tool if self.kind == "agent" else f"{self.kind}:{self.name}/{tool}"

    def reads_by_default(self, tool: str) -> bool:
        """Whether ``tool`` is an MCP gateway's resource read or prompt
        (``resource:URI``, ``prompt:NAME``): let through when no entry of the operator's
        file names it; an entry that does applies as it does to a call (its policy and
        rules, else ``[default]``'s: ask)."""
        return self.kind == "mcp" and tool.startswith(READS)

    def subject(self, tool: str) -> str:
        """What a standing approval covers: this source's ``tool``, never another's."""
        return f"{self.kind}:{self.name}/{tool}"

    @functools.cached_property
    def via(self) -> str:
        """The face, as audit entries name it."""
        return _VIA[self.kind]

    @functools.cached_property
    def credential(self) -> str:
        """The token record a caller's requests are made under (agents have none)."""
        if self.kind == "mcp":
            return MCP_CREDENTIAL + self.name
        if self.kind == "adapter":
            return ADAPTER_CREDENTIAL + self.name
        if self.kind == "hook":
            return HOOK_CREDENTIAL + self.name
        return self.name

    @functools.cached_property
    def agent(self) -> str:
        """The ``agent`` of this source's runs (``external:<credential>`` for callers)."""
        return self.name if self.kind == "agent" else EXTERNAL_AGENT + self.credential

    @functools.cached_property
    def label(self) -> str:
        """Who asked, as a person reads it on a card: an agent's name, ``Claude Code``,
        ``MCP gateway bank``, ``deploy-bot (HTTP API)``."""
        if self.kind == "agent":
            return self.name
        if self.kind == "hook":
            return HOOK_LABELS.get(self.name, f"the {self.name} hook")
        if self.kind == "mcp":
            return f"MCP gateway {self.name}"
        if self.kind == "adapter":
            return f"{self.name} (adapter)"
        return f"{self.name} (HTTP API)"

    @classmethod
    @functools.lru_cache(maxsize=1024)
    def of_credential(cls, name: str) -> Source:
        """The source of a credential's requests: one instance for each credential name,
        whose properties are worked out once (issue 50: a request's via, agent and label
        were worked out again for each)."""
        if name.startswith(MCP_CREDENTIAL):
            return cls("mcp", name[len(MCP_CREDENTIAL):])
        if name.startswith(ADAPTER_CREDENTIAL):
            return cls("adapter", name[len(ADAPTER_CREDENTIAL):])
        if name.startswith(HOOK_CREDENTIAL):
            return cls("hook", name[len(HOOK_CREDENTIAL):])
        return cls("api", name)

    @classmethod
    def of_face(cls, face: str) -> Source:
        """``hook:claude-code`` -> the hook ``claude-code`` (a token's or a switch's face)."""
        kind, _, name = face.partition(":")
        if kind not in _VIA or kind == "agent" or not name:
            raise ApprovaldError(f"not a face: {face!r}")
        return cls(cast(SourceKind, kind), name)

    @classmethod
    def of_run(cls, agent: str) -> Source:
        """The source of a run, from its ``agent`` column."""
        if agent.startswith(EXTERNAL_AGENT):
            return cls.of_credential(agent[len(EXTERNAL_AGENT):])
        return cls("agent", agent)


class Tighten(BaseModel):
    """What a caller may ask for beyond the operator's policy: only stricter. Each field
    is checked against the resolved policy; a looser value is refused, never ignored."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    approvers: list[Approver] | None = Field(
        None, min_length=1, description="fewer approvers, drawn from the policy's (a user "
                                        "of a listed group counts as drawn from it)")
    quorum: int | None = Field(None, ge=1, le=20, description="more approvals than the "
                                                             "policy's quorum")
    ttl: Duration | None = Field(None, description="a shorter wait than the policy's, e.g. "
                                                   "'10m' (refused on a policy that escalates: "
                                                   "it would change who decides)")
    edits: Literal["propose"] | None = Field(
        None, description="an edit is a proposal someone else must approve")
    max_standing: Window | None = Field(None, description="a shorter longest standing "
                                                          "approval ('0': none)")
    risk: Literal["low", "medium", "high"] | None = Field(
        None, description="a higher risk than the policy's")


def policy_digest(approval: ApprovalPolicy) -> str:
    """SHA-256 of a resolved policy's snapshot: two requests are in the same band exactly
    when their digests are equal."""
    return snapshot_digest(approval.snapshot())


def snapshot_digest(snapshot: Mapping[str, Any] | str) -> str:
    """:func:`policy_digest` of a stored snapshot (a dict, or its JSON text)."""
    data = json.loads(snapshot) if isinstance(snapshot, str) else snapshot
    return sha256_hex(canonical_json(data))


def requester(raw: str, *, strict: bool) -> str:
    """``raw`` as the one form identities are compared in: a pasted mention unwrapped and a
    Slack user id upper-cased. ``strict``: anything but a Slack user id is refused (a
    caller's claim about who asked must be comparable with who approves)."""
    try:
        return normalize_user_id(raw)
    except InvalidIdentity as exc:
        if strict:
            raise IntakeError(f"requested_by: {exc}", code="invalid_request",
                              field="requested_by") from None
    text = raw.strip()
    if not text or len(text) > 200 or not text.isprintable():
        raise IntakeError("requested_by is 1-200 printable characters",
                          code="invalid_request", field="requested_by")
    return text


def non_finite(value: Any, where: str) -> str | None:
    """The location of the first number in ``value`` that JSON cannot round-trip (NaN,
    Infinity, or a float out of range, which reads back as Infinity), or None."""
    stack: list[tuple[Any, str]] = [(value, where)]
    while stack:
        item, at = stack.pop()
        if isinstance(item, float):
            if not math.isfinite(item):
                return at
        elif isinstance(item, Mapping):
            stack.extend((v, f"{at}.{k}") for k, v in item.items())
        elif isinstance(item, list | tuple):
            stack.extend((v, f"{at}[{i}]") for i, v in enumerate(item))
    return None


def check_json(value: Any, where: str) -> None:
    """Refuse (naming the field) a value nested deeper than :data:`MAX_DEPTH` levels, or
    with numbers JSON cannot round-trip."""
    if depth_over(value, MAX_DEPTH):
        raise IntakeError(f"{where}: nested deeper than {MAX_DEPTH} levels",
                          code="invalid_request", field=where)
    bad = non_finite(value, where)
    if bad is not None:
        raise IntakeError(f"{bad}: a number JSON cannot round-trip (NaN, Infinity, or out "
                          "of range)", code="invalid_request", field=bad)


def json_text(value: Any, where: str) -> str:
    """``value`` checked as :func:`check_json` checks it, and its compact JSON (what is
    stored, and what the payload cap measures): the encoder refuses a number JSON cannot
    round-trip, so ``value`` is walked for one only when it did, to name where."""
    if depth_over(value, MAX_DEPTH):
        raise IntakeError(f"{where}: nested deeper than {MAX_DEPTH} levels",
                          code="invalid_request", field=where)
    try:
        return compact_json(value)
    except ValueError:
        check_json(value, where)  # names the number
        raise


class Intake:
    """Resolves the operator's policy for any source's call, and applies a caller's
    tightening (see the module docstring)."""

    def __init__(self, policy: Callable[[], PolicyFile], directory: Directory) -> None:
        self._policy = policy  # the policy in force now (an evaluation may change it)
        self.directory = directory

    @property
    def policy(self) -> PolicyFile:
        return self._policy()

    def resolve(self, source: Source, tool: str, args: Mapping[str, Any], *,
                declared: tuple[PolicyKind, ApprovalPolicy] | None = None,
                annotations: Mapping[str, Any] | None = None) -> CallPolicy:
        """The operator's policy for this call. ``declared``: an agent's code's policy for
        its own tool (only an agent's is ever taken; every other source starts from the
        file's ``[default]``). ``annotations``: what the tool's server says of it, which
        the file's rules may read (and which choose nothing by themselves)."""
        policy = self.policy  # read once: one file decides the call
        kind, base = self.base(source, declared, policy)
        name = source.policy_name(tool)
        if source.reads_by_default(tool) and policy.entry(name) is None:
            kind = "auto"  # a read no entry names; one that does is that entry's, as a call
        return policy.for_call(name, kind, base, args, annotations)

    def base(self, source: Source, declared: tuple[PolicyKind, ApprovalPolicy] | None = None,
             policy: PolicyFile | None = None) -> tuple[PolicyKind, ApprovalPolicy]:
        """What the file's entries for ``source``'s tools are applied over (``policy``: the
        file in force, when the caller has read it)."""
        if source.kind == "agent" and declared is not None:
            return declared
        return (self.policy if policy is None else policy).default_policy()

    async def tighten(self, chosen: CallPolicy, tighten: Tighten | None) -> CallPolicy:
        """``chosen`` made stricter by a caller; :class:`IntakeError` (``looser_than_policy``,
        naming the field) for anything that would loosen it."""
        if tighten is None or chosen.kind != "approve_before":
            return chosen
        p = chosen.approval
        update: dict[str, Any] = {}
        if tighten.approvers is not None:
            for who in tighten.approvers:
                if not await self._drawn_from(p.approvers, who):
                    raise _looser("approvers", f"{who} is not one of the policy's approvers "
                                               f"({', '.join(p.approvers)})")
            update["approvers"] = list(tighten.approvers)
        if tighten.quorum is not None:
            if tighten.quorum < p.quorum:
                raise _looser("quorum", f"{tighten.quorum} is below the policy's quorum, "
                                        f"{p.quorum}")
            update["quorum"] = tighten.quorum
        if tighten.ttl is not None:
            if tighten.ttl > p.ttl:
                raise _looser("ttl", "longer than the policy's wait "
                                     f"({p.model_dump(mode='json')['ttl']})")
            if tighten.ttl < p.ttl and p.rungs > 1:
                # a shorter first window on a ladder hands the request to the next rung
                # before the operator's time: the caller would choose who decides
                raise _looser("ttl", "shorter than the policy's wait "
                                     f"({p.model_dump(mode='json')['ttl']}) on a policy that "
                                     "escalates: the request would go to the next rung's "
                                     "approvers before the operator's time, so a caller may "
                                     "not shorten it")
            update["ttl"] = tighten.ttl
        if tighten.max_standing is not None:
            if tighten.max_standing > p.max_standing:
                raise _looser("max_standing", "longer than the policy's longest standing "
                                              "approval")
            update["max_standing"] = tighten.max_standing
        if tighten.risk is not None:
            if _RISK[tighten.risk] < _RISK[p.risk]:
                raise _looser("risk", f"{tighten.risk} is below the policy's risk, {p.risk}")
            update["risk"] = tighten.risk
        if tighten.edits is not None:
            update["edits"] = tighten.edits
        if not update:
            return chosen
        try:
            stricter = ApprovalPolicy.model_validate({**p.model_dump(), **update})
        except ValidationError as exc:
            err = exc.errors()[0]
            msg = str(err["msg"]).removeprefix("Value error, ")
            raise IntakeError(f"tighten: {msg} (under the operator's policy for this tool)",
                              code="unsatisfiable", field="tighten") from None
        return CallPolicy(chosen.kind, stricter, chosen.rule, chosen.reason, chosen.entry,
                          chosen.shadow)

    async def _drawn_from(self, approvers: list[str], who: str) -> bool:
        if not approvers or who in approvers:
            return True  # [] is anyone but the requester: naming people narrows it
        if is_group(who):
            return False
        try:
            return await is_approver(self.directory, approvers, who)
        except DirectoryError:
            return False  # cannot tell: refused, never assumed


def _looser(field: str, why: str) -> IntakeError:
    return IntakeError(f"tighten.{field}: {why}; a caller may make the operator's policy "
                       "stricter, never looser", code="looser_than_policy",
                       field=f"tighten.{field}")
