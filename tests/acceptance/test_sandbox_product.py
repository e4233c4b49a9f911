"""``approvald sandbox`` as a user runs it: one process, the page's routes, restarts.

Stopped with SIGTERM or killed with SIGKILL while a card waits, the sandbox started again
on the same database still shows the card, and a click on it completes the run.
"""

from __future__ import annotations

import re
import signal
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.acceptance.sandbox_proc import Sandbox, wait_until

# each test here starts approvald (or a browser) as a process of its own
pytestmark = pytest.mark.slow

APPROVE = "approvald.approve"
_MESSAGE = re.compile(r'<div class="msg[^"]*" data-ts="([\d.]+)"')


def messages(html: str) -> list[tuple[str, str]]:
    """(ts, html) of each message in a drawn pane."""
    starts = [(m.start(), m.group(1)) for m in _MESSAGE.finditer(html)]
    ends = [s for s, _ in starts[1:]] + ([len(html)] if starts else [])
    return [(ts, html[start:end]) for (start, ts), end in zip(starts, ends, strict=True)]


def pending_card(sb: Sandbox, user: str = "U_DANA") -> str | None:
    """The ts of the (one) card that still has an Approve button, as ``user`` sees it."""
    found = [ts for ts, html in messages(sb.state(user)["main"]) if APPROVE in html]
    assert len(found) <= 1, found
    return found[0] if found else None


def refunds(sb: Sandbox) -> list[dict]:
    return [e for e in sb.ledger_lines() if e["tool"] == "issue_refund"]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_a_card_waiting_across_a_restart_is_still_clickable_and_completes_the_run(
        tmp_path: Path, sig: int) -> None:
    sb = Sandbox(tmp_path)
    try:
        sb.start()
        status, started = sb.post("runs", {"user": "U_DANA", "agent": "demo-refund",
                                           "order": "A-7", "amount": "12.50"})
        assert status == 200, started
        assert started["task"].startswith("Refund order A-7 for $12.50")
        ts = wait_until(lambda: pending_card(sb), within=60, what="the card")
        assert sb.stop(sig) == (0 if sig == signal.SIGTERM else -signal.SIGKILL)

        sb.start()
        assert pending_card(sb) == ts  # the same card, still waiting, buttons and all
        status, answer = sb.post("action", {"user": "U_ALICE", "channel": "C_APPROVALS",
                                            "ts": ts, "action_id": APPROVE})
        assert (status, answer.get("status")) == (200, 200), answer
        [refund] = wait_until(lambda: refunds(sb), within=60, what="the approved refund")
        assert refund["args"] == {"order_id": "A-7", "amount_cents": 1250,
                                  "reason": "duplicate charge"}

        def approved_card() -> bool:
            html = dict(messages(sb.state("U_DANA")["main"]))[ts]
            return "Approved" in html and APPROVE not in html
        wait_until(approved_card, within=60, what="the card to say Approved")
        assert len(refunds(sb)) == 1
        assert sb.stop(signal.SIGTERM) == 0
    finally:
        sb.close()


def test_page_routes_refuse_bad_input_and_change_nothing(tmp_path: Path) -> None:
    sb = Sandbox(tmp_path)
    try:
        sb.start()
        # serve's start posts the audit log's head to the audit channel (a change to the
        # workspace, which moves the page's version): taken as settled once it is there
        wait_until(lambda: "Audit log head" in sb.state("U_DANA", pane="C_AUDIT")["main"],
                   within=60, what="the audit head's post")
        before = sb.state("U_DANA")
        bad = [
            ("runs", {"user": "U_NOBODY", "agent": "demo-refund", "order": "A-1"}, 400),
            ("runs", {"user": "<script>", "agent": "demo-refund", "order": "A-1"}, 400),
            ("runs", {"user": "U_DANA", "agent": "rm -rf", "order": "A-1"}, 400),
            ("runs", {"user": "U_DANA", "agent": "demo-refund", "order": "A-1; drop"}, 400),
            ("runs", {"user": "U_DANA", "agent": "demo-refund", "order": "A-1",
                      "amount": "-5"}, 400),
            ("runs", {"user": "U_DANA", "agent": "demo-steps", "ticks": "1000000"}, 400),
            ("runs", b"not json", 400),
            ("runs", b"[1, 2]", 400),
            ("runs", b"{" + b" " * 70_000 + b"}", 413),
            ("action", {"user": "U_ALICE", "channel": "C_APPROVALS", "ts": "1.000001",
                        "action_id": APPROVE}, 400),
            ("action", {"user": "U_ALICE", "channel": "C_NOPE", "ts": "1.000001",
                        "action_id": APPROVE}, 400),
            ("submit", {"user": "U_ALICE", "view_id": "V00000001",
                        "values": {"reason": {"reason_input": "x"}}}, 400),
            ("close", {"user": "U_ALICE", "view_id": "V00000001"}, 400),
            ("command", {"user": "U_ALICE", "channel": "C_APPROVALS", "text": "/kick"}, 400),
            ("home", {"user": "U_BOT"}, 400),
        ]
        for path, body, code in bad:
            status, answer = sb.post(path, body)
            assert status == code, (path, body, answer)
            assert answer["ok"] is False and answer["error"], answer
        after = sb.state("U_DANA")
        assert after["version"] == before["version"] and after["main"] == before["main"]
        assert sb.ledger_lines() == []
        assert sb.stop() == 0
    finally:
        sb.close()


