"""Alembic environment: runs on a connection handed in by :mod:`store.migrate`."""

from __future__ import annotations

from alembic import context
from approvald.store.models import Base

target_metadata = Base.metadata


def run_migrations_online() -> None:
    connection = context.config.attributes.get("connection")
    if connection is None:
        raise RuntimeError("run migrations through `approvald db upgrade` (store.migrate)")
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    raise RuntimeError("offline SQL generation is not supported")
run_migrations_online()
