"""``approvald sandbox`` as a real process, and the page's own HTTP routes to act on it."""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import socket
import sqlite3
import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, TypeVar

from tests.acceptance.conftest import wait_until
from tests.helpers import popen_approvald

T = TypeVar("T")
START_WITHIN = 90.0  # a loaded CI machine migrates and starts slowly; a healthy one in ~2 s
TOKEN_HEADER = "X-Approvald-Sandbox"
_TOKEN = re.compile(r'<meta name="approvald-sandbox" content="([^"]+)">')


def reserved_port() -> socket.socket:
    """A socket bound to a free loopback port with ``SO_REUSEADDR``, never listening: while
    it is open no other ``bind`` (a port 0 one included) nor an outgoing connection's own
    port takes that port, yet a server that binds it with ``SO_REUSEADDR`` (asyncio's, so
    aiohttp's, on POSIX) listens there, again after each restart. A connection to it while
    no server listens is refused, as to a closed port. (A port picked and let go, then
    bound again by a restarted process, can be taken in the gap by another xdist worker.)"""
    held = socket.socket()
    held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    held.bind(("127.0.0.1", 0))
    return held


class Sandbox:
    """One ``approvald sandbox`` subprocess on a temp SQLite file and a free port."""

    def __init__(self, tmp_path: Path, *, home: Path | None = None,
                 extra_env: dict[str, str] | None = None) -> None:
        """On ``sandbox.db`` in ``tmp_path``; with ``home``, on the default database of a
        user whose home directory that is (nothing set but ``HOME``); ``extra_env``: more
        settings (a policy file)."""
        self.dir = tmp_path
        self.extra_env = dict(extra_env or {})
        self.home = home
        self.db = (home / ".local" / "share" / "approvald" / "approvald.db" if home
                   else tmp_path / "sandbox.db")
        self.ledger = tmp_path / "ledger.jsonl"
        self.held = reserved_port()  # held until close(): every start listens on it
        self.port = int(self.held.getsockname()[1])
        self.url = f"http://127.0.0.1:{self.port}/"
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.token: str | None = None  # this start's page token, read from the page

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("APPROVALD_", "SLACK_", "XDG_"))}
        env.update(APPROVALD_DEMO_LEDGER=str(self.ledger), APPROVALD_LOG_LEVEL="WARNING",
                   APPROVALD_SHUTDOWN_GRACE="10", APPROVALD_METRICS_ADDR="127.0.0.1:0")
        if self.home is not None:
            env["HOME"] = str(self.home)
        else:
            env["APPROVALD_DATABASE_URL"] = f"sqlite+aiosqlite:///{self.db}"
        env.update(self.extra_env)
        return env

    def start(self) -> None:
        self.starts += 1
        self.token = None
        with open(self.dir / f"sandbox-{self.starts}.log", "wb") as log:
            self.proc = popen_approvald(["sandbox", "--port", str(self.port)],
                                        env=self.env(), cwd=self.dir, stdout=log,
                                        stderr=subprocess.STDOUT)
        try:
            wait_until(self._ready, within=START_WITHIN, what="the sandbox to start")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; it said: {self.output()}") from None

    def _ready(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise AssertionError(f"the sandbox exited with {self.proc.returncode}: "
                                 f"{self.output()}")
        try:
            self.token = self.page_token()
            return bool(self.state("U_DANA").get("ready"))
        except (OSError, ValueError):
            return False

    def page_token(self) -> str | None:
        """The token the page embeds, as a browser loading it gets it."""
        with urllib.request.urlopen(self.url, timeout=10) as r:
            found = _TOKEN.search(r.read().decode())
        return found.group(1) if found else None

    def output(self) -> str:
        return (self.dir / f"sandbox-{self.starts}.log").read_text(errors="replace")

    def stop(self, sig: int = signal.SIGTERM) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.proc.wait(timeout=60)

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)
        self.held.close()

    # -- the page's routes --------------------------------------------------------------

    def headers(self) -> dict[str, str]:
        """What the page sends with each of its requests: this start's token."""
        return {TOKEN_HEADER: self.token} if self.token else {}

    def state(self, user: str, **query: str) -> dict[str, Any]:
        q = "&".join(f"{k}={v}" for k, v in {"user": user, **query}.items())
        request = urllib.request.Request(f"{self.url}ui/state?{q}", headers=self.headers())
        with urllib.request.urlopen(request, timeout=10) as r:
            data: dict[str, Any] = json.load(r)
        return data

    def post(self, path: str, body: Any) -> tuple[int, dict[str, Any]]:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        request = urllib.request.Request(f"{self.url}ui/{path}", data=data, method="POST",
                                         headers={"Content-Type": "application/json",
                                                  **self.headers()})
        try:
            with urllib.request.urlopen(request, timeout=30) as r:
                return r.status, json.load(r)
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"{}")

    def raw(self, method: str, path: str, headers: dict[str, str],
            body: bytes | None = None) -> tuple[int, str]:
        """One request exactly as given: every header (``Host`` too) is the caller's, as
        another web page, or a rebound DNS name, would make the browser send it."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
            for name, value in headers.items():
                conn.putheader(name, value)
            if body is not None:
                conn.putheader("Content-Length", str(len(body)))
            conn.endheaders(body)
            response = conn.getresponse()
            return response.status, response.read().decode(errors="replace")
        finally:
            conn.close()

    def count(self, sql: str) -> int:
        """One number from the sandbox's SQLite database (read-only)."""
        db = sqlite3.connect(f"file:{self.db}?mode=ro", uri=True)
        try:
            return int(db.execute(sql).fetchone()[0])
        finally:
            db.close()

    def ledger_lines(self) -> list[dict[str, Any]]:
        if not self.ledger.exists():
            return []
        return [json.loads(x) for x in self.ledger.read_text().splitlines() if x.strip()]
