"""The web review queue's own state, handed to that face as a narrow part (issue 47: no
face opens the database): its sign-in links, its sessions, Sign in with Slack's used
states, and the counts of refusals of someone unknown. Each method is one transaction,
with the audit entry that goes with it; what is refused and why (the messages, the
cookies, the keys) stays the face's (:mod:`bot.web.auth`, :mod:`bot.web.refusals`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import Any

from approvald.runtime.kernel.clock import Clock
from approvald.runtime.record.audit import AuditTrail, Entry
from approvald.runtime.record.outbox_kinds import SIGN_IN_MAIL, SignInMail, queue
from approvald.store.db import Database
from approvald.store.repos import Tx
from approvald.store.repos.web import LinkRecord, SessionRecord

VIA = "web"
OTHER_APPROVER = "other_approver"  # a link for another approver than the one signed in


class ReviewState:
    """Links, sessions, used Slack states and refusal counts of the web review queue."""

    def __init__(self, db: Database, clock: Clock, audit: AuditTrail,
                 notify: Callable[[], None]) -> None:
        self._db = db
        self._clock = clock
        self._audit = audit
        self._notify = notify  # the outbox has a new row

    def now(self) -> datetime:
        return self._clock.now()

    # -- links ----------------------------------------------------------------------------
    async def add_link(self, *, link_id: str, token_hash: str, user: str, email: str,
                       ttl: timedelta, max_live: int) -> bool:
        """Store a sign-in link for ``user`` and queue its mail (audited), unless ``user``
        has ``max_live`` unused links already; True when it was queued."""
        async def write(tx: Tx) -> bool:
            now = self._clock.now()
            if await tx.web.live_links(user, now=now) >= max_live:
                return False
            await tx.web.add_link(id=link_id, token_hash=token_hash, user_id=user,
                                  email=email, created_at=now, expires_at=now + ttl)
            await queue(tx, SignInMail(link_id=link_id, user=user),
                        group_key=f"{SIGN_IN_MAIL}:{link_id}", now=now, give_up_at=now + ttl)
            self._audit.record(tx, at=now, action="web_link_sent", actor=user, via=VIA,
                               details={"link": link_id, "to": email,
                                        "expires_at": (now + ttl).isoformat()})
            return True

        queued: bool = await self._db.transact(write, what="a sign-in link")
        if queued:
            self._notify()
        return queued

    async def link(self, link_id: str) -> LinkRecord | None:
        async with self._db.read() as tx:
            return await tx.web.link(link_id)

    async def link_by_hash(self, token_hash: str) -> LinkRecord | None:
        async with self._db.read() as tx:
            return await tx.web.link_by_hash(token_hash)

    async def use_link(self, token_hash: str, *, session_hash: str, current: str | None,
                       ttl: timedelta) -> SessionRecord | str | None:
        """Use the link whose token hashes to ``token_hash`` (once) and open a session of
        ``ttl`` for its approver, audited: the session; :data:`OTHER_APPROVER` when the
        link is for another approver than ``current`` (the one signed in); None when it
        was not used (used before, expired, unknown: read after which)."""
        async def write(tx: Tx) -> SessionRecord | str | None:
            link = await tx.web.link_by_hash(token_hash)
            if link is not None and current is not None and current != link.user_id:
                return OTHER_APPROVER
            used = await tx.web.use_link(token_hash, now=self._clock.now())
            if used is None:
                return None  # why is read after: a use racing this one may have won
            return await self._open_session(tx, session_hash, used.user_id, ttl,
                                            {"link": used.id})

        result: SessionRecord | str | None = await self._db.transact(write, what="a sign-in")
        return result

    # -- Sign in with Slack ---------------------------------------------------------------
    async def slack_state_used(self, id_hash: str) -> bool:
        async with self._db.read() as tx:
            return await tx.web.slack_state(id_hash) is not None

    async def use_slack_state(self, *, id_hash: str, browser_hash: str, created_at: datetime,
                              expires_at: datetime, session_hash: str, user: str, team: str,
                              ttl: timedelta) -> SessionRecord | None:
        """Use a Sign in with Slack state (its row's insert is the compare-and-set) and open
        a session of ``ttl`` for ``user`` of ``team``, audited; None when it was used
        meanwhile."""
        async def write(tx: Tx) -> SessionRecord | None:
            if not await tx.web.use_slack_state(
                    id_hash=id_hash, browser_hash=browser_hash, created_at=created_at,
                    expires_at=expires_at, now=self._clock.now()):
                return None  # used meanwhile, by a request racing this one
            return await self._open_session(tx, session_hash, user, ttl, {"slack_team": team})

        record: SessionRecord | None = await self._db.transact(write, what="a sign-in")
        return record

    # -- sessions -------------------------------------------------------------------------
    async def _open_session(self, tx: Tx, session_hash: str, user: str, ttl: timedelta,
                            how: dict[str, str]) -> SessionRecord:
        """Write a new session for ``user`` and audit it (``how``: the link, or Slack)."""
        now = self._clock.now()
        record = SessionRecord(id_hash=session_hash, user_id=user, created_at=now,
                               expires_at=now + ttl, ended_at=None)
        await tx.web.add_session(id_hash=record.id_hash, user_id=user, created_at=now,
                                 expires_at=record.expires_at)
        self._audit.record(tx, at=now, action="web_signed_in", actor=user, via=VIA,
                           details={**how,
                                    "session_expires_at": record.expires_at.isoformat()})
        return record

    async def session(self, session_hash: str) -> SessionRecord | None:
        """The live session whose id hashes to ``session_hash``, or None."""
        async with self._db.read() as tx:
            return await tx.web.session(session_hash, now=self._clock.now())

    async def end_session(self, session_hash: str, *, user: str) -> None:
        """End a session (audited when it was live)."""
        async def write(tx: Tx) -> None:
            now = self._clock.now()
            if await tx.web.end_session(session_hash, now=now):
                self._audit.record(tx, at=now, action="web_signed_out", actor=user, via=VIA)

        await self._db.transact(write, what="a sign-out")

    # -- refusals (bot.web.refusals says which are counted and which audited) -------------
    async def count_refusal(self, *, minute: datetime, source: str, reason: str) -> None:
        """Count a refusal of someone unknown (one upsert; no audit entry yet)."""
        async def count(tx: Tx) -> None:
            await tx.web.count_refusal(minute=minute, source=source, reason=reason)

        await self._db.transact(count, what="a refusal")

    async def record_refusal(self, *, at: datetime, actor: str, approval_id: str | None,
                             details: Mapping[str, Any]) -> None:
        """Audit a refusal of someone known (its own transaction: nothing else is written)."""
        async def write(tx: Tx) -> None:
            self._audit.record(tx, at=at, action="web_refused", actor=actor, via=VIA,
                               approval_id=approval_id, details=dict(details))

        await self._db.transact(write, what="a refusal")

    async def fold_refusals(self, *, before: datetime, actor: str) -> int:
        """Fold the counts of the minutes before ``before`` into the audit log, one entry
        per minute and source (as ``actor``), deleting their rows in the same transaction;
        how many entries were written."""
        now = self._clock.now()

        async def write(tx: Tx) -> int:
            rows = await tx.web.take_refusal_counts(before)
            by: dict[tuple[datetime, str], dict[str, int]] = defaultdict(dict)
            for minute, source, reason, n in rows:
                by[minute, source][reason] = by[minute, source].get(reason, 0) + n
            if by:
                self._audit.record_many(tx, [
                    Entry(at=now, action="web_refused", actor=actor, via=VIA,
                          details={"source": source, "minute": minute.isoformat(),
                                   "count": sum(reasons.values()), "reasons": reasons})
                    for (minute, source), reasons in sorted(by.items())])
            return len(by)

        folded: int = await self._db.transact(write, what="folding refusals")
        return folded
