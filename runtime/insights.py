"""What the record says about approval fatigue (issue 51): per tool and per rule, how often
people are asked, what they answer and how fast; what the shadow rules would have done;
and the rules the record supports, each a snippet to paste, never applied by itself.

A suggestion is made where the record is unanimous: every settled request of a tool
whose argument ``x`` was at most ``T`` was approved as asked (none denied, redirected,
edited, or left to expire), there are at least ``min_requests`` of them, and the current
policy with the rule ``args.x <= T -> auto`` added, replayed over the same window by the
intake, runs no call a person denied or edited. ``T`` is the roundest number between the
largest such value and the smallest value a person did not approve.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from approvald.runtime.kernel.collector import collector_paused
from approvald.runtime.policies.directory import Directory
from approvald.runtime.policies.intake import Source
from approvald.runtime.policies.policy import (
    ApprovalPolicy,
    PolicyFile,
    PolicyKind,
    Rule,
    ToolOverride,
)
from approvald.runtime.record.history import NOT_APPROVED, History, Request
from approvald.runtime.replay import agrees, replay

MIN_REQUESTS = 10  # a suggestion needs at least this many approved requests behind it
TOP_REASONS = 3
_BARE = re.compile(r"[A-Za-z0-9_-]+")
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

Declared = Callable[[Source, str], tuple[PolicyKind, ApprovalPolicy] | None]


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q`` quantile (nearest rank) of ``values``, or None when there are none."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


@dataclass
class Stats:
    """Requests of one tool (or one rule) and what became of them."""

    name: str
    requests: int = 0
    asked: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    waits: list[float] = field(default_factory=list)
    reasons: Counter[str] = field(default_factory=Counter)
    deciders: Counter[str] = field(default_factory=Counter)
    asked_of: Counter[str] = field(default_factory=Counter)

    def add(self, r: Request) -> None:
        self.requests += 1
        self.outcomes[r.outcome] += 1
        if not r.asked:
            return
        self.asked += 1
        for who in dict.fromkeys(r.asked_of):
            self.asked_of[who] += 1
        if r.waited is not None:
            self.waits.append(r.waited)
        if r.decided_by is not None and r.outcome in ("approved", "edited", "denied",
                                                       "redirected"):
            self.deciders[r.decided_by] += 1
        if r.outcome in ("denied", "redirected"):
            self.reasons[r.reason or "(no reason given)"] += 1

    def rate(self, *outcomes: str) -> float | None:
        """The share of the asked requests that ended in one of ``outcomes``."""
        if not self.asked:
            return None
        return round(sum(self.outcomes[o] for o in outcomes) / self.asked, 4)

    def document(self) -> dict[str, Any]:
        """One tool's or rule's figures, as ``insights --json`` prints them."""
        return {
            "name": self.name,
            "requests": self.requests,
            "asked": self.asked,
            "outcomes": dict(sorted(self.outcomes.items())),
            "approve_rate": self.rate("approved", "standing"),
            "edit_rate": self.rate("edited"),
            "deny_rate": self.rate("denied", "redirected"),
            "expire_rate": self.rate("expired"),
            "median_seconds": percentile(self.waits, 0.5),
            "p90_seconds": percentile(self.waits, 0.9),
            "top_denial_reasons": [{"reason": k, "count": n}
                                   for k, n in self.reasons.most_common(TOP_REASONS)],
            "deciders": dict(self.deciders.most_common()),
            "asked_of": dict(self.asked_of.most_common()),
        }


@dataclass
class ShadowStats:
    """A shadow rule's record: the requests it held for, what it would have decided, and
    how often people agreed."""

    where: str
    when: str | None = None
    matched: int = 0
    would: Counter[str] = field(default_factory=Counter)
    settled: int = 0
    agreed: int = 0

    def document(self) -> dict[str, Any]:
        """One shadow rule's record, as ``insights --json`` prints it."""
        return {"where": self.where, "when": self.when, "matched": self.matched,
                "would": dict(self.would), "settled": self.settled, "agreed": self.agreed,
                "agreement": round(self.agreed / self.settled, 4) if self.settled else None}


