"""Composition: settings -> database, agents, policy, engine. The only place they meet."""

from __future__ import annotations

import sys
from datetime import timedelta

from bot.config import Settings
from runtime.agent import Registry
from runtime.audit import AuditKey
from runtime.clock import FileClock, SystemClock
from runtime.demo import demo_agents
from runtime.engine import Engine, EngineConfig
from runtime.ids import TokenSigner
from runtime.policy import PolicyFile, load_policy_file
from store import migrate
from store.db import Database


def build_registry(settings: Settings) -> Registry:
    policy = load_policy_file(settings.policy_file) if settings.policy_file else PolicyFile()
    registry = Registry(demo_agents(settings.demo_ledger), policy=policy)
    if settings.agents:
        registry.load_modules(settings.agents)
    registry.check_policy()
    return registry


def build_engine(settings: Settings, db: Database, *, require_tokens: bool = False) -> Engine:
    secret = settings.token_secret()
    return Engine(
        db, build_registry(settings),
        clock=FileClock(settings.clock_file) if settings.clock_file else SystemClock(),
        config=EngineConfig(lease_ttl=timedelta(seconds=settings.lease_ttl),
                            max_payload_bytes=settings.max_payload),
        # a secret too short to key tokens leaves the engine without one; the Slack face
        # refuses to start without it, while CLI-only use never needs one
        signer=TokenSigner(secret) if secret and len(secret.encode()) >= 16 else None,
        require_tokens=require_tokens,
        audit_key=AuditKey(settings.audit_key.get_secret_value()) if settings.audit_key else None,
    )


async def open_database(settings: Settings, *, quiet: bool = False) -> Database:
    """Open the database and bring its schema up to date, saying so when it changes."""
    db = Database(settings.database_url)
    try:
        result = await migrate.upgrade(db)
    except Exception:
        await db.close()
        raise
    if result.changed and not quiet:
        before = result.before or "empty"
        print(f"approvald: database {db.display_url} upgraded from {before} to schema "
              f"{result.after}", file=sys.stderr)
    return db
