"""``serve`` hands each outbox row to the face that declared its kind, and refuses to
start, in one line, while a kind has no face to deliver it (issue 47)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from approvald.bot.cli import main
from approvald.runtime.record import outbox_kinds

from tests.helpers import Cli
from tests.integration.slack_harness import harness


def test_serve_refuses_to_start_while_a_kind_has_no_face(
        cli: Cli, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # a kind added to the contract that no face declares (the mistake this guards against)
    monkeypatch.setattr(outbox_kinds, "KINDS", outbox_kinds.KINDS | {"x.unrouted"})
    for name in [n for n in os.environ if n.startswith(("APPROVALD_", "SLACK_"))]:
        monkeypatch.delenv(name)
    for name, value in cli.env().items():
        monkeypatch.setenv(name, value)
    before = cli.ok("outbox", "list", "--json")
    assert main(["serve"]) == 2
    lines = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
    assert lines == ["approvald: outbox kind x.unrouted: no face delivers it; declare it in "
                     "a deliverer's kinds (runtime/record/outbox_kinds.py)"]
    assert cli.ok("outbox", "list", "--json") == before


async def test_each_kind_goes_to_the_face_that_declared_it(sqlite_url: str,
                                                           tmp_path: Path) -> None:
    async with harness(sqlite_url, tmp_path) as h:
        service = h.service
        assert service.slack is not None
        routes = service.routes
        assert routes.missing() == []
        # the runtime's own rows go to the runtime, in the drain: no face declares them
        assert service.drain.own is not None
        assert service.drain.own.kinds == outbox_kinds.RUNTIME_KINDS
        assert {k for k in outbox_kinds.KINDS - outbox_kinds.RUNTIME_KINDS
                if routes.route(k) is service.slack.deliverer} == {
            outbox_kinds.CARD_POST, outbox_kinds.CARD_UPDATE, outbox_kinds.REMINDER,
            outbox_kinds.NOTICE, outbox_kinds.RUN_WAITING, outbox_kinds.HEAD_POST,
            outbox_kinds.DEAD_REPORT}
        assert routes.route(outbox_kinds.WEBHOOK) is service.api.webhooks
        mail = {type(routes.route(k)).__name__ for k in outbox_kinds.MAIL_KINDS}
        assert mail == {"MailDeliverer" if service.web is not None else "NoMail"}
        assert service.drain.deliverer is routes
