"""A policy replayed against the record (issue 51): what a new policy file would have done.

Every request of the window (:mod:`runtime.record.history`) is decided again by the intake, the
code that decides live (:meth:`runtime.policies.intake.Intake.resolve`), under the new file, and
set beside what happened. A request changes when the new file would

* ``runs_unasked``: run it without asking a person where one was asked (**dangerous**
  when a person had denied, redirected or edited it);
* ``forbidden``: refuse it where it was asked or run (noted when it had been approved);
* ``asks``: ask a person where it ran (or was refused) at once;
* ``approvers``: ask other approvers, or another quorum.

The stored request decides (invariant 12): a replay changes nothing, it only tells.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from approvald.runtime.kernel.collector import collector_paused
from approvald.runtime.kernel.errors import NotFound
from approvald.runtime.policies.directory import Directory
from approvald.runtime.policies.intake import Intake, Source
from approvald.runtime.policies.policy import ApprovalPolicy, CallPolicy, PolicyFile, PolicyKind
from approvald.runtime.policies.rules import RuleError, argument_fields, holds
from approvald.runtime.policies.tools import Tool
from approvald.runtime.record.history import Request
from approvald.runtime.runs.agent import Registry

RUNS = ("auto", "notify_after")
_BLANK = ApprovalPolicy()  # one object, so that the file's policy over it is cached
CHANGES = ("runs_unasked", "forbidden", "asks", "approvers")


@dataclass(frozen=True)
class Change:
    """One request the new policy would have treated otherwise."""

    request: Request
    change: str  # one of CHANGES
    now: CallPolicy
    dangerous: bool  # it would run without asking, and a person had said no to it


@dataclass
class Replay:
    """What a policy file would have done to the requests of a window."""

    requests: int = 0
    changes: list[Change] = field(default_factory=list)
    # (change, outcome) -> requests
    table: Counter[tuple[str, str]] = field(default_factory=Counter)
    # shadow rule (its place in the new file) -> [matched, settled, agreed]
    shadow: dict[str, list[int]] = field(default_factory=dict)
    masked_only: int = 0  # requests decided on their masked arguments (no sealed row)
    decided: int = field(default=0, compare=False)  # distinct calls the intake decided

    @property
    def dangerous(self) -> list[Change]:
        """Calls a person denied, redirected or edited that would now run unasked."""
        return [c for c in self.changes if c.dangerous]


def declared_for(registry: Registry) -> Callable[[Source, str], tuple[PolicyKind,
                                                                      ApprovalPolicy] | None]:
    """What an agent's code declares for its tool (the registry's agents; for an agent no
    longer registered, or a call whose agent the record does not name, the first agent
    that has a tool of that name)."""
    by_name: dict[str, Tool] = {}
    for agent in registry.releases():
        for t in agent.tools:
            by_name.setdefault(t.name, t)

    def declared(source: Source, tool: str) -> tuple[PolicyKind, ApprovalPolicy] | None:
        if source.kind != "agent":
            return None
        found: Tool | None = None
        if source.name:
            try:
                found = registry.get(source.name).tool(tool)
            except NotFound:
                found = None
        found = found or by_name.get(tool)
        return None if found is None else (found.policy, found.approval)
    return declared


def replay(requests: Iterable[Request], policy: PolicyFile, directory: Directory,
           declared: Callable[[Source, str], tuple[PolicyKind, ApprovalPolicy] | None]
           ) -> Replay:
    """Decide each request again under ``policy`` with the intake, and compare (no cyclic
    collection meanwhile: :mod:`runtime.kernel.collector`)."""
    with collector_paused():
        return _replay(requests, policy, directory, declared)


def _replay(requests: Iterable[Request], policy: PolicyFile, directory: Directory,
            declared: Callable[[Source, str], tuple[PolicyKind, ApprovalPolicy] | None]
            ) -> Replay:
    decide = Decisions(Intake(lambda: policy, directory))
    out = Replay()
    # what each source's code declares for each tool (looked up once: the registry is
    # what it is for the whole replay)
    declarations: dict[tuple[str, str, str], Declaration] = {}
    table: dict[tuple[str, str], int] = {}  # (counted here, then into out.table in order)
    changes = out.changes
    for r in requests:
        out.requests += 1
        if not r.opened:
            out.masked_only += 1
        source = r.source
        at = (source.kind, source.name, r.tool)
        decl = declarations.get(at, _UNDECLARED)
        if decl is _UNDECLARED:
            decl = declarations[at] = declared(source, r.tool)
        if decl is None and source.kind == "agent":
            # a tool no agent registered here declares: as it was then, by its answer
            decl = (_kind(r.answer), _BLANK)
        now = decide(source, r.tool, r.args, decl)
        for s in now.shadow:
            agreed = agrees(s.kind, list(s.approvers), r)
            tally = out.shadow.setdefault(s.where, [0, 0, 0])
            tally[0] += 1
            if agreed is not None:
                tally[1] += 1
                tally[2] += agreed
        change = compare(r, now)
        row = ("unchanged" if change is None else change, r.outcome)
        table[row] = table.get(row, 0) + 1
        if change is not None:
            changes.append(Change(r, change, now, change == "runs_unasked"
                                  and r.person_said_no))
    out.table.update(table)
    out.decided = decide.decided
    return out


Declaration = tuple[PolicyKind, ApprovalPolicy] | None


class Decisions:
    """The intake's decision for a call (:meth:`runtime.policies.intake.Intake.resolve`), made once
    per distinct call as the policy file sees it: its source, its tool, what its agent's
    code declares, and the values of the arguments the file's rules for it read (all of
    its arguments where a rule reads them otherwise, see
    :func:`runtime.policies.rules.argument_fields`). The decision is a function of these alone
    (the file's rules are pure), so a repeated call gets the same, computed once: a
    history of a million entries repeats its calls, and a replay decides each once."""

    def __init__(self, intake: Intake) -> None:
        self.intake = intake
        self._memo: dict[Hashable, CallPolicy] = {}
        # (source kind, source name, tool, declared kind, id of the declared approval
        # policy) -> (the arguments its rules read, its number, that policy: held, so that
        # its id stays its own)
        self._calls: dict[Hashable, tuple[tuple[str, ...] | None, int,
                                          ApprovalPolicy | None, tuple[str, ...], str]] = {}
        # (its number, the outcome of each of its rules) -> the intake's decision
        self._by_outcomes: dict[Hashable, CallPolicy] = {}
        self.decided = 0  # distinct calls decided (the rest were repeats)
        self.resolved = 0  # calls the intake resolved (one per set of rules' outcomes)

    def __call__(self, source: Source, tool: str, args: Mapping[str, Any],
                 declared: Declaration) -> CallPolicy:
        at = (source.kind, source.name, tool) if declared is None else \
            (source.kind, source.name, tool, declared[0], id(declared[1]))
        call = self._calls.get(at)
        if call is None:
            name = source.policy_name(tool)
            call = self._calls[at] = (self._fields(name), len(self._calls),
                                      None if declared is None else declared[1],
                                      self._conditions(name), name)
        reads = call[0]
        if reads is None:
            values: Hashable = _value(args)
        else:
            values = tuple([_value(args[k]) if k in args else _ABSENT for k in reads])
        key = (call[1], values)
        found = self._memo.get(key)
        if found is None:
            # a call not seen: what each of its rules says of it (the intake's own
            # evaluation), and the intake's decision once per set of these
            name = call[4]
            outcomes = (call[1], tuple([_outcome(when, name, args) for when in call[3]]))
            found = self._by_outcomes.get(outcomes)
            if found is None:
                found = self._by_outcomes[outcomes] = self.intake.resolve(
                    source, tool, args, declared=declared)
                self.resolved += 1
            self._memo[key] = found
            self.decided += 1
        return found

    def _conditions(self, name: str) -> tuple[str, ...]:
        """The conditions of the rules of ``name``'s entries (in force, then shadow): the
        intake's decision for a call of it is a function of what each says of the call
        (holds, does not, or cannot be evaluated, and why), its source, its tool and what
        its agent's code declares (:meth:`PolicyFile.for_call`; annotations are not
        replayed)."""
        out: list[str] = []
        for shadow in (False, True):
            found = self.intake.policy.entry(name, shadow=shadow)
            out += [rule.when for rule in (found[1].rules if found is not None else ())]
        return tuple(out)

    def _fields(self, name: str) -> tuple[str, ...] | None:
        """The arguments the rules of ``name``'s entries (in force and shadow) read."""
        out: set[str] = set()
        for shadow in (False, True):
            found = self.intake.policy.entry(name, shadow=shadow)
            for rule in found[1].rules if found is not None else ():
                reads = argument_fields(rule.when)
                if reads is None:
                    return None
                out |= reads
        return tuple(sorted(out))



