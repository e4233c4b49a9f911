"""From the settings to what :func:`approvald.runtime.engine.assemble` is built from: the
database (its schema brought up to date), the agents and the policy file, the clock, the
token signer and the audit key. Every command and ``serve`` build their engine here."""

from __future__ import annotations

import contextlib
import os
import sys
from datetime import timedelta
from pathlib import Path

from approvald.bot.config import Settings, default_database_path
from approvald.runtime import (
    AuditKey,
    Clock,
    ConfigError,
    Directory,
    Engine,
    EngineConfig,
    FileClock,
    Meter,
    PolicyFile,
    Registry,
    SystemClock,
    TokenSigner,
    Tracer,
    assemble,
    binding,
    demo_agents,
    failpoints,
    load_policy_file,
    sensitive,
)
from approvald.store import migrate, types
from approvald.store.db import Database
from sqlalchemy.exc import DBAPIError


def build_registry(settings: Settings) -> Registry:
    max_ttl = settings.max_ttl_value()
    if settings.policy_file:
        policy = load_policy_file(settings.policy_file, max_ttl=max_ttl)
    else:
        policy = PolicyFile()
        policy.max_ttl = max_ttl
    registry = Registry(demo_agents(settings.demo_ledger), policy=policy)
    if settings.agents:
        # `python -m` semantics: modules in the current directory are importable, so
        # APPROVALD_AGENTS=myagents finds ./myagents.py (and what it imports beside it)
        with contextlib.suppress(OSError):  # a directory since deleted adds nothing
            cwd = os.getcwd()
            if cwd not in sys.path:
                sys.path.insert(0, cwd)
        registry.load_modules(settings.agents)
    registry.check_policy()
    return registry


def build_engine(settings: Settings, db: Database, *, require_tokens: bool = False,
                 clock: Clock | None = None, meter: Meter | None = None,
                 tracer: Tracer | None = None, directory: Directory | None = None) -> Engine:
    """The engine of the settings (``serve`` passes its own clock, meter, tracer and Slack
    directory; the CLI takes the defaults)."""
    secret = settings.token_secret()
    # what is masked is the deployment's, for every face and log line of this process
    sensitive.configure(settings.detectors())
    sealer = settings.sealer()  # and what is sealed at rest, under which keys
    if meter is not None:
        sealer.on_refused = lambda _: meter.data_key_refused()
    types.set_codec(sealer)
    return assemble(
        db, build_registry(settings),
        clock=clock or (FileClock(settings.clock_file) if settings.clock_file
                        else SystemClock()),
        meter=meter, tracer=tracer, directory=directory,
        config=EngineConfig(lease_ttl=timedelta(seconds=settings.lease_ttl),
                            max_payload_bytes=settings.max_payload,
                            operators=settings.operator_ids(),
                            audit_old_keys=tuple(
                                settings.audit_keys()[1 if settings.audit_key else 0:]),
                            audit_unkeyed_until=settings.audit_unkeyed_until),
        # a secret too short to key tokens leaves the engine without one; the Slack face
        # refuses to start without it, while CLI-only use never needs one
        signer=TokenSigner(secret) if secret and len(secret.encode()) >= 16 else None,
        require_tokens=require_tokens,
        audit_key=AuditKey(settings.audit_key.get_secret_value()) if settings.audit_key else None,
    )