def test_the_app_home_lists_what_a_user_may_decide_and_its_buttons_work(tmp_path: Path) -> None:
    sb = Sandbox(tmp_path)
    try:
        sb.start()
        status, _ = sb.post("runs", {"user": "U_DANA", "agent": "demo-refund", "order": "B-5"})
        assert status == 200
        wait_until(lambda: pending_card(sb), within=60, what="the card")

        def home(user: str) -> str | None:
            assert sb.post("home", {"user": user})[0] == 200
            drawn: str = sb.state(user, pane="home")["main"]
            return drawn if "data-view-id" in drawn else None
        alice = wait_until(lambda: home("U_ALICE"), within=30, what="Alice's App Home")
        assert APPROVE in alice and '"order_id":"B-5"' in alice.replace("&quot;", '"')
        eve = wait_until(lambda: home("U_EVE"), within=30, what="Eve's App Home")
        assert APPROVE not in eve  # nothing Eve may decide
        view_id = re.search(r'class="home" data-view-id="(\w+)"', alice)
        assert view_id
        status, answer = sb.post("action", {"user": "U_ALICE", "view_id": view_id.group(1),
                                            "action_id": APPROVE})
        assert (status, answer.get("status")) == (200, 200), answer
        # Eve may not press buttons on Alice's Home
        assert sb.post("action", {"user": "U_EVE", "view_id": view_id.group(1),
                                  "action_id": APPROVE})[0] == 400
        [refund] = wait_until(lambda: refunds(sb), within=60, what="the approved refund")
        assert refund["args"]["order_id"] == "B-5" and refund["args"]["amount_cents"] == 4200
        assert sb.stop() == 0
    finally:
        sb.close()


def test_a_first_start_on_a_fresh_machine_makes_the_default_database_and_workspace(
        tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    sb = Sandbox(tmp_path, home=home)
    try:
        sb.start()  # the README's first command: nothing configured, no data directory yet
        assert sb.db.exists() and sb.db.with_name("approvald.db.sandbox.json").exists()
        assert f"open {sb.url}" in sb.output() and str(sb.db) in sb.output()
        assert sb.stop() == 0
    finally:
        sb.close()


def test_a_workspace_whose_database_was_deleted_starts_afresh(tmp_path: Path) -> None:
    sb = Sandbox(tmp_path)
    try:
        sb.start()
        assert sb.post("runs", {"user": "U_DANA", "agent": "demo-refund", "order": "C-1"})[0] \
            == 200
        wait_until(lambda: pending_card(sb), within=60, what="the card")
        assert sb.stop() == 0
        for leftover in tmp_path.glob("sandbox.db*"):
            if not leftover.name.endswith(".sandbox.json"):
                leftover.unlink()  # "start over": the database goes, the workspace file stays
        sb.start()
        assert pending_card(sb) is None  # no card nothing could decide any more
        assert "starting with a fresh workspace" in sb.output()
        assert sb.stop() == 0
    finally:
        sb.close()


def test_the_page_hears_of_every_change_and_demo_steps_ticks_as_asked(tmp_path: Path) -> None:
    sb = Sandbox(tmp_path)
    try:
        sb.start()
        events = urllib.request.Request(f"{sb.url}ui/events", headers=sb.headers())
        with urllib.request.urlopen(events, timeout=30) as stream:
            assert stream.headers["Content-Type"] == "text/event-stream"
            first = _event(stream)
            status, started = sb.post("runs", {"user": "U_CAROL", "agent": "demo-steps",
                                               "ticks": "3"})
            assert status == 200 and started["task"] == "3"
            assert _event(stream) > first  # the run's thread was posted: the page redraws
        ticks = wait_until(lambda: [e for e in sb.ledger_lines() if e["tool"] == "tick"]
                           if len(sb.ledger_lines()) >= 3 else None,
                           within=60, what="three ticks")
        assert [e["args"]["i"] for e in ticks] == [0, 1, 2]
        assert sb.stop() == 0
    finally:
        sb.close()


def _event(stream: Any, within: float = 60.0) -> int:
    """The version in the stream's next ``data:`` line (comments are heartbeats, every
    15 s, so each read returns within the 30 s socket timeout)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        line = stream.readline().decode()
        assert line, "the event stream ended"
        if line.startswith("data: "):
            return int(line.removeprefix("data: "))
    raise AssertionError(f"no change announced within {within:g} s")