@dataclass
class Suggestion:
    """A rule the record supports (never applied: a snippet to paste)."""

    tool: str
    when: str
    matched: int
    approved: int
    median_seconds: float | None
    saved: int  # asks the rule would have saved over the window
    dangerous: int  # calls a person denied or edited it would have run (0, or no suggestion)
    snippet: str
    text: str

    def document(self) -> dict[str, Any]:
        """One suggestion, as ``insights --json`` prints it."""
        return {"tool": self.tool, "when": self.when, "policy": "auto",
                "matched": self.matched, "approved": self.approved,
                "median_seconds": self.median_seconds, "saved_asks": self.saved,
                "would_run_denied_or_edited": self.dangerous, "snippet": self.snippet,
                "text": self.text}


@dataclass
class Insights:
    window: str  # "30 days", "the whole record"
    requests: int
    tools: list[Stats]
    rules: list[Stats]
    shadows: list[ShadowStats]
    suggestions: list[Suggestion]


def insights(history: History, policy: PolicyFile, directory: Directory, declared: Declared,
             *, window: str, min_requests: int = MIN_REQUESTS) -> Insights:
    """Figures per tool and per rule, shadow records and suggestions for ``history`` (no
    cyclic collection meanwhile: :mod:`runtime.kernel.collector`)."""
    with collector_paused():
        return _insights(history, policy, directory, declared, window=window,
                         min_requests=min_requests)


def _insights(history: History, policy: PolicyFile, directory: Directory,
              declared: Declared, *, window: str, min_requests: int) -> Insights:
    tools: dict[str, Stats] = {}
    rules: dict[str, Stats] = {}
    shadows: dict[str, ShadowStats] = {}
    for r in history.requests:
        stats = tools.get(r.policy_name)
        if stats is None:  # (made once per tool, not once per request)
            stats = tools[r.policy_name] = Stats(r.policy_name)
        stats.add(r)
        if r.rule:
            stats = rules.get(r.rule)
            if stats is None:
                stats = rules[r.rule] = Stats(r.rule)
            stats.add(r)
        for s in r.shadow:
            where = str(s.get("where"))
            st = shadows.setdefault(where, ShadowStats(where, s.get("when")))
            st.matched += 1
            would = str(s.get("would"))
            st.would[would] += 1
            agreed = agrees(would, [str(a) for a in s.get("approvers") or []], r)
            if agreed is not None:
                st.settled += 1
                st.agreed += agreed
    by_tool: dict[str, list[Request]] = {}
    for r in history.requests:
        by_tool.setdefault(r.policy_name, []).append(r)
    suggestions = []
    for name in sorted(by_tool):
        found = suggest(name, by_tool[name], policy, directory, declared, window=window,
                        min_requests=min_requests)
        if found is not None:
            suggestions.append(found)
    order = sorted(tools.values(), key=lambda s: (-s.asked, s.name))
    return Insights(window, len(history.requests), order,
                    sorted(rules.values(), key=lambda s: (-s.asked, s.name)),
                    sorted(shadows.values(), key=lambda s: s.where), suggestions)


