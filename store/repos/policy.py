"""The policy in force: one row naming the digest of the policy file last loaded."""

from __future__ import annotations

from datetime import datetime
from typing import cast

from approvald.store.models import PolicyInForce
from approvald.store.repos.base import Repo
from sqlalchemy import Table, select, update

_P = cast(Table, PolicyInForce.__table__)


class PolicyRepo(Repo):
    async def current(self) -> str | None:
        """The digest of the policy in force, or None before any process recorded one."""
        row = (await self.conn.execute(select(_P.c.digest).where(_P.c.id == 1))).first()
        return None if row is None else str(row[0])

    async def replace(self, *, digest: str, source: str, now: datetime) -> str | None:
        """Make ``digest`` the policy in force, locking the row: the digest it replaces
        (None: there was none), or ``digest`` itself when it was in force already."""
        await self.conn.execute(self.insert_ignore(PolicyInForce),
                                {"id": 1, "digest": "", "source": "", "loaded_at": now})
        row = (await self.conn.execute(
            select(_P.c.digest).where(_P.c.id == 1).with_for_update())).one()
        before = str(row[0])
        if before != digest:
            await self.conn.execute(update(_P).where(_P.c.id == 1)
                                    .values(digest=digest, source=source, loaded_at=now))
        return before or None
