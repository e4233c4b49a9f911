"""The shipped migrations build exactly the models' schema, on both dialects."""

from __future__ import annotations

from pathlib import Path

import pytest
from approvald.store import migrate
from approvald.store.db import Database
from approvald.store.errors import SchemaOutOfDate
from sqlalchemy import text


def test_head_constant_matches_the_migration_scripts() -> None:
    assert migrate.HEAD == migrate.head_revision()


async def test_empty_database_upgrades_to_exactly_the_models(tmp_path: Path, pg_url) -> None:
    from tests.conftest import _pg_admin

    urls = [f"sqlite+aiosqlite:///{tmp_path / 'empty.db'}"]
    if pg_url is not None:
        urls.append(await _fresh_pg(pg_url))
    try:
        await _check(urls)
    finally:
        if len(urls) > 1:
            await _pg_admin(f'DROP DATABASE IF EXISTS "{urls[1].rsplit("/", 1)[1]}" WITH (FORCE)')


async def _check(urls: list[str]) -> None:
    for url in urls:
        db = Database(url)
        result = await migrate.upgrade(db)
        assert (result.before, result.after) == (None, migrate.HEAD)
        again = await migrate.upgrade(db)
        assert not again.changed
        async with db.connection() as conn:
            diffs = await conn.run_sync(migrate.compare)
        await db.close()
        assert diffs == [], f"{url}: {diffs}"


async def _fresh_pg(session_url: str) -> str:
    """A brand-new PostgreSQL database (the session one is already migrated)."""
    import uuid

    from tests.conftest import _pg_admin

    name = f"approvald_mig_{uuid.uuid4().hex[:8]}"
    await _pg_admin(f'CREATE DATABASE "{name}"')
    return session_url.rsplit("/", 1)[0] + "/" + name


async def test_a_database_from_a_newer_version_is_refused(tmp_path: Path) -> None:
    db = Database(f"sqlite+aiosqlite:///{tmp_path / 'new.db'}")
    await migrate.upgrade(db)
    async with db.connection() as conn:
        await conn.execute(text("UPDATE alembic_version SET version_num = '9999'"))
        await conn.commit()
    with pytest.raises(SchemaOutOfDate, match="9999"):
        await migrate.upgrade(db)
    await db.close()


async def test_sqlite_pragmas_are_set(tmp_path: Path) -> None:
    db = Database(f"sqlite+aiosqlite:///{tmp_path / 'p.db'}")
    async with db.connection() as conn:
        values = [(await conn.execute(text(f"PRAGMA {p}"))).scalar()
                  for p in ("journal_mode", "synchronous", "foreign_keys", "busy_timeout")]
    await db.close()
    assert values == ["wal", 2, 1, 10000]


@pytest.mark.parametrize("url,msg", [
    ("mysql://x/y", "unsupported database 'mysql'"),
    ("not a url", "not a database URL"),
    ("sqlite+aiosqlite://", "needs a file path"),
])
def test_bad_database_urls_are_one_clear_error(url: str, msg: str) -> None:
    from approvald.store.errors import ConfigError

    with pytest.raises(ConfigError, match=msg):
        Database(url)


async def test_0002_keeps_existing_votes_and_entries_and_lets_a_voter_vote_again(
        tmp_path: Path, pg_url) -> None:
    """Upgrading a database that has votes and audit entries from 0001: nothing is lost,
    old entries are unkeyed, and a vote is now per (approval, actor, digest)."""
    from tests.conftest import _pg_admin

    urls = [f"sqlite+aiosqlite:///{tmp_path / 'old.db'}"]
    if pg_url is not None:
        urls.append(await _fresh_pg(pg_url))
    try:
        for url in urls:
            await _upgrade_with_data(url)
    finally:
        if len(urls) > 1:
            await _pg_admin(f'DROP DATABASE IF EXISTS "{urls[1].rsplit("/", 1)[1]}" WITH (FORCE)')


