"""``approvald sandbox``: the whole product in one process, with Slack played locally.

One aiohttp server (default ``http://127.0.0.1:8300/``) serves the Slack Web API emulator
under ``/api/`` and the page that shows the emulated workspace; ``serve`` runs beside it
in the same process, pointed at the emulator, with a bot token and signing secret made up
for this start. Clicks on the page reach ``serve`` exactly as Slack's would: signed
``block_actions`` / ``view_submission`` payloads on its HTTP endpoint.

What must outlive a restart does: the database (runs, approvals, the outbox), the
workspace (messages and views, in a JSON file beside a SQLite database) and the key the
cards' button tokens are derived from (kept in that file, unless ``APPROVALD_SECRET`` is
set). So a card posted before a SIGTERM or a SIGKILL is still there, and still clickable,
after the next start on the same database.
"""

from __future__ import annotations

import asyncio
import secrets
import sys
from datetime import timedelta
from importlib import resources
from pathlib import Path
from typing import Any

from approvald.bot.config import Settings
from approvald.bot.sandbox.mailbox import Mailbox
from approvald.bot.sandbox.people import AUDIT_CHANNEL, CHANNEL, CHANNELS, PEOPLE, seed
from approvald.bot.sandbox.persist import WorkspaceFile, WorkspaceFileError, dump, load
from approvald.bot.sandbox.server import SlackEmulator
from approvald.bot.sandbox.web import SandboxWeb
from approvald.bot.serve import Service, Signals, settle_heap
from approvald.bot.wiring import open_database
from approvald.runtime import ConfigError, Engine
from pydantic import SecretStr
from sqlalchemy.engine import make_url

DEFAULT_PORT = 8300
MAIL_FROM = "approvals@example.com"


def workspace_path(database_url: str) -> Path | None:
    """Where the workspace is kept: beside a SQLite database file; None for a server
    database (a PostgreSQL sandbox keeps its workspace in memory)."""
    url = make_url(database_url.replace("sqlite:///", "sqlite+aiosqlite:///", 1)
                   if database_url.startswith("sqlite:///") else database_url)
    if not url.drivername.startswith("sqlite") or not url.database \
            or url.database == ":memory:":
        return None
    db = Path(url.database).expanduser().resolve()
    return db.with_name(db.name + ".sandbox.json")


def policy_path() -> Path:
    return Path(str(resources.files("approvald.bot.sandbox").joinpath("policy.toml")))


