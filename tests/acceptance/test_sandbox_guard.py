"""Only the sandbox's own page drives it (issue 36, defect 5: "One way in").

Another web page open in the approver's browser must not start a run (a cross-origin
``text/plain`` POST needs no preflight), and a DNS name rebound to 127.0.0.1
(``Host: evil.example:PORT``) must neither read the cards nor decide one. Every request
here is raw HTTP against a real ``approvald sandbox`` process, headers exactly as such a
page would make the browser send them; each refusal is a 4xx JSON error that changes
nothing, and the page's own requests still work afterwards.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest

from tests.acceptance.sandbox_proc import TOKEN_HEADER, Sandbox, wait_until
from tests.acceptance.test_sandbox_product import APPROVE, pending_card, refunds

# each test here starts approvald (or a browser) as a process of its own
pytestmark = pytest.mark.slow

RUN = json.dumps({"user": "U_DANA", "agent": "demo-refund", "order": "A-1"}).encode()
RUNS = "select count(*) from runs"
DECIDED = "select count(*) from approvals where status != 'pending'"
VOTES = "select count(*) from approval_votes"


def refused(status: int, text: str) -> str:
    """The refusal's error message, after checking it is a 4xx JSON error."""
    assert 400 <= status < 500, (status, text)
    answer = json.loads(text)
    assert answer["ok"] is False and answer["error"], answer
    return str(answer["error"])


def test_another_origins_post_starts_no_run(tmp_path: Path) -> None:
    sb = Sandbox(tmp_path)
    try:
        sb.start()
        own = f"127.0.0.1:{sb.port}"
        # serve's start posts the audit log's head to the audit channel (a change to the
        # workspace, which moves the page's version): taken as settled once it is there,
        # as test_sandbox_product does (read before it, the version moved under the test)
        wait_until(lambda: "Audit log head" in sb.state("U_DANA", pane="C_AUDIT")["main"],
                   within=60, what="the audit head's post")
        before = sb.state("U_DANA")["version"]
        # what a form or a fetch on another site sends: a "simple" request, no preflight
        error = refused(*sb.raw("POST", "/ui/runs", {
            "Host": own, "Origin": "http://evil.example",
            "Content-Type": "text/plain;charset=UTF-8"}, RUN))
        assert "Origin" in error
        token = sb.token
        assert token, "the page carries no token"
        # each rule on its own, the others met
        json_ = {"Host": own, "Content-Type": "application/json", TOKEN_HEADER: token}
        for headers, code, says in [
            ({**json_, "Origin": "http://evil.example"}, 403, "Origin"),
            ({**json_, "Origin": "null"}, 403, "Origin"),
            ({**json_, "Origin": f"http://localhost:{sb.port + 1}"}, 403, "Origin"),
            ({**json_, "Referer": "http://evil.example/page.html"}, 403, "Referer"),
            ({**json_, "Content-Type": "text/plain"}, 415, "application/json"),
            ({**json_, "Content-Type": "application/x-www-form-urlencoded"}, 415,
             "application/json"),
            ({**json_, "Content-Type": "multipart/form-data; boundary=x"}, 415,
             "application/json"),
        ]:
            status, text = sb.raw("POST", "/ui/runs", headers, RUN)
            assert status == code, (headers, status, text)
            assert says in refused(status, text), (headers, text)
        assert sb.count(RUNS) == 0
        assert sb.state("U_DANA")["version"] == before
        # the page itself, from its own origin, still starts one
        status, text = sb.raw("POST", "/ui/runs", {
            **json_, "Origin": f"http://{own}", "Referer": f"http://{own}/?user=U_DANA"}, RUN)
        assert status == 200, text
        assert sb.count(RUNS) == 1
        assert sb.stop() == 0
    finally:
        sb.close()


