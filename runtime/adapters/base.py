"""The pause/resume life every adapter shares; each framework fills in two steps.

``run`` drives the framework until it finishes or pauses on gated calls. A pause is
recorded first (the framework's state and the calls, one ``adapter_pauses`` row), then a
request per call is made (the cards go out): state first, request second. ``resume``
answers :class:`Waiting` until every request is decided, then hands the decisions to the
framework, which runs the approved calls through :meth:`ApprovalGate.execute` (once) and
tells the model about the others; the run may finish or pause again. What a resume came
to is recorded on the pause, so resuming it again returns that instead of re-running.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from approvald.runtime.adapters.gate import (
    ApprovalGate,
    Call,
    Decision,
    call_key,
    calls_of,
    jsonable,
    task_of,
)
from approvald.store.repos.adapters import AdapterPauseRecord


@dataclass(frozen=True)
class Paused:
    """The run waits for people; no process needs to stay alive. ``requests`` maps the
    framework's call ids to approvald request ids."""

    pause_id: str
    requests: dict[str, str]
    status: str = "paused"


@dataclass(frozen=True)
class Waiting:
    """``resume`` came before every request was decided: nothing ran."""

    pause_id: str
    pending: tuple[str, ...]
    status: str = "waiting"


@dataclass(frozen=True)
class Finished:
    """The run ended with ``output`` (as JSON data when read back from the store).
    ``pause_id`` is the pause whose resume ended the run (a pause the policy answered at
    once included): the first resume and every repeat of it answer the same, pause id
    and all. None when the run ended with no call to ask about."""

    output: Any
    pause_id: str | None = None
    status: str = "finished"


Outcome = Paused | Waiting | Finished


@dataclass(frozen=True)
class Step:
    """Where one stretch of the framework's run ended: ``calls`` to ask about (with the
    ``state`` to resume from and the pause's stable ``key``), or ``output``."""

    output: Any = None
    calls: Sequence[Call] = field(default_factory=tuple)
    state: Any = None
    key: str = ""


class Adapter(ABC):
    """Shared driver; subclasses say how to read a pause and how to go on from one."""

    framework: ClassVar[str]

    def __init__(self, gate: ApprovalGate) -> None:
        self.gate = gate

    @abstractmethod
    async def _go_on(self, pause: AdapterPauseRecord, state: Any,
                     decisions: dict[str, Decision]) -> Step:
        """Resume the framework from ``state`` with every call decided."""

    async def settle(self, step: Step, *, requested_by: str,
                     task: str | None = None) -> Paused | Finished:
        """Record a pause (if the step paused) and ask about its calls; when the policy
        answered every one at once (auto or forbidden), go on at once."""
        if not step.calls:
            return Finished(step.output)
        rec = await self.gate.pause(self.framework, step.key, requested_by=requested_by,
                                    state=step.state, calls=step.calls, task=task)
        docs = await self._ask(rec)
        if rec.status == "paused" and all(d["status"] != "pending" for d in docs.values()):
            outcome = await self.resume(rec.id)
            assert not isinstance(outcome, Waiting)
            return outcome
        return Paused(rec.id, {cid: str(doc["id"]) for cid, doc in docs.items()})

    async def _ask(self, rec: AdapterPauseRecord) -> dict[str, dict[str, Any]]:
        """Each call's request, made now if it was not yet (the same one every time)."""
        return {c.call_id: await self.gate.ask(
                    c, key=call_key(self.framework, rec.key, c.call_id),
                    requested_by=rec.requested_by, framework=self.framework,
                    task=task_of(rec))
                for c in calls_of(rec)}

    async def decisions(self, pause_id: str) -> dict[str, Decision] | None:
        """Each call's decision, or None while any is pending."""
        rec = await self.gate.pause_record(pause_id)
        docs = await self._ask(rec)
        if any(d["status"] == "pending" for d in docs.values()):
            return None
        return {c.call_id: Decision.of(c, docs[c.call_id]) for c in calls_of(rec)}

    async def resume(self, pause_id: str) -> Outcome:
        """Go on from a pause once every request is decided; :class:`Waiting` before. A
        pause already resumed answers what its resume came to, running nothing."""
        rec = await self.gate.pause_record(pause_id)
        if rec.status == "resumed":
            return self._recorded(rec)
        docs = await self._ask(rec)
        pending = tuple(str(d["id"]) for d in docs.values() if d["status"] == "pending")
        if pending:
            return Waiting(pause_id, pending)
        decisions = {c.call_id: Decision.of(c, docs[c.call_id]) for c in calls_of(rec)}
        step = await self._go_on(rec, json.loads(rec.state), decisions)
        outcome = await self.settle(step, requested_by=rec.requested_by, task=task_of(rec))
        if isinstance(outcome, Finished):  # this pause's outcome, as a repeat reads it back
            outcome = Finished(outcome.output, pause_id)
        recorded = await self.gate.finish(pause_id, _outcome_json(outcome))
        return outcome if recorded.outcome == _outcome_text(outcome) else \
            self._recorded(recorded)

    async def wait_and_resume(self, pause_id: str, *, seconds: float) -> Outcome:
        """Wait up to ``seconds`` for the pause's decisions, then :meth:`resume`."""
        rec = await self.gate.pause_record(pause_id)
        if rec.status == "paused":
            docs = await self._ask(rec)
            await self.gate.wait([str(d["id"]) for d in docs.values()], seconds=seconds)
        return await self.resume(pause_id)

    async def resume_ready(self) -> list[Outcome]:
        """Resume every pause of this framework whose requests are all decided."""
        done: list[Outcome] = []
        for rec in await self.gate.paused(self.framework):
            outcome = await self.resume(rec.id)
            if not isinstance(outcome, Waiting):
                done.append(outcome)
        return done

    @staticmethod
    def _recorded(rec: AdapterPauseRecord) -> Outcome:
        assert rec.outcome is not None
        got = json.loads(rec.outcome)
        if "paused" in got:
            return Paused(got["paused"], dict(got["requests"]))
        return Finished(got["output"], rec.id)


def _outcome_json(outcome: Paused | Finished) -> dict[str, Any]:
    if isinstance(outcome, Paused):
        return {"paused": outcome.pause_id, "requests": outcome.requests}
    return {"output": jsonable(outcome.output)}


def _outcome_text(outcome: Paused | Finished) -> str:
    from approvald.runtime.kernel.canonical import compact_json

    return compact_json(_outcome_json(outcome))
