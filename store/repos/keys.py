"""Keys a deployment generated for itself (``deployment_keys``)."""

from __future__ import annotations

from datetime import datetime
from typing import cast

from approvald.store.models import DeploymentKey
from approvald.store.repos.base import Repo
from sqlalchemy import Table, select

_T = cast(Table, DeploymentKey.__table__)


class KeysRepo(Repo):
    async def get(self, name: str) -> str | None:
        """The key ``name``, or None when none was made yet."""
        row = (await self.conn.execute(select(_T.c.secret).where(_T.c.name == name))).first()
        return None if row is None else str(row[0])

    async def get_or_add(self, name: str, *, secret: str, now: datetime) -> str:
        """The key ``name``: the one stored, else ``secret``, stored now. Two processes
        racing to make it both read the one that was stored first."""
        await self.conn.execute(self.insert_ignore(DeploymentKey),
                                {"name": name, "secret": secret, "created_at": now})
        row = (await self.conn.execute(select(_T.c.secret).where(_T.c.name == name))).one()
        return str(row[0])
