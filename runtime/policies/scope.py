"""Which calls a standing approval covers: the exact call, the same values for chosen
arguments, or a CEL condition over the arguments (the policy rules' evaluator)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from approvald.runtime.kernel.canonical import call_digest, canonical_json
from approvald.runtime.policies.rules import RuleError, compile_condition, holds
from approvald.store.records import ApprovalRecord
from pydantic import BaseModel, ConfigDict, Field, model_validator


class Scope(BaseModel):
    """Which later calls of the tool a standing approval covers."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["exact", "fields", "condition"]
    digest: str | None = None  # exact: the call's digest
    values: dict[str, Any] = Field(default_factory=dict)  # exact: all; fields: the chosen
    when: str | None = None  # condition: a CEL condition over args and tool

    @model_validator(mode="after")
    def _complete(self) -> Scope:
        if self.kind == "exact" and not self.digest:
            raise ValueError("an exact scope names the call's digest")
        if self.kind == "fields" and not self.values:
            raise ValueError("choose at least one argument whose value calls must share")
        if self.kind == "condition":
            if not (self.when or "").strip():
                raise ValueError("a condition scope needs a condition")
            compile_condition(self.when or "")
        return self

    def covers(self, tool: str, args: Mapping[str, Any]) -> bool:
        if self.kind == "exact":
            return call_digest(tool, dict(args)) == self.digest
        if self.kind == "fields":
            return all(k in args and canonical_json(args[k]) == canonical_json(v)
                       for k, v in self.values.items())
        try:
            return holds(self.when or "", tool, args)
        except RuleError:
            return False  # a condition that cannot be evaluated covers nothing

    def describe(self) -> str:
        if self.kind == "exact":
            return "exactly this call: " + canonical_json(self.values)
        if self.kind == "fields":
            return "calls with " + ", ".join(f"{k} = {canonical_json(v)}"
                                             for k, v in self.values.items())
        return f"calls where {self.when}"


def scope_for(a: ApprovalRecord, kind: str, *, fields: Sequence[str] = (),
              when: str | None = None) -> Scope:
    """The scope of ``kind`` drawn from request ``a`` (its arguments as they stand);
    ValueError if it is incomplete or does not cover ``a`` itself."""
    args = a.effective_args()
    if kind == "exact":
        scope = Scope(kind="exact", digest=a.effective_digest, values=args)
    elif kind == "fields":
        unknown = [f for f in fields if f not in args]
        if unknown:
            raise ValueError(f"{a.tool} has no argument {', '.join(unknown)} in this call")
        scope = Scope(kind="fields", values={f: args[f] for f in fields})
    elif kind == "condition":
        scope = Scope(kind="condition", when=when)
    else:
        raise ValueError(f"unknown scope {kind!r} (exact, fields or condition)")
    if not scope.covers(a.tool, args):
        raise ValueError("the scope does not cover the request it is granted on")
    return scope