def test_a_rebound_dns_name_reads_no_card_and_decides_nothing(tmp_path: Path) -> None:
    sb = Sandbox(tmp_path)
    try:
        sb.start()
        assert sb.post("runs", {"user": "U_DANA", "agent": "demo-refund",
                                "order": "A-1"})[0] == 200
        ts = wait_until(lambda: pending_card(sb), within=60, what="the card")
        evil = f"evil.example:{sb.port}"
        leaks = ("issue_refund", "A-1", APPROVE)
        click = json.dumps({"user": "U_ALICE", "channel": "C_APPROVALS", "ts": ts,
                            "action_id": APPROVE}).encode()
        # without the token first (the rebound page never gets it), then even with it
        for headers in ({"Host": evil}, {"Host": evil, TOKEN_HEADER: sb.token or ""}):
            for path in ("/ui/state?user=U_ALICE", "/ui/events",
                         "/api/conversations.history?channel=C_APPROVALS"):
                status, text = sb.raw("GET", path, headers)
                assert not any(leak in text for leak in leaks), (path, text)
                refused(status, text)
            for origin in ({}, {"Origin": f"http://{evil}"}):
                refused(*sb.raw("POST", "/ui/action", {
                    **headers, **origin, "Content-Type": "application/json"}, click))
        # nor does "its own" copy of the page hand it the token
        status, text = sb.raw("GET", "/?user=U_ALICE", {"Host": evil})
        assert "evil.example" in refused(status, text)
        assert sb.token and sb.token not in text
        assert sb.count(DECIDED) == 0 and sb.count(VOTES) == 0
        assert pending_card(sb) == ts  # still waiting, its Approve button still there
        # the page's own click, on its own origin, is what decides it
        status, answer = sb.post("action", {"user": "U_ALICE", "channel": "C_APPROVALS",
                                            "ts": ts, "action_id": APPROVE})
        assert (status, answer.get("status")) == (200, 200), answer
        [refund] = wait_until(lambda: refunds(sb), within=60, what="the approved refund")
        assert refund["args"]["order_id"] == "A-1"
        assert sb.stop() == 0
    finally:
        sb.close()


def test_every_page_route_needs_this_starts_token(tmp_path: Path) -> None:
    sb = Sandbox(tmp_path)
    try:
        sb.start()
        own = f"127.0.0.1:{sb.port}"
        first = sb.token
        assert first
        plain = {"Host": own, "Content-Type": "application/json"}
        wrong = [{}, {TOKEN_HEADER: ""}, {TOKEN_HEADER: "x" * len(first)},
                 {TOKEN_HEADER: first[:-1]}, {TOKEN_HEADER: first + "x"}]
        for given in wrong:
            for path in ("/ui/state?user=U_DANA", "/ui/events"):
                status, text = sb.raw("GET", path, {"Host": own, **given})
                assert status == 403 and TOKEN_HEADER in refused(status, text), text
            for path, body in [("/ui/runs", RUN),
                               ("/ui/home", b'{"user": "U_ALICE"}'),
                               ("/ui/command", b'{"user": "U_ALICE", "channel": '
                                               b'"C_APPROVALS", "text": "/approvals"}')]:
                status, text = sb.raw("POST", path, {**plain, **given}, body)
                assert status == 403 and TOKEN_HEADER in refused(status, text), (path, text)
        assert sb.count(RUNS) == 0
        # the page is this start's only: it is neither cached nor framed by another site
        with urllib.request.urlopen(sb.url, timeout=10) as page:
            assert page.headers["Cache-Control"] == "no-store"
            assert "frame-ancestors 'none'" in page.headers["Content-Security-Policy"]

        # a new start, a new token: the old one opens nothing
        assert sb.stop() == 0
        sb.start()
        assert sb.token and sb.token != first
        status, text = sb.raw("POST", "/ui/runs", {**plain, TOKEN_HEADER: first}, RUN)
        assert status == 403, text
        assert sb.count(RUNS) == 0
        assert sb.post("runs", {"user": "U_DANA", "agent": "demo-refund",
                                "order": "A-2"})[0] == 200
        assert sb.count(RUNS) == 1
        # localhost and [::1] name the same page
        for host in (f"localhost:{sb.port}", f"[::1]:{sb.port}", f"LOCALHOST:{sb.port}"):
            status, text = sb.raw("GET", "/ui/state?user=U_DANA",
                                  {"Host": host, TOKEN_HEADER: sb.token})
            assert status == 200 and json.loads(text)["ok"], text
        assert sb.stop() == 0
    finally:
        sb.close()
