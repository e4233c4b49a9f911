"""Sealing by schema (issue 46 item 4): every text column of the schema is registered in
``store/caller_data.py`` as sealed (it holds what callers send), masked, or clear with the
reason; a column added without being registered fails here, and so does one registered as
sealed that is not sealed."""

from __future__ import annotations

import pytest
from approvald.store import caller_data
from approvald.store.models import Base
from approvald.store.types import SealedText
from sqlalchemy import JSON, Column, LargeBinary, MetaData, String, Table, Text


def text_columns(metadata: MetaData) -> dict[str, Column[object]]:
    """Every column that can hold free text: Text, JSON, binary, or a String longer than
    an identifier (``caller_data.SHORT``)."""
    found: dict[str, Column[object]] = {}
    for table in metadata.sorted_tables:
        for col in table.columns:
            kind = col.type
            wide = isinstance(kind, String) and (kind.length is None
                                                 or kind.length > caller_data.SHORT)
            if wide or isinstance(kind, JSON | LargeBinary | SealedText):
                found[f"{table.name}.{col.name}"] = col
    return found


def unregistered(metadata: MetaData) -> list[str]:
    """What is wrong with ``metadata`` as the registry sees it (empty: nothing)."""
    problems = []
    for name, col in text_columns(metadata).items():
        try:
            kind = caller_data.holds(name)
        except LookupError as exc:
            problems.append(str(exc))
            continue
        if kind in ("sealed", "masked") and not isinstance(col.type, SealedText):
            problems.append(f"{name} is registered as {kind} but is not SealedText")
        if kind == "sealed" and isinstance(col.type, SealedText) and not col.type.sealed:
            problems.append(f"{name} is registered as sealed but written in clear")
    return problems


def test_every_text_column_is_registered_as_sealed_masked_or_clear() -> None:
    assert unregistered(Base.metadata) == []
    columns = text_columns(Base.metadata)
    registered = {*caller_data.SEALED, *caller_data.MASKED, *caller_data.CLEAR}
    assert registered - set(columns) == set(), "registered columns no longer in the schema"
    assert all(caller_data.CLEAR.values()) and all(caller_data.SEALED.values())


def test_a_new_column_holding_caller_data_fails_until_it_is_registered() -> None:
    """The check the schema passes is not vacuous: a table a later change adds, with a
    column for a call's arguments in clear (the mistake of adapter_pauses.requests),
    fails it, naming the column."""
    metadata = MetaData()
    for table in Base.metadata.sorted_tables:
        table.to_metadata(metadata)
    Table("webhook_retries", metadata, Column("id", String(32), primary_key=True),
          Column("arguments", Text), Column("note", String(2000)))
    problems = unregistered(metadata)
    assert len(problems) == 2, problems
    assert "webhook_retries.arguments is not registered" in problems[0]
    assert "webhook_retries.note is not registered" in problems[1]


def test_a_sealed_column_must_be_registered_and_a_clear_one_is_not_sealed() -> None:
    with pytest.raises(LookupError, match=r"not registered in store/caller_data\.py"):
        SealedText("webhook_retries.arguments")
    with pytest.raises(LookupError, match="plain Text, not SealedText"):
        SealedText("approvals.policy")
    assert SealedText("adapter_pauses.requests").sealed
    assert not SealedText("audit_log.details").sealed
