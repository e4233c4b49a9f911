"""One outbox contract (issue 47): the kinds, their typed payloads and the mail-thread
helpers live in ``runtime/record/outbox_kinds.py``; every row is written through it; each row goes
to the face that declared its kind, and a build in which a kind has no face is refused."""

from __future__ import annotations

import ast
import json
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from approvald.runtime.kernel.errors import ConfigError
from approvald.runtime.record import outbox_kinds
from approvald.runtime.record.outbox_kinds import (
    CARD_POST,
    DEAD_REPORT,
    KINDS,
    MAIL_KINDS,
    PAYLOADS,
    WEBHOOK,
    CardPost,
    DeadReport,
    EditMail,
    Notice,
    RequestMail,
    Routes,
    Undeliverable,
    payload_of,
)
from approvald.store.records import OutboxRecord

ROOT = Path(__file__).resolve().parents[2]
NOW = datetime(2026, 1, 1, tzinfo=UTC)


def row(kind: str, payload: str) -> OutboxRecord:
    return OutboxRecord(id=7, kind=kind, group_key="g", payload=payload, status="pending",
                        attempts=0, not_before=NOW, claimed_by=None, claimed_until=None,
                        created_at=NOW, delivered_at=None, last_error=None, result=None,
                        give_up_at=None, waits=0)


def test_every_kind_has_one_payload_and_the_kinds_are_the_fourteen_known() -> None:
    # thirteen delivered by the faces, and the runtime's own: a request's follow-up
    assert len(KINDS) == 14 and set(PAYLOADS) == KINDS
    assert outbox_kinds.RUNTIME_KINDS == {outbox_kinds.REQUEST_DECIDED} < KINDS
    assert MAIL_KINDS <= KINDS and all(k.startswith("mail.") for k in MAIL_KINDS)


def test_the_kinds_are_named_only_in_the_contract() -> None:
    """No module of bot/ or runtime/ spells a kind as a string or adds a row itself: each
    goes through a payload of runtime/record/outbox_kinds.py and its ``queue``."""
    found = []
    for part in ("bot", "runtime"):
        for path in sorted((ROOT / part).rglob("*.py")):
            if path == ROOT / "runtime" / "record" / "outbox_kinds.py":
                continue
            tree = ast.parse(path.read_text(), str(path))
            for node in ast.walk(tree):
                if isinstance(node, ast.Constant) and node.value in KINDS:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} spells {node.value}")
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                        and node.func.attr in ("add", "add_many") \
                        and ast.unparse(node.func.value).endswith("outbox"):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} adds a row itself")
    assert found == []


@pytest.mark.parametrize("payload,stored", [
    (CardPost("a1"), {"approval_id": "a1"}),
    (RequestMail("a1"), {"approval_id": "a1"}),
    (RequestMail("a1", fallback=True), {"approval_id": "a1", "fallback": True}),
    (Notice(run_id="r", call_id="c", args={"x": 1}, seq=3, sensitive=["x"]),
     {"run_id": "r", "call_id": "c", "args": {"x": 1}, "seq": 3, "sensitive": ["x"]}),
    (DeadReport(outbox_id=4, dead_kind=CARD_POST, attempts=2, waits=0, error="e",
                approval_id="a1"),
     {"outbox_id": 4, "kind": CARD_POST, "attempts": 2, "waits": 0, "error": "e",
      "approval_id": "a1"}),
])
def test_a_payload_is_stored_as_before_and_read_back_typed(payload: Any,
                                                           stored: dict[str, Any]) -> None:
    text = payload.encode()
    assert json.loads(text) == stored
    assert list(json.loads(text)) == list(stored)  # the keys in the order rows had
    assert payload_of(row(payload.kind, text)) == payload


def test_a_payload_written_by_a_later_version_reads_without_its_new_keys() -> None:
    edit = EditMail(approval_id="a", by="U1", via="slack", at=NOW.isoformat(), mode="direct",
                    previous_digest="d0", digest="d1", changes=[["x", "1", "2"]], more=0,
                    discarded=[])
    later = json.dumps({**json.loads(edit.encode()), "new_field": 1})
    assert payload_of(row(edit.kind, later)) == edit


class Face:
    def __init__(self, *kinds: str) -> None:
        self.kinds = frozenset(kinds)
        self.rows: list[int] = []

    async def deliver(self, r: OutboxRecord) -> dict[str, Any] | None:
        self.rows.append(r.id)
        return {"by": sorted(self.kinds)}


async def test_rows_go_to_the_face_that_declared_their_kind() -> None:
    mail, rest = Face(*MAIL_KINDS), Face(*(KINDS - MAIL_KINDS))
    routes = Routes([rest, mail])
    routes.check()
    assert routes.route("mail.request") is mail and routes.route(WEBHOOK) is rest
    await routes.deliver(row("mail.request", "{}"))
    assert (mail.rows, rest.rows) == ([7], [])
    with pytest.raises(Undeliverable, match=re.escape("no face delivers outbox kind 'x.later'")):
        await routes.deliver(row("x.later", "{}"))


def test_a_kind_no_face_delivers_is_refused_in_one_line(monkeypatch: pytest.MonkeyPatch
                                                        ) -> None:
    routes = Routes([Face(*(KINDS - {DEAD_REPORT}))])
    with pytest.raises(ConfigError) as refused:
        routes.check()
    assert str(refused.value).splitlines() == [
        "outbox kind delivery.dead: no face delivers it; declare it in a deliverer's kinds "
        "(runtime/record/outbox_kinds.py)"]
    monkeypatch.setattr(outbox_kinds, "KINDS", KINDS | {"x.new"})
    with pytest.raises(ConfigError, match=re.escape("outbox kinds delivery.dead, x.new: no face")):
        routes.check()


def test_two_faces_declaring_one_kind_is_refused() -> None:
    both = re.escape("outbox kind api.webhook is delivered by both")
    with pytest.raises(ConfigError, match=both):
        Routes([Face(WEBHOOK), Face(WEBHOOK, CARD_POST)])