async def _upgrade_with_data(url: str) -> None:
    from alembic import command

    db = Database(url)
    async with db.connection() as conn:
        def to_0001(sync_conn):  # type: ignore[no-untyped-def]
            cfg = migrate.alembic_config()
            cfg.attributes["connection"] = sync_conn
            command.upgrade(cfg, "0001")
        await conn.run_sync(to_0001)
        now = "2026-06-01 09:00:00"
        for sql in (
            "INSERT INTO runs (id, agent, status, step, next_seq, task, requested_by, "
            "instructions_version, cancel_requested, created_at, updated_at) VALUES ('r1', "
            f"'demo-refund', 'awaiting_approval', 1, 3, 't', 'U_DANA', 'v', false, '{now}', "
            f"'{now}')",
            "INSERT INTO approvals (id, run_id, call_id, kind, tool, args, digest, status, rung, "
            "approvers, quorum, approve_count, policy, packet, requested_by, token_nonce, "
            "requested_at, expires_at, reminders_sent) VALUES ('a1', 'r1', 'c1', 'tool_call', "
            "'issue_refund', '{}', 'd1', 'pending', 0, '[]', 2, 1, '{}', '{}', 'U_DANA', 'n', "
            f"'{now}', '{now}', 0)",
            "INSERT INTO approval_votes (approval_id, actor, verdict, digest, via, at) VALUES "
            f"('a1', 'U_ALICE', 'approve', 'd1', 'slack', '{now}')",
            "INSERT INTO audit_log (seq, at, action, actor, via, details, prev_hash, hash) "
            f"VALUES (1, '{now}', 'requested', 'agent:x', 'runtime', '{{}}', 'p', 'h')",
        ):
            await conn.execute(text(sql))
        await conn.commit()
    result = await migrate.upgrade(db)
    assert (result.before, result.after) == ("0001", migrate.HEAD)
    async with db.write() as tx:
        [vote] = await tx.approvals.votes("a1")
        assert (vote.actor, vote.digest) == ("U_ALICE", "d1")
        # the same person, other arguments: a vote of its own
        from datetime import UTC, datetime

        at = datetime(2026, 6, 1, 9, 5, tzinfo=UTC)
        assert await tx.approvals.add_vote(approval_id="a1", actor="U_ALICE",
                                           verdict="approve", digest="d2", via="slack", at=at)
        assert not await tx.approvals.add_vote(approval_id="a1", actor="U_ALICE",
                                               verdict="approve", digest="d1", via="slack",
                                               at=at)
        [entry] = await tx.audit.query()
        assert entry.key_id == ""
        run = await tx.runs.get("r1")
        assert run is not None and run.cancel_requested_by is None
    async with db.connection() as conn:
        assert await conn.run_sync(migrate.compare) == []
    await db.close()


async def test_0007_clusters_run_events_on_sqlite_and_keeps_every_event(
        tmp_path: Path) -> None:
    """From 0006 with a transcript: every event is kept, in order, in a table stored by
    its key alone (no separate primary-key index); downgrading gives the rowid table
    back, events included."""
    db = Database(f"sqlite+aiosqlite:///{tmp_path / 'events.db'}")

    async def layout() -> tuple[str, list[str], list[tuple[int, str]]]:
        async with db.connection() as conn:
            sql = (await conn.execute(text(
                "SELECT sql FROM sqlite_master WHERE name = 'run_events'"))).scalar_one()
            indexes = [r[0] for r in await conn.execute(text(  # an index b-tree of its own
                "SELECT name FROM sqlite_master WHERE type = 'index' "
                "AND tbl_name = 'run_events'"))]
            events = [(r[0], r[1]) for r in await conn.execute(text(
                "SELECT seq, body FROM run_events WHERE run_id = 'r1' ORDER BY seq"))]
        return sql, indexes, events

    async with db.connection() as conn:
        await conn.run_sync(_to("0006"))
        await conn.execute(text(
            "INSERT INTO runs (id, agent, status, step, next_seq, task, requested_by, "
            "instructions_version, cancel_requested, created_at, updated_at, failures) "
            "VALUES ('r1', 'demo-refund', 'running', 1, 3, 't', 'U_DANA', 'v', false, "
            "'2026-06-01 09:00:00', '2026-06-01 09:00:00', 0)"))
        for seq in range(3):
            await conn.execute(text(
                "INSERT INTO run_events (run_id, seq, step, v, body) VALUES "
                f"('r1', {seq}, 0, 3, '{{\"n\": {seq}}}')"))
        await conn.commit()
    sql, indexes, events = await layout()
    assert "WITHOUT ROWID" not in sql and indexes  # 0006: a rowid table and its key index
    before = events

    assert (await migrate.upgrade(db)).after == migrate.HEAD
    sql, indexes, events = await layout()
    assert "WITHOUT ROWID" in sql and indexes == []
    assert events == before and len(events) == 3
    async with db.write() as tx:  # the repositories write and read it as before
        assert await tx.events.append("r1", 3, 1, [(3, '{"n": 3}')]) == 4
    async with db.read() as tx:
        assert [(e.seq, e.body) for e in await tx.events.load("r1")][-1] == (3, '{"n": 3}')

    async with db.connection() as conn:
        await conn.run_sync(_to("0006", down=True))
        await conn.commit()
    sql, indexes, events = await layout()
    assert "WITHOUT ROWID" not in sql and indexes and len(events) == 4
    await db.close()


