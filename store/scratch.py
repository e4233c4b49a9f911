"""Throwaway SQLite databases, one per eval journey: migrated once, copied per use."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from approvald.store import migrate
from approvald.store.db import Database


class ScratchDatabases:
    """Fresh, migrated SQLite databases under a directory (a temporary one by default)."""

    def __init__(self, directory: str | Path | None = None) -> None:
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if directory is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="approvald-eval-")
            directory = self._tmp.name
        self.dir = Path(directory)
        self._template: Path | None = None
        self._n = 0

    async def new(self) -> Database:
        """An empty database at the newest schema; the caller closes it."""
        if self._template is None:
            template = self.dir / "template.db"
            db = Database(f"sqlite+aiosqlite:///{template}")
            try:
                await migrate.upgrade(db)
            finally:
                await db.close()
            self._template = template
        self._n += 1
        path = self.dir / f"journey-{self._n}.db"
        shutil.copy(self._template, path)
        # the injected clock governs leases too, so an eval can move time across them
        return Database(f"sqlite+aiosqlite:///{path}", server_time=False)

    def cleanup(self) -> None:
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None
