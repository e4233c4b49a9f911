"""Each run's ops thread in chat: where it is, how far it has been told, and who is telling it.

A replica claims a thread (compare-and-set on ``claimed_by``/``claimed_until``) before it
posts anything for the run, and records what it posted while the claim is still its own.
``claimed_by`` stays set after work that may have reached chat without being recorded (a
failure, a crash): the next claimer then knows to look in chat before posting again.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

from approvald.store.fastsql import fast
from approvald.store.models import FINAL_STATUSES, Approval, AuditEntry, Run, RunThread
from approvald.store.records import RunRecord
from approvald.store.repos.base import Repo
from sqlalchemy import (
    Table,
    and_,
    bindparam,
    exists,
    func,
    literal_column,
    or_,
    select,
    union_all,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite

_T = cast(Table, RunThread.__table__)
_R = cast(Table, Run.__table__)
_A = cast(Table, Approval.__table__)
EXTERNAL = "external:"  # the agent of a caller's request's run (runtime.policies.intake)
_GET = fast(select(_T).where(_T.c.run_id == bindparam("rid")))


def _free(with_stale: bool) -> Any:
    """The claim is free: none, lapsed, or (``with_stale``) held by an owner known to be
    dead (parameter ``stale``: :meth:`runtime.kernel.owners.Owners.stale`); taken over
    with ``claimed_by`` still set, so the next claimer knows to look in chat first."""
    free = [_T.c.claimed_until.is_(None), _T.c.claimed_until <= bindparam("now")]
    if with_stale:
        free.append(_T.c.claimed_by.in_(bindparam("stale", expanding=True)))
    return or_(*free)


_DUE = or_(_T.c.next_attempt_at.is_(None), _T.c.next_attempt_at <= bindparam("now"))
# the row, unless another transaction holds it (a replica claiming it right now): then the
# claim fails at once instead of waiting to fail (PostgreSQL; SQLite has one writer)
_UNLOCKED = (select(_T.c.run_id).where(_T.c.run_id == bindparam("rid"))
             .with_for_update(skip_locked=True, key_share=True))
_CLAIM = {stale: fast(update(_T)
                      .where(_T.c.run_id.in_(_UNLOCKED),
                             _T.c.claimed_by.is_not_distinct_from(bindparam("seen")),
                             _free(stale), _DUE)
                      .values(claimed_by=bindparam("owner"), claimed_until=bindparam("until"))
                      .returning(*_T.c))
          for stale in (False, True)}
_THREAD_COLS = [c.name for c in _T.c if c.name != "run_id"]
_L = cast(Table, AuditEntry.__table__)
_FINAL = FINAL_STATUSES
# the run has audit entries its thread has not told (by the index on audit_log.run_id)
_UNTOLD = exists().where(_L.c.run_id == _R.c.id, _L.c.seq > _T.c.told_audit)
# the threads that can still be behind, as the partial index ix_run_threads_unsettled says
# (its literals, so that both databases see the index serves the read)
_UNSETTLED = or_(_T.c.ts.is_(None),
                 _T.c.posted_status.not_in([literal_column(f"'{s}'") for s in _FINAL]))
_ORDER = "t__order"
# who holds or left a claim on a thread (one not settled: a claim is taken only on such a
# thread, and released cleanly when it settles it), by ``ix_run_threads_unsettled``
_CLAIMERS = fast(select(_T.c.claimed_by)
                 .where(_UNSETTLED, _T.c.claimed_by.is_not(None)).distinct())


def _behind(callers: bool, stale: bool) -> Any:
    """:meth:`ThreadsRepo.behind`'s read, built once per ``callers`` and ``stale`` (a plan:
    it is polled by every replica's follower), everything the caller gives a parameter.

    Reads by index, so that a poll costs what can be behind and not the history: the
    runs of our agents updated since ``since`` without a thread (``runs`` by
    ``updated_at``), with ``callers`` the callers' requests without one that asked since
    ``since`` (``approvals`` by ``requested_at``: whether a run had asked was a probe of
    approvals per run, which PostgreSQL may plan as a hash of them all), and the threads
    not yet settled (``ix_run_threads_unsettled``). A thread told a final status is
    settled: the follower tells the status only once it has told every event
    (``posted_seq`` reached ``next_seq``) and every audit entry, and a run in a final
    status never moves again (no step, no event, no other status: every write to a run is
    guarded by its lease or a status that is not final), so such a thread could never
    again be found behind its events, its status or (only for a run still going) its
    audit log.
    """
    # approvald's own agents' runs; with ``callers``, callers' requests that asked too
    ours = _R.c.agent.not_like(f"{EXTERNAL}%")
    cols: list[Any] = [_R, *(_T.c[name].label(f"t_{name}") for name in _THREAD_COLS),
                       func.coalesce(_T.c.next_attempt_at, _R.c.created_at).label(_ORDER)]
    threadless = _R.outerjoin(_T, _T.c.run_id == _R.c.id)
    new = (select(*cols).select_from(threadless)
           .where(_R.c.updated_at >= bindparam("since"), ours, _T.c.run_id.is_(None)))
    # a thread is opened for a caller's request only once it asked (its approvals are
    # never deleted but with it), so with ``callers`` every thread is wanted
    parts = [_lagging(cols, None if callers else ours, stale), new]
    if callers:
        # a caller's request that asked since ``since``: by its requests' time, not its
        # run's (one may ask after its run last changed)
        parts.append(select(*cols).select_from(threadless).where(
            _R.c.id.in_(select(_A.c.run_id).where(_A.c.requested_at >= bindparam("since"))),
            _R.c.agent.like(f"{EXTERNAL}%"), _T.c.run_id.is_(None)))
    both = union_all(*parts)
    return fast(both.order_by(both.selected_columns[_ORDER], both.selected_columns.id)
                .limit(bindparam("lim")))


def _lagging(cols: list[Any], wanted: Any | None, stale: bool) -> Any:
    """The threads not yet settled and behind their run (``ix_run_threads_unsettled``),
    whose claim is free (:func:`_free`)."""
    return (select(*cols).select_from(_T.join(_R, _R.c.id == _T.c.run_id))
            .where(_UNSETTLED, *([] if wanted is None else [wanted]), _free(stale), _DUE,
                   _T.c.reposts <= bindparam("max_reposts"),
                   or_(_T.c.ts.is_(None), _T.c.posted_seq < _R.c.next_seq,
                       _T.c.posted_status != _R.c.status,
                       and_(_R.c.status.not_in(_FINAL), _UNTOLD))))


_BEHIND = {k: _behind(k, False) for k in (False, True)}
_BEHIND_STALE = {k: _behind(k, True) for k in (False, True)}  # with dead owners' claims
# a thread's row inserted already claimed (by dialect: ON CONFLICT DO NOTHING)
_OPEN = {name: fast(d.insert(RunThread).on_conflict_do_nothing().returning(*_T.c))
         for name, d in (("postgresql", postgresql), ("sqlite", sqlite))}
_MINE = (_T.c.run_id == bindparam("rid"), _T.c.claimed_by == bindparam("owner"))


@functools.lru_cache(maxsize=32)
def _release(progress: frozenset[str], clean: bool, failed: bool) -> Any:
    """The UPDATE releasing ``owner``'s claim with what its turn told (``progress``: the
    columns given, as parameters ``v_<column>``): :meth:`ThreadsRepo.finish` (``clean``,
    served ``now``), or :meth:`ThreadsRepo.fail` (its turn again at ``retry_at``;
    ``claimed_by`` kept unless ``clean``, one more failure if ``failed``)."""
    values: dict[str, Any] = {k: bindparam(f"v_{k}") for k in sorted(progress)}
    if clean:
        values["claimed_by"] = None
    if failed:
        values["failures"] = _T.c.failures + 1
    return fast(update(_T).where(*_MINE).values(**values))

@dataclass(frozen=True, slots=True)
class ThreadRecord:
    """A run's thread: ``ts`` is None until its parent message is known to be posted."""

    run_id: str
    channel: str
    ts: str | None
    posted_seq: int  # events before this seq are told in the thread
    posted_status: str  # the run status the parent shows and the status lines were told for
    claimed_by: str | None  # set: a claim is held, or work under it may be unrecorded
    claimed_until: datetime | None  # the claim's lease; only its holder posts before then
    next_attempt_at: datetime | None  # no turn before; candidates are served oldest first
    failures: int  # consecutive failed turns (backoff grows with them)
    reposts: int  # parents posted again after the previous one was deleted
    told_audit: int = 0  # the run's audit entries up to this seq are told in the thread