_ABSENT = ("absent",)


def _outcome(when: str, tool: str, args: Mapping[str, Any]) -> Hashable:
    """What condition ``when`` says of a call, as the intake evaluates it
    (:func:`runtime.policies.rules.holds`): True, False, or why it cannot be evaluated
    (the intake's reason names it)."""
    try:
        return holds(when, tool, args)
    except RuleError as exc:
        return "error", str(exc)
_UNDECLARED: Declaration = ("approve_before", ApprovalPolicy())  # (not yet looked up)


def _value(v: Any) -> Hashable:
    """``v`` as a memo key: equal only for values a condition cannot tell apart (``1``,
    ``1.0`` and ``true`` differ; ``-0.0`` and ``0.0`` differ)."""
    t = type(v)
    if t is str:
        return v  # type: ignore[no-any-return]
    if t is int or t is bool or v is None:
        return t.__name__, v
    return "json", json.dumps(v, sort_keys=True, separators=(",", ":"))


def compare(r: Request, now: CallPolicy) -> str | None:
    """How the new decision differs from what happened (None: it does not)."""
    then = r.answer
    if now.kind in RUNS:
        return None if then in RUNS else "runs_unasked"
    if now.kind == "forbidden":
        return None if then == "forbidden" else "forbidden"
    if then != "approve_before":
        return "asks"
    approvers, _, quorum = now.approval.rung(0)
    if sorted(approvers) != sorted(r.approvers) or quorum != r.quorum:
        return "approvers"
    return None


def agrees(would: str, approvers: Sequence[str], r: Request) -> bool | None:
    """Whether people agreed with what a shadow rule would have decided for ``r`` (None:
    nothing was settled to agree with). Run unasked: agreed when it was approved as asked
    (or ran); forbidden: when it was denied or refused; asked: when it was asked, and
    decided by one of the rule's approvers when it names them."""
    if r.outcome not in ("approved", "edited", "denied", "redirected", "expired",
                         "standing", "ran", "forbidden"):
        return None
    if would in RUNS:
        return r.outcome in ("approved", "standing", "ran") and not r.edited
    if would == "forbidden":
        return r.outcome in ("denied", "redirected", "forbidden")
    if not r.asked:
        return False
    if approvers and r.decided_by is not None:
        return r.decided_by in approvers or any(a.startswith("S") for a in approvers)
    return True


def _kind(answer: str) -> PolicyKind:
    if answer == "auto":
        return "auto"
    if answer == "notify_after":
        return "notify_after"
    if answer == "forbidden":
        return "forbidden"
    return "approve_before"