class Sandbox:
    """The emulator, the page and ``serve``, started and stopped together."""

    def __init__(self, settings: Settings, *, host: str = "127.0.0.1",
                 port: int = DEFAULT_PORT, stop_event: asyncio.Event | None = None) -> None:
        self.settings = settings
        self.host = host
        self.port = port
        self.stop_event = stop_event or asyncio.Event()
        path = workspace_path(settings.database_url)
        self.file = WorkspaceFile(path) if path is not None else None
        self.emulator = SlackEmulator(bot_token=f"xoxb-sandbox-{secrets.token_hex(12)}",
                                      app_token=f"xapp-sandbox-{secrets.token_hex(12)}",
                                      signing_secret=secrets.token_hex(16))
        self.emulator.state.direct_messages = True
        # Slack allows 3 s between a click and the modal it opens; on a busy laptop the
        # sandbox must not turn a slow moment into a dead "expired_trigger_id" button
        self.emulator.state.trigger_ttl = timedelta(seconds=30)
        self.extra: dict[str, Any] = {}
        self.web: SandboxWeb | None = None
        # what serve mails (sign-in links, requests and their threads) is kept here
        self.mailbox = Mailbox(settings.mail_from or MAIL_FROM)
        self.service: Service | None = None
        self.url = ""

    def _load(self) -> None:
        stored = self.file.read() if self.file is not None else None
        if stored is None:
            seed(self.emulator)
        else:
            try:
                self.extra = load(self.emulator.state, stored)
            except WorkspaceFileError as exc:
                raise ConfigError(f"sandbox workspace {self.file.path if self.file else ''}: "
                                  f"{exc}; move it away to start afresh") from None
            for channel_id, name in CHANNELS.items():  # one a newer release added
                if channel_id not in self.emulator.state.channels:
                    self.emulator.add_channel(channel_id, name)
        if "secret" not in self.extra:
            self.extra["secret"] = secrets.token_urlsafe(32)

    async def _match(self, engine: Engine) -> None:
        """A workspace kept from a database that is gone (deleted to start over) would show
        cards nothing can decide: with no run in the database, start a fresh one."""
        state = self.emulator.state
        if not any(c.messages for c in state.channels.values()):
            return
        if any((await engine.runs_by_status()).values()):
            return
        for kept in (state.channels, state.users, state.usergroups, state.views,
                     state.view_users, state.home_views, state.ephemerals):
            kept.clear()
        seed(self.emulator)
        print("approvald sandbox: the database holds no runs: starting with a fresh "
              "workspace", file=sys.stderr, flush=True)

    def save(self, *_: Any) -> None:
        if self.file is not None:
            self.file.write(dump(self.emulator.state, self.extra))

    def serve_settings(self) -> Settings:
        """``serve``'s settings: Slack is the emulator, over HTTP, on a port of its own."""
        update: dict[str, Any] = {
            "slack_bot_token": SecretStr(self.emulator.bot_token),
            "slack_signing_secret": SecretStr(self.emulator.signing_secret or ""),
            "slack_app_token": None,
            "slack_api_url": self.emulator.base_url,
            "channel": CHANNEL, "ops_channel": None, "audit_channel": AUDIT_CHANNEL,
            "audit_head_interval": 60.0,
            "host": "127.0.0.1", "port": 0,
            "poll_interval": min(self.settings.poll_interval, 0.5),
            # the web review queue, on the page's origin (bot/sandbox/review.py)
            "public_url": self.url.rstrip("/"), "mail_from": self.mailbox.sender,
        }
        if self.settings.approver_emails is None:
            update["approver_emails"] = ",".join(f"{p.id}={p.name}@example.com"
                                                 for p in PEOPLE)
        if self.settings.secret is None:
            update["secret"] = SecretStr(str(self.extra["secret"]))
        if self.settings.policy_file is None:
            update["policy_file"] = policy_path()
        return self.settings.model_copy(update=update)

    async def start(self) -> str:
        """Load or seed the workspace, listen, open the database, start ``serve``."""
        self._load()
        self.web = SandboxWeb(self.emulator, people=PEOPLE, channel=CHANNEL)
        self.emulator.on_change(self.save)
        self.emulator.on_change(self.web.changed)
        try:
            await self.emulator.start(self.host, self.port, app=self.web.app())
        except OSError as exc:
            raise ConfigError(f"sandbox: cannot listen on {self.host}:{self.port}: "
                              f"{exc.strerror or exc}") from None
        self.url = self.emulator.root_url
        settings = self.serve_settings()
        db = await open_database(settings)  # makes the default database's directory
        self.service = Service(settings, db, stop_event=self.stop_event,
                               mailer=self.mailbox)
        try:
            await self._match(self.service.engine)
            self.save()  # the key of the cards' tokens too, before any card is posted
        except OSError as exc:
            await db.close()
            path = self.file.path if self.file else ""
            raise ConfigError(f"sandbox: cannot write the workspace to {path}: "
                              f"{exc.strerror or exc}") from None
        self.mailbox.clock = self.service.engine.now
        self.mailbox.on_change = self.web.changed
        await self.service.start()
        settle_heap()  # the sandbox is a long-running serve too
        slack = self.service.slack
        assert slack is not None and slack.port is not None
        self.web.attach(self.service.engine, f"http://127.0.0.1:{slack.port}/slack/events")
        assert settings.public_url is not None
        self.web.attach_review(f"http://127.0.0.1:{slack.port}", settings.public_url,
                               self.mailbox, settings.emails())
        return self.url

    async def stop(self) -> None:
        """Stop ``serve`` (runs reach a step boundary), then the page and the emulator."""
        if self.service is not None:
            try:
                await self.service.stop()
            finally:
                await self.service.db.close()
        if self.web is not None:
            await self.web.close()
        await self.emulator.stop()
        if self.service is not None:  # started: the workspace file's directory exists
            self.save()


async def run_sandbox(settings: Settings, *, host: str, port: int) -> int:
    """``approvald sandbox``: run until SIGTERM or SIGINT (a second one exits at once)."""
    stop = asyncio.Event()
    signals = Signals(asyncio.get_running_loop(), stop, settings.shutdown_grace)
    signals.install()
    sandbox = Sandbox(settings, host=host, port=port, stop_event=stop)
    try:
        if not stop.is_set():
            url = await sandbox.start()
            kept = (f"the workspace is kept in {sandbox.file.path}" if sandbox.file is not None
                    else "the workspace is kept in memory only")
            db = sandbox.service.db.display_url if sandbox.service else "?"
            print(f"approvald sandbox: open {url} in a browser ({db}; {kept}); Ctrl-C stops",
                  flush=True)
        await stop.wait()
    finally:
        try:
            await sandbox.stop()
        finally:
            signals.restore()
    if sandbox.service is not None and sandbox.service.fatal is not None:
        raise sandbox.service.fatal
    print("approvald sandbox: stopped", file=sys.stderr, flush=True)
    return 0