def reload_keys(engine: Engine) -> str:
    """Read the data and audit keys again from where this process's settings came from
    (the environment, which never changes for a running process, and the files of
    ``APPROVALD_SECRETS_DIR``, which may) and use them from now on: the current data key
    seals, the retired ones open, the audit key chains. Returns what is in force, in a
    line; :class:`ConfigError` (nothing changed) for keys that cannot be used."""
    from approvald.bot.config import load_settings
    from approvald.runtime import Sealer

    fresh = load_settings()
    sealer = types.codec()
    if not isinstance(sealer, Sealer) or sealer.reread is None:
        raise ConfigError("the keys of this process were not read from the environment: "
                          "there is nowhere to read them again")
    audit_key = (AuditKey(fresh.audit_key.get_secret_value()) if fresh.audit_key
                 else None)
    if audit_key is None and engine.audit_key_id is not None:
        raise ConfigError(f"APPROVALD_AUDIT_KEY is not set any more: keeping audit key "
                          f"{engine.audit_key_id}")
    sealer.rekey(fresh.data_keys())  # (refuses an empty ring, changing nothing)
    engine.use_audit_key(audit_key)
    fixed = [v for v in ("APPROVALD_DATA_KEY", "APPROVALD_DATA_OLD_KEYS",
                         "APPROVALD_AUDIT_KEY") if v in os.environ]
    note = (f" ({', '.join(fixed)} set in the environment, which a running process cannot "
            "read again: restart it to change them)") if fixed else ""
    audit = f"audit key {audit_key.id}" if audit_key else "no audit key"
    return f"keys read again: {sealer.describe()}; {audit}{note}"


def check_environment(settings: Settings) -> None:
    """Refuse malformed testing hooks before anything starts (:class:`ConfigError`): an
    unreadable clock file would otherwise fail a run in the middle of a step, and a
    misspelt failpoint would let a crash test pass without crashing."""
    failpoints.check()
    if settings.clock_file:
        FileClock(settings.clock_file).now()


async def open_database(settings: Settings, *, quiet: bool = False) -> Database:
    """Open the database and bring its schema up to date, saying so when it changes.

    A database that cannot be reached or opened (a server that does not answer, a
    database or a directory that does not exist) is a :class:`ConfigError` naming
    ``APPROVALD_DATABASE_URL``. The default SQLite file's directory is created; a SQLite
    file being created is announced with its absolute path.
    """
    types.set_codec(settings.sealer())  # sensitive columns are sealed from the first write
    db = Database(settings.database_url, connections=settings.db_connections,
                  fast_path=settings.db_fast_path)
    try:
        created = _sqlite_file_to_create(db)
        await _reach(db)
        result = await migrate.upgrade(db)
        # what binds a decision to arguments outside the database is keyed with the
        # deployment's binding key, read (or made) once here for every face of the process
        binding.configure(await binding.deployment_key(db, now=SystemClock().now()))
    except Exception:
        await db.close()
        raise
    if quiet:
        return db
    if created is not None:
        print(f"approvald: created database {created} (schema {result.after}); set "
              "APPROVALD_DATABASE_URL to use another", file=sys.stderr)
    elif result.changed:
        before = result.before or "empty"
        print(f"approvald: database {db.display_url} upgraded from {before} to schema "
              f"{result.after}", file=sys.stderr)
    return db


def _sqlite_file_to_create(db: Database) -> Path | None:
    """The SQLite file this open will create (None: it exists, or not SQLite). The
    default file's directory is made; a directory named in the URL must exist."""
    if db.dialect != "sqlite" or not db.url.database:
        return None
    path = Path(db.url.database)
    if path.exists():
        return None
    if path == default_database_path():
        path.parent.mkdir(parents=True, exist_ok=True)
    elif not path.parent.is_dir():
        raise ConfigError(f"APPROVALD_DATABASE_URL: directory {path.parent} does not exist "
                          f"(for the SQLite file {path})")
    return path


async def _reach(db: Database) -> None:
    """Connect once, so an unreachable or missing database is one clear line."""
    try:
        await db.reach()
    except (OSError, TimeoutError, DBAPIError) as exc:
        cause = exc.orig if isinstance(exc, DBAPIError) else exc
        why = (str(cause).strip().splitlines() or [type(cause).__name__])[0]
        raise ConfigError(f"APPROVALD_DATABASE_URL: cannot open {db.display_url}: "
                          f"{why}") from None
