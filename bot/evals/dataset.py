"""An eval dataset: tasks, the human decisions to simulate, and what must come of them.

Parsed from TOML; any problem is one :class:`DatasetError` naming the file, the task and
the field, so a typo never turns into an eval that passes by checking nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, get_args

from approvald.runtime import ConfigError, read_toml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

Action = Literal["approve", "deny", "edit", "redirect", "expire"]
Interruption = Literal["baseline", "duplicate_callback", "restart_before_decision",
                       "policy_auto_while_paused", "policy_forbidden_while_paused",
                       "kill_before_calls", "kill_after_calls", "data_changed_while_paused"]
INTERRUPTIONS: tuple[str, ...] = get_args(Interruption)


class DatasetError(ConfigError):
    """A dataset that cannot be evaluated as written."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class CallExpectation(_Strict):
    """A call the model proposes: ``tool``, and arguments matched as a JSON subset."""

    tool: str = Field(min_length=1)
    args: dict[str, Any] = Field(default_factory=dict)


class Decision(_Strict):
    """What the simulated human does with one approval request of ``tool``."""

    tool: str = Field(min_length=1)
    action: Action
    reason: str | None = None
    guidance: str | None = None  # redirect: what the agent should do instead
    args: dict[str, Any] | None = None  # edit: merged over the requested arguments
    by: str = "U0EVAL0001"

    @model_validator(mode="after")
    def _complete(self) -> Decision:
        if self.action == "deny" and not (self.reason or "").strip():
            raise ValueError("a deny needs a reason")
        if self.action == "redirect" and not (self.guidance or "").strip():
            raise ValueError("a redirect needs guidance")
        if self.action != "redirect" and self.guidance is not None:
            raise ValueError(f"guidance only goes with a redirect, not with {self.action}")
        if self.action == "edit" and not self.args:
            raise ValueError("an edit needs args (the arguments to change)")
        if self.action != "edit" and self.args is not None:
            raise ValueError(f"args only go with an edit, not with {self.action}")
        return self


class Expectations(_Strict):
    status: str = "completed"
    result_contains: list[str] = Field(default_factory=list)
    calls: list[CallExpectation] = Field(default_factory=list)
    not_calls: list[CallExpectation] = Field(default_factory=list)
    max_calls: dict[str, int] = Field(default_factory=dict)  # executed calls per tool
    # lines per tool the run left in the outside world's ledger: what really took effect
    max_effects: dict[str, int] = Field(default_factory=dict)
    gated: list[str] = Field(default_factory=list)
    max_steps: int | None = Field(default=None, ge=1)
    max_latency_ms: float | None = Field(default=None, gt=0)
    max_cost_usd: float | None = Field(default=None, ge=0)

    @model_validator(mode="before")
    @classmethod
    def _one_or_many(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("result_contains"), str):
            return {**data, "result_contains": [data["result_contains"]]}
        return data


class OutsideRecord(_Strict):
    """A record the outside world gains while the run waits for a decision (what someone
    else did meanwhile), written to the demo ledger the demo tools read."""

    tool: str = Field(min_length=1)
    args: dict[str, Any] = Field(default_factory=dict)


class Task(_Strict):
    name: str = Field(min_length=1)
    task: str = Field(min_length=1)
    agent: str | None = None
    decisions: list[Decision] = Field(default_factory=list)
    expect: Expectations = Field(default_factory=Expectations)
    interruptions: list[Interruption] | None = None
    # data_changed_while_paused: what changes, and what must then come of the run
    changed_data: list[OutsideRecord] = Field(default_factory=list)
    expect_after_change: Expectations | None = None

    @model_validator(mode="after")
    def _change_and_expectation(self) -> Task:
        if self.changed_data and self.expect_after_change is None:
            raise ValueError("changed_data needs expect_after_change (what must come of the "
                             "run once the data changed)")
        if self.interruptions is not None and not self.changed_data \
                and "data_changed_while_paused" in self.interruptions:
            raise ValueError("data_changed_while_paused needs changed_data (the records "
                             "that change while the run is paused)")
        if self.expect_after_change is not None and not self.changed_data:
            raise ValueError("expect_after_change needs changed_data (the records that "
                             "change while the run is paused)")
        return self

    def decisions_for(self, tool: str) -> list[Decision]:
        return [d for d in self.decisions if d.tool == tool]


class Dataset(_Strict):
    agent: str | None = None
    interruptions: list[Interruption] = Field(
        default_factory=lambda: list(get_args(Interruption)))
    tasks: list[Task] = Field(min_length=1)
    source: str = Field(default="", exclude=True)

    @model_validator(mode="after")
    def _agents_and_names(self) -> Dataset:
        seen: set[str] = set()
        for t in self.tasks:
            if t.name in seen:
                raise ValueError(f"two tasks are named {t.name!r}")
            seen.add(t.name)
        return self

    def agent_of(self, task: Task) -> str:
        name = task.agent or self.agent
        if not name:
            raise DatasetError(f"{self.source}: task {task.name!r}: agent: no agent named "
                               "(set agent at the top or in the task, or pass --agent)")
        return name

    def interruptions_of(self, task: Task) -> list[str]:
        return list(task.interruptions if task.interruptions is not None
                    else self.interruptions)

    def task(self, name: str) -> Task:
        for t in self.tasks:
            if t.name == name:
                return t
        raise DatasetError(f"{self.source}: no task named {name!r}")


def load_dataset(path: str | Path, *, agent: str | None = None) -> Dataset:
    """Read and validate a dataset; ``agent`` (``--agent``) replaces the top-level agent."""
    p = Path(path)
    data = read_toml(p, error=DatasetError, missing=f"{p}: no such dataset file",
                     unreadable=f"{p}: cannot read it", invalid=f"{p}: not valid TOML")
    if agent is not None:
        data["agent"] = agent
    try:
        parsed = Dataset.model_validate(data)
    except ValidationError as exc:
        raise DatasetError(f"{p}: {_where(exc, data)}") from None
    return parsed.model_copy(update={"source": str(p)})


def _where(exc: ValidationError, data: dict[str, Any]) -> str:
    err = exc.errors()[0]
    loc = list(err["loc"])
    msg = str(err["msg"]).removeprefix("Value error, ")
    prefix = ""
    if len(loc) >= 2 and loc[0] == "tasks" and isinstance(loc[1], int):
        tasks = data.get("tasks")
        raw = tasks[loc[1]] if isinstance(tasks, list) and loc[1] < len(tasks) else None
        name = raw.get("name") if isinstance(raw, dict) else None
        prefix = f"task {name!r}: " if isinstance(name, str) else f"task #{loc[1] + 1}: "
        loc = loc[2:]
    field = ".".join(str(x) if not isinstance(x, int) else f"[{x}]" for x in loc)
    field = field.replace(".[", "[")
    return f"{prefix}{field}: {msg}" if field else f"{prefix}{msg}"