def suggest(name: str, requests: Sequence[Request], policy: PolicyFile,
            directory: Directory, declared: Declared, *, window: str,
            min_requests: int = MIN_REQUESTS) -> Suggestion | None:
    """The best ``args.x <= T -> auto`` rule for tool ``name`` the record supports, if any
    (see the module docstring)."""
    asked = [r for r in requests if r.asked]
    if len(asked) < min_requests:
        return None
    best: Suggestion | None = None
    for key in _numeric_keys(asked):
        found = _threshold(asked, key)
        if found is None:
            continue
        threshold, matched = found
        if len(matched) < min_requests:
            continue
        when = f"{_arg(key)} <= {_number(threshold)}"
        new, snippet = with_rule(policy, name, when)
        replayed = replay(requests, new, directory, declared)
        saved = sum(1 for c in replayed.changes if c.change == "runs_unasked")
        dangerous = len(replayed.dangerous)
        if dangerous or not saved:
            continue
        waits = [w for w in (r.waited for r in matched) if w is not None]
        median = percentile(waits, 0.5)
        approved = sum(1 for r in matched if r.outcome in ("approved", "standing"))
        text = (f"{name} with {key} ≤ {_number(threshold)}: {approved} of {len(matched)} "
                f"approved in {window}" + (f", median {_duration(median)}" if median is not None
                                           else "")
                + f": a rule `{when} → auto` would have saved {saved} asks; replayed, it "
                f"would have run {dangerous} calls a person denied or edited")
        s = Suggestion(name, when, len(matched), approved, median, saved, dangerous, snippet,
                       text)
        if best is None or s.saved > best.saved:
            best = s
    return best


def with_rule(policy: PolicyFile, name: str, when: str) -> tuple[PolicyFile, str]:
    """``policy`` with the rule ``when -> auto`` first among tool ``name``'s rules, and the
    snippet that makes it so."""
    rule = Rule.model_validate({"when": when, "policy": "auto"})
    found = policy.entry(name)
    override = found[1] if found is not None else ToolOverride()
    tools = dict(policy.tools)
    tools[name] = override.model_copy(update={"rules": [rule, *override.rules]})
    new = policy.model_copy(update={"tools": tools})
    key = name if _BARE.fullmatch(name) else json.dumps(name)
    lines = []
    if found is not None and found[0] != name:
        lines.append(f"# a copy of [tools.{json.dumps(found[0])}]'s fields goes here too")
    first = " (first among the tool's rules)" if found is not None and override.rules else ""
    lines += [f"[[tools.{key}.rules]]{'  #' + first if first else ''}",
              f"when = {json.dumps(when)}", 'policy = "auto"']
    return new, "\n".join(lines)


def _numeric_keys(requests: Sequence[Request]) -> list[str]:
    """Top-level arguments that are a number, shown as recorded, in every request."""
    keys: set[str] | None = None
    for r in requests:
        here = {k for k, v in r.args.items()
                if isinstance(v, int | float) and not isinstance(v, bool)
                and r.shown.get(k) == v}
        keys = here if keys is None else keys & here
        if not keys:
            return []
    return sorted(keys or ())


def _threshold(requests: Sequence[Request], key: str) -> tuple[float, list[Request]] | None:
    settled = [r for r in requests if r.outcome in ("approved", "standing", "expired")
               or r.outcome in NOT_APPROVED or r.edited]
    if not settled:
        return None
    bad = [float(r.args[key]) for r in settled if r.outcome not in ("approved", "standing")
           or r.edited]
    good = sorted(float(r.args[key]) for r in settled
                  if r.outcome in ("approved", "standing") and not r.edited)
    limit = min(bad) if bad else None
    below = [x for x in good if limit is None or x < limit]
    if not below:
        return None
    lo = below[-1]
    threshold = _roundest(lo, limit) if limit is not None else lo
    matched = [r for r in requests if float(r.args[key]) <= threshold]
    if any(r.outcome not in ("approved", "standing") or r.edited for r in matched):
        return None  # a pending or cancelled one: nothing settled says yes to it
    return threshold, matched


def _roundest(lo: float, limit: float) -> float:
    """The roundest number at least ``lo`` and below ``limit``."""
    for exp in range(15, -3, -1):
        for mult in (5, 2.5, 2, 1):
            step = mult * 10.0 ** exp
            candidate = math.floor(lo / step) * step
            if candidate < lo:
                candidate += step
            if lo <= candidate < limit:
                return candidate
    return lo


def _number(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(x)


def _arg(key: str) -> str:
    return f"args.{key}" if _IDENT.fullmatch(key) else f"args[{json.dumps(key)}]"


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"

