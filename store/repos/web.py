"""The web review queue's sign-in links, Sign in with Slack states, sessions, and the
counts of refusals to someone it does not know.

Using a link is one ``UPDATE ... WHERE used_at IS NULL AND expires_at > now``, using a
Sign in with Slack state one ``INSERT ... ON CONFLICT DO NOTHING`` of its hash: of two
uses, in one process or across replicas, exactly one gets the row. A refusal is counted
by one upsert of its (minute, source, reason) row, and a closed minute's rows are taken
by one ``DELETE ... RETURNING``: each count is folded into the audit log exactly once.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

from approvald.store.models import WebLink, WebRefusalCount, WebSession, WebSlackState
from approvald.store.repos.base import Repo, to_record
from sqlalchemy import Table, delete, func, select, update
from sqlalchemy.dialects import postgresql, sqlite

_L = cast(Table, WebLink.__table__)
_S = cast(Table, WebSession.__table__)
_T = cast(Table, WebSlackState.__table__)
_C = cast(Table, WebRefusalCount.__table__)


@dataclass(frozen=True, slots=True)
class LinkRecord:
    id: str
    token_hash: str
    user_id: str
    email: str
    created_at: datetime
    expires_at: datetime
    used_at: datetime | None


@dataclass(frozen=True, slots=True)
class SlackStateRecord:
    id_hash: str
    browser_hash: str
    created_at: datetime
    expires_at: datetime
    used_at: datetime | None


@dataclass(frozen=True, slots=True)
class SessionRecord:
    id_hash: str
    user_id: str
    created_at: datetime
    expires_at: datetime
    ended_at: datetime | None


class WebRepo(Repo):
    # -- sign-in links --------------------------------------------------------------------
    async def add_link(self, *, id: str, token_hash: str, user_id: str, email: str,
                       created_at: datetime, expires_at: datetime) -> None:
        await self.conn.execute(_L.insert(), {
            "id": id, "token_hash": token_hash, "user_id": user_id, "email": email,
            "created_at": created_at, "expires_at": expires_at, "used_at": None})

    async def link(self, link_id: str) -> LinkRecord | None:
        row = (await self.conn.execute(select(_L).where(_L.c.id == link_id))).first()
        return to_record(LinkRecord, row)

    async def link_by_hash(self, token_hash: str) -> LinkRecord | None:
        row = (await self.conn.execute(
            select(_L).where(_L.c.token_hash == token_hash))).first()
        return to_record(LinkRecord, row)

    async def use_link(self, token_hash: str, *, now: datetime) -> LinkRecord | None:
        """Mark a live link used (compare-and-set); None when it is used, expired or unknown."""
        row = (await self.conn.execute(
            update(_L).where(_L.c.token_hash == token_hash, _L.c.used_at.is_(None),
                             _L.c.expires_at > now)
            .values(used_at=now).returning(_L))).first()
        return to_record(LinkRecord, row)

    async def live_links(self, user_id: str, *, now: datetime) -> int:
        """How many unused, unexpired links ``user_id`` has (a cap on mails asked for)."""
        n = (await self.conn.execute(
            select(func.count()).select_from(_L).where(
                _L.c.user_id == user_id, _L.c.used_at.is_(None), _L.c.expires_at > now))
             ).scalar_one()
        return int(n)

    # -- Sign in with Slack: the state of each sign-in completed ---------------------------
    async def use_slack_state(self, *, id_hash: str, browser_hash: str, created_at: datetime,
                              expires_at: datetime, now: datetime) -> bool:
        """Record the state ``id_hash`` used (compare-and-set: the insert of its hash);
        False when it was used before."""
        res = await self.conn.execute(self.insert_ignore(WebSlackState), {
            "id_hash": id_hash, "browser_hash": browser_hash, "created_at": created_at,
            "expires_at": expires_at, "used_at": now})
        return bool(res.rowcount == 1)

    async def slack_state(self, id_hash: str) -> SlackStateRecord | None:
        row = (await self.conn.execute(select(_T).where(_T.c.id_hash == id_hash))).first()
        return to_record(SlackStateRecord, row)

    # -- refusals to someone unknown, counted ---------------------------------------------
    async def count_refusal(self, *, minute: datetime, source: str, reason: str) -> None:
        """One more refusal of ``reason`` from ``source`` in ``minute``."""
        values = {"minute": minute, "source": source, "reason": reason, "count": 1}
        stmt: Any = (postgresql.insert(_C) if self.dialect == "postgresql"
                     else sqlite.insert(_C)).values(values)
        await self.conn.execute(stmt.on_conflict_do_update(
            index_elements=[_C.c.minute, _C.c.source, _C.c.reason],
            set_={"count": _C.c.count + 1}))

    async def take_refusal_counts(self, before: datetime
                                  ) -> list[tuple[datetime, str, str, int]]:
        """Delete and return the counts of the minutes before ``before``: (minute, source,
        reason, count). Of two replicas taking them at once, each row goes to one."""
        got = await self.conn.execute(
            delete(_C).where(_C.c.minute < before)
            .returning(_C.c.minute, _C.c.source, _C.c.reason, _C.c.count))
        return sorted((r[0], str(r[1]), str(r[2]), int(r[3])) for r in got)

    async def refusal_counts(self) -> list[tuple[datetime, str, str, int]]:
        """The counts not folded yet (minute, source, reason, count)."""
        got = await self.conn.execute(select(_C.c.minute, _C.c.source, _C.c.reason,
                                             _C.c.count))
        return sorted((r[0], str(r[1]), str(r[2]), int(r[3])) for r in got)

    # -- sessions -------------------------------------------------------------------------
    async def add_session(self, *, id_hash: str, user_id: str, created_at: datetime,
                          expires_at: datetime) -> None:
        await self.conn.execute(_S.insert(), {
            "id_hash": id_hash, "user_id": user_id, "created_at": created_at,
            "expires_at": expires_at, "ended_at": None})

    async def session(self, id_hash: str, *, now: datetime) -> SessionRecord | None:
        """A live session (not ended, not expired) by the hash of its id."""
        row = (await self.conn.execute(
            select(_S).where(_S.c.id_hash == id_hash, _S.c.ended_at.is_(None),
                             _S.c.expires_at > now))).first()
        return to_record(SessionRecord, row)

    async def end_session(self, id_hash: str, *, now: datetime) -> bool:
        res = await self.conn.execute(
            update(_S).where(_S.c.id_hash == id_hash, _S.c.ended_at.is_(None))
            .values(ended_at=now))
        return bool(res.rowcount == 1)