async def test_0008_gives_sqlite_planner_stats_and_keeps_real_ones(tmp_path: Path) -> None:
    """0008 writes the approvals indexes' shape into sqlite_stat1 unless statistics for
    an index are already there (ANALYZE's own are better); downgrading removes only its
    own rows."""
    db = Database(f"sqlite+aiosqlite:///{tmp_path / 'stats.db'}")

    async def stats() -> dict[str, str]:
        async with db.connection() as conn:
            return {r[0]: r[1] for r in await conn.execute(text(
                "SELECT idx, stat FROM sqlite_stat1 WHERE tbl = 'approvals'"))}

    async with db.connection() as conn:
        await conn.run_sync(_to("0007"))
        await conn.execute(text("ANALYZE sqlite_schema"))
        await conn.execute(text("INSERT INTO sqlite_stat1 (tbl, idx, stat) VALUES "
                                "('approvals', 'ix_approvals_status_expires_at', '7 7 1')"))
        await conn.commit()
    assert (await migrate.upgrade(db)).after == migrate.HEAD
    assert await stats() == {"ix_approvals_run_id_call_id": "100000 4 1",
                             "ix_approvals_status_expires_at": "7 7 1",  # kept
                             "ix_approvals_status_next_reminder_at": "100000 20000 2"}
    async with db.connection() as conn:
        await conn.run_sync(_to("0007", down=True))
        await conn.commit()
    assert await stats() == {"ix_approvals_status_expires_at": "7 7 1"}
    await db.close()


def _to(revision: str, *, down: bool = False):  # type: ignore[no-untyped-def]
    """For ``conn.run_sync``: migrate the connection's database up or down to ``revision``."""
    from alembic import command

    def go(sync_conn):  # type: ignore[no-untyped-def]
        cfg = migrate.alembic_config()
        cfg.attributes["connection"] = sync_conn
        (command.downgrade if down else command.upgrade)(cfg, revision)
    return go


async def test_0015_seals_a_paused_adapters_calls_kept_in_clear_and_opens_them_back(
        tmp_path: Path, pg_url) -> None:
    """From 0014, with a data key: the calls a paused adapter kept in clear are sealed
    (read back the same through the store), and a downgrade opens them back for the
    older schema, which reads the column as plain text."""
    from tests.conftest import _pg_admin

    urls = [f"sqlite+aiosqlite:///{tmp_path / 'pauses.db'}"]
    if pg_url is not None:
        urls.append(await _fresh_pg(pg_url))
    try:
        for url in urls:
            await _seal_pauses(url)
    finally:
        if len(urls) > 1:
            await _pg_admin(f'DROP DATABASE IF EXISTS "{urls[1].rsplit("/", 1)[1]}" WITH (FORCE)')


async def _seal_pauses(url: str) -> None:
    from alembic import command
    from approvald.runtime.record import sealing
    from approvald.store import types

    calls = '{"task":"Refund A-1","calls":[{"call_id":"c1","tool":"refund","args":{"card":"4242 4242 4242 4242"}}]}'  # noqa: E501

    def to(revision: str, *, down: bool = False):  # type: ignore[no-untyped-def]
        def go(sync_conn):  # type: ignore[no-untyped-def]
            cfg = migrate.alembic_config()
            cfg.attributes["connection"] = sync_conn
            (command.downgrade if down else command.upgrade)(cfg, revision)
        return go

    async def raw() -> str:
        async with db.connection() as conn:
            return str((await conn.execute(text(
                "SELECT requests FROM adapter_pauses WHERE id = 'p1'"))).scalar_one())

    db = Database(url)
    try:
        async with db.connection() as conn:
            await conn.run_sync(to("0014"))
            await conn.execute(text(
                "INSERT INTO adapter_pauses (id, framework, key, requested_by, state, "
                "requests, status, created_at) VALUES ('p1', 'langgraph', 'k1', 'U_DANA', "
                "'{}', :calls, 'paused', '2026-06-01 09:00:00')"), {"calls": calls})
            await conn.commit()
        types.set_codec(sealing.Sealer([sealing.DataKey("data-key-one-0123456789abcdef")]))
        await migrate.upgrade(db)
        stored = await raw()
        assert sealing.is_sealed(stored) and "4242" not in stored
        async with db.read() as tx:
            rec = await tx.adapters.get("p1")
        assert rec is not None and rec.requests == calls
        async with db.connection() as conn:
            await conn.run_sync(to("0014", down=True))
            await conn.commit()
        assert await raw() == calls
    finally:
        types.set_codec(None)
        await db.close()