class ThreadsRepo(Repo):
    async def claimers(self) -> list[str]:
        """Owners holding (or who left) a claim on a thread not yet settled (to spot dead
        ones)."""
        return [str(r[0]) for r in await self.conn.execute(_CLAIMERS)]

    async def get(self, run_id: str) -> ThreadRecord | None:
        row = (await self.conn.execute(_GET, {"rid": run_id})).first()
        return None if row is None else ThreadRecord(**row._mapping)

    async def open(self, run_id: str, *, channel: str, owner: str,
                   until: datetime) -> ThreadRecord | None:
        """Create the run's thread row already claimed by ``owner``, before its parent is
        posted; None when another replica created it first."""
        row = (await self.conn.execute(_OPEN[self.dialect], {
            "run_id": run_id, "channel": channel, "ts": None, "posted_seq": 1,
            "posted_status": "", "claimed_by": owner, "claimed_until": until,
            "next_attempt_at": None, "failures": 0, "reposts": 0,
            "told_audit": 0})).first()
        return None if row is None else ThreadRecord(**row._mapping)

    async def claim(self, run_id: str, *, owner: str, seen_by: str | None, now: datetime,
                    until: datetime, stale_owners: Sequence[str] = ()) -> ThreadRecord | None:
        """Compare-and-set: take the thread until ``until`` if its claim is free, its turn
        is due and ``claimed_by`` is still ``seen_by``; returns the row as now claimed.

        Matching ``seen_by`` tells the caller whether the claim it takes over was left
        unclean (``seen_by`` set), which a plain "is it free" test could not. A row another
        transaction holds (on PostgreSQL) is not waited for: the claim returns None at once,
        as it would once that replica's claim committed. A claim held by an owner known to
        be dead (``stale_owners``) is free at once.
        """
        params: dict[str, Any] = {"rid": run_id, "seen": seen_by, "now": now,
                                  "owner": owner, "until": until}
        if stale_owners:
            params["stale"] = list(stale_owners)
        row = (await self.conn.execute(_CLAIM[bool(stale_owners)], params)).first()
        return None if row is None else ThreadRecord(**row._mapping)

    async def finish(self, run_id: str, *, owner: str, now: datetime,
                     **progress: Any) -> bool:
        """Record what ``owner`` posted (``ts``, ``posted_seq``, ``posted_status``,
        ``reposts``, ``told_audit``) and release its claim cleanly; False if the claim is
        no longer its."""
        values = {"claimed_until": None, "failures": 0, "next_attempt_at": now, **progress}
        return await self._release(run_id, owner, values, clean=True, failed=False)

    async def fail(self, run_id: str, *, owner: str, now: datetime, retry_at: datetime,
                   unsure: bool, failed: bool = True, **progress: Any) -> bool:
        """Give the claim back after a failed turn, to be tried again at ``retry_at``.

        ``unsure``: something may have reached chat unrecorded, so ``claimed_by`` stays
        set for the next claimer to see. ``failed=False`` (a rate limit) is waiting, not
        failing: the failure count is left alone.
        """
        values = {"claimed_until": now, "next_attempt_at": retry_at, **progress}
        return await self._release(run_id, owner, values, clean=not unsure, failed=failed)

    async def _release(self, run_id: str, owner: str, values: dict[str, Any], *,
                       clean: bool, failed: bool) -> bool:
        params = {f"v_{k}": v for k, v in values.items()}
        params.update(rid=run_id, owner=owner)
        res = await self.conn.execute(_release(frozenset(values), clean, failed), params)
        return bool(res.rowcount == 1)

    async def behind(self, *, now: datetime, since: datetime, limit: int, max_reposts: int,
                     callers: bool = False, stale_owners: Sequence[str] = ()
                     ) -> list[tuple[RunRecord, ThreadRecord | None]]:
        """Runs whose thread is missing, unposted or behind their events or status, and
        whose turn is due and not claimed by someone else; the longest waiting first.

        Only runs updated since ``since`` (or, with ``callers``, that asked a person since)
        are considered for a missing thread, so turning the Slack face on does not post a
        thread for every run in history, and a follower that moves ``since`` forward
        (:class:`runtime.threads.RunThreads`) reads what is new, not all it ever saw. A
        thread whose parent was lost more than ``max_reposts`` times is left alone. The
        order is by when a thread was last served (``next_attempt_at``; a new one by when
        its run began), so a thread that keeps failing waits its backoff and then its turn
        behind the others instead of sorting first every round.

        A caller's request (a run of agent ``external:…``) gets a thread only with
        ``callers``, and only once it asked a person (it has an approval): an answer of the
        policy never does.

        A run still going whose audit log has entries past ``told_audit`` (a reminder, a
        vote, an escalation: the run itself did not move) is behind too. A thread claimed
        by an owner known to be dead (``stale_owners``) counts as not claimed.
        """
        params: dict[str, Any] = {"now": now, "since": since, "lim": limit,
                                  "max_reposts": max_reposts}
        if stale_owners:
            params["stale"] = list(stale_owners)
        rows = await self.conn.execute((_BEHIND_STALE if stale_owners else _BEHIND)[callers],
                                       params)
        out: list[tuple[RunRecord, ThreadRecord | None]] = []
        for r in rows:
            m = dict(r._mapping)
            del m[_ORDER]
            fields = {name: m.pop(f"t_{name}") for name in _THREAD_COLS}
            run = RunRecord(**m)
            thread = None if fields["channel"] is None else ThreadRecord(run_id=run.id,
                                                                         **fields)
            out.append((run, thread))
        return out
