"""The masking of a request and of a run's calls, from what the store recorded with them.

Every call's declared paths are recorded when it is made (:mod:`runtime.policies.sensitive`): a
request's in its stored policy, every executed call's on its ledger row, an external
caller's on its request; so whatever shows a call later (a card, a trace, ``runs show``,
a thread) masks the same values, whether or not anyone was asked about it. The values
themselves are the call's arguments: a request's (as asked and as edited), the call in
the transcript, or an external caller's.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from approvald.runtime.kernel.errors import NotFound
from approvald.runtime.kernel.ids import is_external
from approvald.runtime.policies.sensitive import Masking, sensitive_of_snapshot
from approvald.runtime.record.state import AssistantMessage
from approvald.runtime.record.transcript import Message, build_state
from approvald.store.records import ApprovalRecord, ExecutionRecord, RunRecord
from approvald.store.repos import Tx
from approvald.store.repos.external import ExternalRecord

CALL_ID = "call"  # an external request's one call (runtime.runs.external.CALL_ID)


def of_request(a: ApprovalRecord) -> Masking:
    """What may be shown of ``a``'s call: its stored policy's declared paths and the values
    its arguments (as asked, and as edited) hold under them."""
    return _of_request(a.args, a.edited_args, a.policy)


@functools.lru_cache(maxsize=64)
def _of_request(args: str, edited: str | None, policy: str) -> Masking:
    # a card is drawn several times from the same stored text (posted, updated, quoted)
    paths = sensitive_of_snapshot(policy)
    if not paths:
        return Masking()
    return Masking.of_call(paths, _json(args), _json(edited))


def _json(text: str | None) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


@dataclass(frozen=True)
class RunMasking:
    """The masking of each of a run's calls (by call id), and of the run as a whole:
    every call's paths and values together, for the run's free text (its task, result,
    error, the model's words, the audit log's entries about it)."""

    calls: Mapping[str, Masking] = field(default_factory=dict)
    run: Masking = field(default_factory=Masking)

    def call(self, call_id: str) -> Masking:
        """The masking of one call's arguments: its own declared paths (a call the store
        recorded none for: every path of the run), and every value of the run."""
        found = self.calls.get(call_id)
        return Masking(found.paths if found is not None else self.run.paths,
                       self.run.values)


def of_run(messages: Sequence[Any], approvals: Sequence[ApprovalRecord],
           executions: Mapping[str, ExecutionRecord],
           external: ExternalRecord | None = None) -> RunMasking:
    """The masking of a run's calls from what its store holds: the transcript's calls
    (agent runs), its requests, its ledger rows, and an external caller's request."""
    args: dict[str, list[Any]] = {}
    paths: dict[str, list[str]] = {}
    for m in messages:
        if isinstance(m, AssistantMessage):
            for c in m.tool_calls:
                args.setdefault(c.id, []).append(c.arguments)
    for a in approvals:
        args.setdefault(a.call_id, []).extend(
            v for v in (_json(a.args), _json(a.edited_args)) if v is not None)
        paths.setdefault(a.call_id, []).extend(sensitive_of_snapshot(a.policy))
    for call_id, rec in executions.items():
        paths.setdefault(call_id, []).extend(rec.sensitive_paths())
    if external is not None:
        args.setdefault(CALL_ID, []).append(_json(external.args))
        paths.setdefault(CALL_ID, []).extend(external.sensitive_paths())
    calls = {cid: Masking.of_call(p, *args.get(cid, ())) for cid, p in paths.items()}
    run = Masking()
    for m in calls.values():
        run = run | m
    return RunMasking(calls, run)


@dataclass(frozen=True)
class RunRecords:
    """What the store holds about one run's calls (read in one transaction)."""

    run: RunRecord
    messages: list[Message]
    executions: dict[str, ExecutionRecord]
    approvals: list[ApprovalRecord]
    external: ExternalRecord | None

    def masking(self) -> RunMasking:
        return of_run(self.messages, self.approvals, self.executions, self.external)


async def read_run(tx: Tx, run_id: str) -> RunRecords:
    """Run ``run_id`` (an exact id) and its calls' records; NotFound when there is none."""
    run = await tx.runs.get(run_id)
    if run is None:
        raise NotFound(f"no run {run_id}", run_id=run_id)
    events = await tx.events.load(run_id)
    executions = await tx.executions.for_run(run_id)
    return RunRecords(run, build_state(run, events, executions).messages, executions,
                      await tx.approvals.for_run(run_id),
                      await tx.external.get(run_id) if is_external(run_id) else None)
