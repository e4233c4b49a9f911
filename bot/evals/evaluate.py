"""Evaluate a dataset: every task, uninterrupted and under each interruption, each journey
in a database of its own, scored against the task's expectations."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from approvald.bot.evals.dataset import Dataset, DatasetError
from approvald.bot.evals.journey import Driver, Journey, crash_variants
from approvald.bot.evals.score import SCORES, score
from approvald.runtime import Agent, ManualClock, NotFound, PolicyFile, Registry, mask_text
from approvald.store.db import Database


@dataclass
class Row:
    """One task under one interruption: its failures by score, and what it measured."""

    task: str
    variant: str
    journey: Journey
    failures: dict[str, list[str]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not any(self.failures.values())

    def reasons(self) -> list[str]:
        return [f"{s}: {r}" for s in SCORES for r in self.failures.get(s, [])]

    def to_json(self) -> dict[str, Any]:
        j = self.journey
        return {"task": self.task, "interruption": self.variant, "ok": self.ok,
                "run_id": j.run_id, "status": j.status,
                "result": mask_text(j.result) if j.result is not None else None,
                "scores": {s: not self.failures.get(s) for s in SCORES},
                "failures": {s: self.failures.get(s, []) for s in SCORES},
                "interrupted": j.killed or j.changed,
                "steps": j.steps, "latency_ms": round(j.latency_ms, 1),
                "cost_usd": j.cost_usd, "asked": j.asked,
                "executed": [{"tool": x.tool, "call_id": x.call_id, "status": x.status}
                             for x in j.executions]}


@dataclass
class Report:
    dataset: str
    rows: list[Row] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.rows)

    def to_json(self) -> dict[str, Any]:
        return {"dataset": self.dataset, "ok": self.ok,
                "passed": sum(r.ok for r in self.rows), "total": len(self.rows),
                "journeys": [r.to_json() for r in self.rows]}


def check_agents(dataset: Dataset, agents: Sequence[Agent]) -> None:
    """Refuse a dataset naming an agent that is not loaded, before anything runs."""
    registry = Registry(agents)
    for t in dataset.tasks:
        name = dataset.agent_of(t)
        try:
            registry.get(name)
        except NotFound as exc:
            raise DatasetError(f"{dataset.source}: task {t.name!r}: agent: {exc}") from None


async def evaluate(dataset: Dataset, *, agents: Sequence[Agent],
                   databases: Callable[[], Awaitable[Database]],
                   policy: PolicyFile | None = None, ledger_path: str | None = None,
                   agent_modules: str = "",
                   progress: Callable[[Row], None] | None = None) -> Report:
    """Run every task of ``dataset`` uninterrupted, then under each of its interruptions,
    each journey in a fresh database from ``databases()`` (closed here when done).
    ``agent_modules``: the ``APPROVALD_AGENTS`` modules the agents came from, which the
    crash interruptions' child processes import (the demo agents they always have)."""
    check_agents(dataset, agents)
    report = Report(dataset=dataset.source)
    for task in dataset.tasks:
        agent = dataset.agent_of(task)
        variants = ["baseline", *(v for v in dataset.interruptions_of(task)
                                  if v != "baseline")]
        baseline: Journey | None = None
        while variants:
            variant = variants.pop(0)
            if variant in ("kill_before_calls", "kill_after_calls"):
                # one journey per tool invocation the uninterrupted run made
                assert baseline is not None
                variants[:0] = crash_variants(variant, invocations(baseline))
                continue
            if variant == "data_changed_while_paused" and not task.changed_data:
                continue  # the task names no change to make
            db = await databases()
            try:
                driver = Driver(db, agents, policy=policy or PolicyFile(),
                                clock=ManualClock(), ledger_path=ledger_path,
                                agent_modules=agent_modules)
                journey = await driver.run(agent, task, variant)
            finally:
                await db.close()
            if baseline is None:
                baseline = journey
            row = Row(task.name, variant, journey, score(task, journey, baseline))
            report.rows.append(row)
            if progress is not None:
                progress(row)
    return report


def invocations(journey: Journey) -> int:
    """How many times the journey's tools were invoked (each attempt counts)."""
    return sum(e.attempts for e in journey.executions)


def table(report: Report) -> str:
    """The console table: task x interruption x scores, PASS/FAIL, and every reason."""
    heads = ["task", "interruption", *SCORES, "steps", "ms", "result"]
    body = []
    for r in report.rows:
        body.append([r.task, r.variant,
                     *("ok" if not r.failures.get(s) else "FAIL" for s in SCORES),
                     str(r.journey.steps), f"{r.journey.latency_ms:.0f}",
                     "PASS" if r.ok else "FAIL"])
    widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h)
              for i, h in enumerate(heads)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(heads, widths, strict=True)).rstrip()]
    for b, r in zip(body, report.rows, strict=True):
        lines.append("  ".join(c.ljust(w) for c, w in zip(b, widths, strict=True)).rstrip())
        lines.extend(f"    - {reason}" for reason in r.reasons())
        lines.extend(f"    . a person was asked whether {what}" for what in r.journey.asked)
    passed = sum(r.ok for r in report.rows)
    lines.append(f"{passed}/{len(report.rows)} journeys passed: "
                 + ("PASS" if report.ok else "FAIL"))
    return "\n".join(lines)
