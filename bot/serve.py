"""``approvald serve``: the long-running process.

It runs the expiry scheduler, the resume worker and the outbox drain, and (when Slack is
configured) the Slack app and the run-thread follower. The durable parts start first and
never wait for Slack: while Slack is unreachable, runs resume, requests expire and the CLI
can decide; deliveries wait in the outbox, and the Slack face keeps trying to connect in
the background. A token Slack refuses stops start-up (exit 2).

Stopping: the first SIGTERM or SIGINT stops taking new work and lets in-flight runs reach
a step boundary for up to ``APPROVALD_SHUTDOWN_GRACE`` seconds; what is left then is
cancelled (a tool call cut off that way has an intent row and no result: the next process
treats it as outcome unknown) and the process exits 0. A second signal exits at once, with
128 + the signal number (130 for SIGINT, 143 for SIGTERM), as does a stop that overruns
the grace by :data:`HARD_MARGIN` seconds (something that ignores cancellation, say).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from aiohttp import web
from approvald.bot.api.service import HttpApi
from approvald.bot.config import Settings
from approvald.bot.http_log import quiet_malformed_requests
from approvald.bot.install import install_command
from approvald.bot.metrics import PrometheusMeter, add_metrics_route, add_routes
from approvald.bot.readiness import Readiness
from approvald.bot.slack.log_delivery import LogDeliverer
from approvald.bot.tracing import from_environment as tracing_from_environment
from approvald.bot.wiring import build_engine, build_registry, open_database, reload_keys
from approvald.runtime import (
    MAIL_KINDS,
    Clock,
    ConfigError,
    DrainConfig,
    Engine,
    Route,
    Routes,
    Tracer,
    Undeliverable,
    load_policy_file,
    parse_duration,
    retention,
    sealing,
)
from approvald.store.db import Database, is_store_failure
from approvald.store.records import OutboxRecord
from approvald.store.wakeups import Wakeups

if TYPE_CHECKING:
    from approvald.bot.mcp.http import HttpGateways
    from approvald.bot.web.service import WebFace
    from approvald.runtime import MailSender

log = logging.getLogger("approvald.serve")
PRUNE_EVERY = 86400.0  # s between scheduled prunes (APPROVALD_PRUNE_OLDER_THAN)
# s between looks at the policy file (a stat; read and audited only when it changed)
POLICY_CHECK_EVERY = 5.0
FOLD_EVERY = 60.0  # s between two folds of the web queue's counted refusals
PRUNE_EXPIRED_EVERY = 3600.0  # s between two prunes of the web queue's expired rows
AFTER_CANCEL = 3.0  # once the grace is over: how long cancelled work gets to unwind
# past the grace, the watchdog exits whatever is still running: more than the bounded steps
# of Service.stop after the grace (unwinding, the socket, the listener) can take together
HARD_MARGIN = 15.0
# what signal.signal() returns: the handler it replaced (a function, SIG_DFL, SIG_IGN, or
# None for one not set from Python)
SignalHandler = Callable[[int, FrameType | None], Any] | int | signal.Handlers | None


class Service:
    """Everything ``serve`` runs, startable and stoppable in-process (tests use it too)."""

    def __init__(self, settings: Settings, db: Database, *, clock: Clock | None = None,
                 tracer: Tracer | None = None,
                 stop_event: asyncio.Event | None = None,
                 mailer: MailSender | None = None) -> None:
        """``mailer``: where mails go instead of ``APPROVALD_SMTP_URL`` (the sandbox's
        mailbox)."""
        self.settings = settings
        self.db = db
        self.meter = PrometheusMeter()
        self.tracing = tracing_from_environment()  # off unless OTEL_* variables ask
        slack_web = None
        if settings.slack_configured:
            from approvald.bot.slack.app import SlackWeb

            slack_web = SlackWeb(settings)  # its directory tells who is in a user group
        self.engine: Engine = build_engine(
            settings, db, clock=clock, meter=self.meter, tracer=tracer or self.tracing.tracer,
            directory=slack_web.directory if slack_web is not None else None)
        self.stop_event = stop_event or asyncio.Event()
        self.slack = None
        self.readiness = Readiness(db)
        self._ops_runner: web.AppRunner | None = None
        self.ops_port: int | None = None
        self._metrics_runner: web.AppRunner | None = None
        self.metrics_port: int | None = None  # bound (APPROVALD_METRICS_ADDR), None: off
        # /v1 on the same listener as /slack/events (or /healthz), its webhooks on the drain
        self.api = HttpApi(self.engine, settings, stop=self.stop_event)
        # /mcp/NAME on the same listener: the MCP gateways over Streamable HTTP
        self.mcp = _mcp_gateways(settings, self.engine)
        # /review on the same listener: the web review queue, and its mails on the drain
        self.web = _web_face(settings, self.engine, mailer)
        refuse_unsendable_mail(settings, self.engine.naming_channel("email"),
                               mailer=mailer is not None)
        # each outbox row goes to the face that declared its kind; a kind no face delivers
        # stops start-up here, not row by row in the drain
        routes: list[Route] = [self.api.webhooks]
        if slack_web is not None:
            from approvald.bot.slack.app import SlackService

            self.slack = SlackService(settings, self.engine, slack_web,
                                      ops_routes=self._ops_routes)
            routes.append(self.slack.deliverer)
        else:
            routes.append(LogDeliverer())
        routes.append(self.web.deliverer() if self.web is not None else NoMail())
        self.routes = Routes(routes)
        self.routes.check()
        # a card Slack never takes (or has not taken for APPROVALD_MAIL_FALLBACK_AFTER):
        # its request is mailed instead, when mail can be sent
        mails = self.web is not None and self.web.mailer is not None
        self.drain = self.engine.drain(self.routes, DrainConfig(
            mail_fallback=mails,
            mail_fallback_after=settings.mail_fallback_after_value() if mails else None))
        if settings.mail_fallback_after and not mails:
            log.warning("APPROVALD_MAIL_FALLBACK_AFTER is set, but mail cannot be sent (it "
                        "needs APPROVALD_PUBLIC_URL, APPROVALD_SMTP_URL and "
                        "APPROVALD_MAIL_FROM): a card Slack does not take is not mailed")
        if settings.slack_client_id and self.web is None:
            log.warning("APPROVALD_SLACK_CLIENT_ID is set, but there is no review queue to "
                        "sign in to (it needs APPROVALD_PUBLIC_URL): Sign in with Slack is off")
        self.worker = self.engine.worker(poll_interval=settings.poll_interval)
        self.scheduler = self.engine.expiry_scheduler(
            sweep_interval=timedelta(seconds=settings.sweep_interval))
        self.engine.on_outbox(self.drain.wake)
        # other replicas on the same PostgreSQL database hear of what this one commits;
        # one of those running the loops (start) leads the polling every replica does (the
        # others poll slower) and the fleet's work: a channel's run threads, paced by it
        # alone
        self.wakeups = Wakeups(db, origin=self.engine.process, on_signal=self._woken)
        self.engine.on_ready(lambda run_id: self.wakeups.publish("ready", run_id))
        self.engine.on_opened(lambda approval_id: self.wakeups.publish("opened", approval_id))
        self.engine.on_outbox(self._outbox_committed)
        self.engine.on_request_decided(lambda rid: self.wakeups.publish("decided", rid))
        self._tasks: list[asyncio.Task[None]] = []
        self._chores: list[asyncio.Task[None]] = []  # cancelled at stop, not waited for
        self._connector: asyncio.Task[None] | None = None
        self.pending_scheduled: int | None = 0  # None: the database did not answer then
        self._policy_seen: tuple[int, int] | None = None  # the policy file's stamp, read
        self.fatal: ConfigError | None = None  # why the service stopped itself

    async def start(self, *, background: bool = True) -> None:
        """Bind every listener, then start the durable parts, then connect to Slack.

        Listeners first (metrics; ``/healthz``, ``/readyz`` and ``/v1``; Slack's HTTP
        events), so that a port that cannot be bound stops ``serve`` in one line with
        nothing started yet to unwind. Then the scheduler and (with ``background``) the
        resume worker and the outbox drain, so runs resume and requests expire whatever
        Slack is doing (tests may drive the worker and the drain by hand instead); then
        the first attempt to connect to Slack. Returns once that attempt is over:
        connected, refused (:attr:`fatal` is set and so is the stop event), or failed, in
        which case connecting goes on in the background.
        """
        # waiting work sealed under a key this process lacks: refuse now, in one line,
        # rather than fail each click and each resume
        await sealing.check(self.db, self.settings.sealer())
        await self.engine.note_policy(per_process=True)
        self._policy_seen = _file_stamp(self.settings.policy_file)
        await self._start_metrics_listener()
        if (self.slack is None or self.settings.slack_app_token is not None) \
                and "port" in self.settings.model_fields_set:
            await self._start_ops_listener()  # no Slack HTTP listener to share
        if self.slack is not None:
            await self.slack.start()  # binds its HTTP listener; talks to Slack later
            if self.slack.port:  # a webhook must never call approvald's own listener
                self.api.webhook_hosts.add_own_port(self.slack.port)
        self._check_web()
        self.pending_scheduled = await self.scheduler.start()
        if background:  # only a process whose loops run may lead them
            self.wakeups.on_lead = self.engine.pace.lead
        await self.wakeups.start()
        if self.slack is not None and self.settings.audit_channel:
            # a witness of the chain as this process found it, then one every interval
            await self._first_audit_head()
            self.scheduler.every("audit-head", self.post_audit_head,
                                 self.settings.audit_head_interval)
        if self.settings.policy_file is not None:  # a changed file is picked up, audited
            self.scheduler.every("policy-file", self.reload_policy, POLICY_CHECK_EVERY)
        if self.settings.prune_older_than:
            self.scheduler.every("prune", self.prune, PRUNE_EVERY)
        if self.web is not None:
            # what anyone on the network can add to: counted refusals folded into the audit
            # log each minute, expired sign-in rows deleted each hour
            self.scheduler.every("web-refusals", self.web.auth.refusals.fold, FOLD_EVERY)
            self.scheduler.every("web-expired", self.prune_expired, PRUNE_EXPIRED_EVERY)
        stop = self.stop_event
        if background:
            self._tasks = [asyncio.create_task(self.worker.run(stop), name="worker"),
                           asyncio.create_task(self.drain.run(stop), name="outbox")]
        if self.web is not None:  # said in the log once it is known: nothing waits for it
            self._chores.append(asyncio.create_task(self.web.check_mail(), name="mail-check"))
        if self.slack is None:
            log.warning("no Slack settings: approval requests are logged, and decided %s",
                        self.where_decided())
            await self._start_mcp()
            return
        await self._start_mcp()
        self._connector = asyncio.create_task(self._connect(), name="slack-connect")
        await self._first_attempt()
        if background and not stop.is_set():
            self._tasks.append(asyncio.create_task(self.slack.threads.run(stop),
                                                   name="threads"))

    async def _connect(self) -> None:
        assert self.slack is not None
        from approvald.bot.slack.app import SlackRefused

        try:
            await self.slack.connect(self.stop_event)
        except SlackRefused as exc:
            self.fatal = exc
            self.stop_event.set()

    async def _first_attempt(self) -> None:
        assert self.slack is not None
        waits = [asyncio.ensure_future(self.slack.tried.wait()),
                 asyncio.ensure_future(self.stop_event.wait())]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
            await asyncio.gather(*waits, return_exceptions=True)

    async def post_audit_head(self) -> None:
        """Queue the audit chain's head for the audit channel: a witness outside the
        database that ``audit verify --expect`` can be checked against later."""
        if await self.engine.queue_audit_head():
            self.engine.notify_outbox()

    async def _first_audit_head(self) -> None:
        """The head as this process found it; a database failing now (``/healthz`` answers
        already) leaves it to the next interval instead of stopping ``serve``."""
        try:
            await self.post_audit_head()
        except Exception as exc:
            if not is_store_failure(exc):
                raise
            log.warning("the audit chain's head cannot be read yet (%s: %s); it is posted in "
                        "%g s", type(exc).__name__, str(exc).partition("\n")[0],
                        self.settings.audit_head_interval)

    def _ops_routes(self, app: web.Application) -> None:
        def describe() -> dict[str, Any]:
            return self.slack.status() if self.slack is not None else {"slack": "off"}
        add_routes(app, self.readiness, describe)
        self.api.add_routes(app)
        if self.mcp is not None:
            self.mcp.add_routes(app)
        if self.web is not None:
            self.web.add_routes(app)

    def _fallback_words(self) -> str:
        """When a card Slack does not take is mailed instead (the banner's words)."""
        after = self.drain.config.mail_fallback_after
        if not self.drain.config.mail_fallback:
            return ""
        if after is None:
            return "; a card given up is mailed"
        return f"; a card Slack has not taken in {self.settings.mail_fallback_after} is mailed"

    def _check_web(self) -> None:
        if self.web is not None and self.http_url is None:
            raise ConfigError("APPROVALD_PUBLIC_URL: the web review queue is served on "
                              "serve's HTTP listener; set APPROVALD_PORT")

    async def _start_mcp(self) -> None:
        """Reach each MCP gateway's server and serve it at /mcp/NAME on the listener."""
        if self.mcp is None:
            return
        port = (self.slack.port if self.slack is not None and self.slack.port
                else self.ops_port)
        if port is None:
            raise ConfigError("APPROVALD_MCP_GATEWAYS_FILE: the MCP gateways are served on "
                              "serve's HTTP listener; set APPROVALD_PORT")
        await self.mcp.start(self.settings.host, port)

    async def _start_ops_listener(self) -> None:
        """``/healthz``, ``/readyz`` (and ``/v1``) on ``APPROVALD_PORT`` when no Slack HTTP
        listener serves them (Socket Mode, or no Slack at all) and the port is set
        explicitly (several such processes on one host need no port at all)."""
        app = web.Application()
        self._ops_routes(app)
        host, port = self.settings.host, self.settings.port
        try:
            self._ops_runner, self.ops_port = await _listen(app, host, port)
        except OSError as exc:
            raise ConfigError(f"APPROVALD_HOST/APPROVALD_PORT: cannot listen on {host}:{port} "
                              f"for /healthz and /readyz: {_why(exc)}") from None
        self.api.webhook_hosts.add_own_port(self.ops_port)

    async def _start_metrics_listener(self) -> None:
        """``/metrics`` on ``APPROVALD_METRICS_ADDR``, a listener of its own (loopback by
        default), unless it is ``off``. An address set explicitly that cannot be bound
        stops start-up; the default one (another replica on this host has it, say) only
        leaves metrics off, with a warning."""
        where = self.settings.metrics_listen
        if where is None:
            return
        app = web.Application()
        add_metrics_route(app, self.engine, self.meter)
        try:
            self._metrics_runner, self.metrics_port = await _listen(app, *where)
        except OSError as exc:
            if "metrics_addr" in self.settings.model_fields_set:
                raise ConfigError(f"APPROVALD_METRICS_ADDR: cannot listen on "
                                  f"{self.settings.metrics_addr} for /metrics: "
                                  f"{_why(exc)}") from None
            log.warning("/metrics is off: cannot listen on %s (%s); set "
                        "APPROVALD_METRICS_ADDR to host:port (port 0: any) or off",
                        self.settings.metrics_addr, _why(exc))
            return
        self.api.webhook_hosts.add_own_port(self.metrics_port)

    def _outbox_committed(self) -> None:
        """Outbox rows were committed here. While this process's drain runs it was woken
        (on_outbox) and delivers them: another replica woken would only race it for
        the rows' claim, at the cost of a ``pg_notify`` per commit (issue 50). With no
        drain running here (started without it, or stopped) the others are told."""
        if not any(t.get_name() == "outbox" and not t.done() for t in self._tasks):
            self.wakeups.publish("outbox")

    def _woken(self, kind: str, key: str) -> None:
        """Another replica committed something: wake what acts on it here (the database
        decides, by compare-and-set, which replica gets each piece of work)."""
        if kind == "ready" and key:
            self.engine.notify_ready(key)
        elif kind == "opened" and key:
            self.engine.notify_opened(key)
        elif kind == "outbox":
            self.engine.notify_outbox()
        elif kind == "decided" and key:  # an external request's long polls look again
            self.engine.wake_request(key)

    def reload_keys(self) -> None:
        """SIGHUP: read the data and audit keys again (from ``APPROVALD_SECRETS_DIR``'s
        files: a running process's environment never changes) and use them from now on;
        keys that cannot be used change nothing. Said in one line either way."""
        try:
            log.info("SIGHUP: %s", reload_keys(self.engine))
        except ConfigError as exc:
            log.warning("SIGHUP: keys not read again, those in use are kept: %s", exc)

    async def reload_policy(self) -> bool:
        """Put a changed policy file in force in this process (for requests not yet made:
        the stored request decides the others), audited as this process's load; a file
        that does not load changes nothing and is logged once. True when it changed."""
        path = self.settings.policy_file
        stamp = _file_stamp(path)
        if path is None or stamp == self._policy_seen:
            return False
        self._policy_seen = stamp
        try:
            new = load_policy_file(path, max_ttl=self.settings.max_ttl_value())
            if new.digest == self.engine.policy_file().digest:
                return False
            self.engine.use_policy(new)  # checked; a refused one leaves the old in force
        except ConfigError as exc:
            log.error("the policy file changed but does not load; the one in force is "
                      "kept: %s", exc)
            return False
        await self.engine.note_policy(per_process=True)
        log.info("policy file %s loaded (sha256 %s)", path, new.digest)
        return True

    async def prune(self) -> None:
        """Prune finished runs past ``APPROVALD_PRUNE_OLDER_THAN`` (see ``approvald prune``)."""
        assert self.settings.prune_older_than
        report = await self.engine.prune(parse_duration(self.settings.prune_older_than))
        log.info("%s", report.summary())

    async def prune_expired(self) -> None:
        """Delete the web review queue's rows that expired a day ago (links, sessions,
        sign-in states): of no use to anyone, and anyone can make more."""
        pruned = await self.engine.prune_expired()
        if any(pruned.values()):
            log.info("pruned %s", retention.expired_summary(pruned))

    async def stop(self, *, grace: float | None = None) -> None:
        """Stop taking new work; give in-flight runs up to ``grace`` seconds (default
        ``APPROVALD_SHUTDOWN_GRACE``) to reach a step boundary, then cancel what is left."""
        grace = self.settings.shutdown_grace if grace is None else grace
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace
        self.stop_event.set()
        self.scheduler.shutdown()
        await self.wakeups.close()
        # connecting (and checking what we connect to) is not work in flight: stop it now
        for chore in [*([self._connector] if self._connector else []), *self._chores]:
            chore.cancel()
            await asyncio.gather(chore, return_exceptions=True)
        if self._tasks:
            _, pending = await asyncio.wait(self._tasks, timeout=grace)
            if pending:
                log.warning("still busy after APPROVALD_SHUTDOWN_GRACE (%g s): cancelling; "
                            "a tool call cut off now is outcome unknown to the next process",
                            grace)
                for task in pending:
                    task.cancel()
                await asyncio.wait(pending, timeout=AFTER_CANCEL)
        if self.slack is not None:
            from approvald.bot.slack.app import CLOSE_TIMEOUT

            within = max(0.0, deadline - loop.time())
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.slack.stop(within=within),
                                       within + AFTER_CANCEL + 2 * CLOSE_TIMEOUT)
        for runner in (self._ops_runner, self._metrics_runner):
            if runner is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(runner.cleanup(), AFTER_CANCEL)
        self._ops_runner = self._metrics_runner = None
        if self.mcp is not None:  # the wrapped servers, once nobody can call them
            await self.mcp.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.engine.aclose(), AFTER_CANCEL)
        with contextlib.suppress(Exception):  # the last spans, if the collector answers
            await self.tracing.shutdown(within=AFTER_CANCEL)

    def describe(self) -> str:
        """What ``serve`` says once started, a line each: the database; the mode (Slack
        over HTTP, in Socket Mode, or not configured) and where requests can be decided;
        each listener's address with what it serves there; metrics."""
        scheduled = ("pending approvals not scheduled yet: the database did not answer"
                     if self.pending_scheduled is None
                     else f"{self.pending_scheduled} pending approvals scheduled")
        lines = [f"serving on {self.db.display_url} ({scheduled})"]
        http = self.http_url
        if self.slack is None:
            lines.append("mode: Slack is not configured (no SLACK_BOT_TOKEN): approval "
                         f"requests are logged, and decided {self.where_decided()}")
        else:
            how = ("Slack in Socket Mode" if self.settings.slack_app_token is not None
                   else f"Slack over HTTP, events at {http}/slack/events")
            state = ("connected" if self.slack.connected
                     else "not connected yet: retrying in the background")
            lines.append(f"mode: {how} ({state}); requests are decided "
                         f"{self.where_decided()}")
        if http:
            lines.append(f"http: {http}/v1 (the HTTP API), {http}/healthz, {http}/readyz")
        else:
            lines.append("http: no HTTP listener (set APPROVALD_PORT to serve /v1, /healthz "
                         "and /readyz)")
        if self.web is not None and http:
            lines.append(f"review: {self.web.public_url}/review (the web review queue, "
                         f"served at {http}/review; sign-in links by mail "
                         f"{'on' if self.web.mailer else 'off: APPROVALD_SMTP_URL'}"
                         f"{'; Sign in with Slack on' if self.web.slack else ''}"
                         f"{self._fallback_words()})")
        if self.mcp is not None and http:
            lines.extend(f"mcp: {http}/mcp/{name} (the MCP gateway {name}, in front of "
                         f"{g.config.server()})" for name, g in self.mcp.gateways.items())
        lines.append(f"metrics: {self.metrics_url}" if self.metrics_url
                     else "metrics: off (APPROVALD_METRICS_ADDR)")
        lines.append(f"event loop: {running_loop_name()} "
                     f"(APPROVALD_EVENT_LOOP={self.settings.event_loop})")
        return "\n".join(lines)

    def where_decided(self) -> str:
        """Every place a person can decide a request on this deployment, in words."""
        places = ["in Slack"] if self.slack is not None else []
        if self.web is not None and self.http_url:
            places.append(f"on the web review queue ({self.web.public_url}/review)")
        places.append("with `approvald approvals approve|deny|edit ID`")
        return ", ".join(places[:-1]) + (" and " if len(places) > 1 else "") + places[-1]

    @property
    def http_url(self) -> str | None:
        """The base URL of the listener serving ``/v1``, ``/healthz`` and ``/readyz`` (and
        ``/slack/events`` over HTTP), or None when none is listening."""
        port = (self.slack.port if self.slack is not None and self.slack.port
                else self.ops_port)
        if not port:
            return None
        host = self.settings.host
        return f"http://{f'[{host}]' if ':' in host else host}:{port}"

    @property
    def metrics_url(self) -> str | None:
        """Where ``/metrics`` is served, or None when it is off."""
        where = self.settings.metrics_listen
        if where is None or self.metrics_port is None:
            return None
        host = f"[{where[0]}]" if ":" in where[0] else where[0]
        return f"http://{host}:{self.metrics_port}/metrics"


def _mcp_gateways(settings: Settings, engine: Engine) -> HttpGateways | None:
    """The MCP gateways the settings name (the ``mcp`` extra is needed only then)."""
    if settings.mcp_gateways_file is None:
        return None
    try:
        from approvald.bot.mcp.http import HttpGateways, load
    except ImportError as exc:
        raise ConfigError(f"APPROVALD_MCP_GATEWAYS_FILE needs the MCP SDK: "
                          f"{install_command('mcp')} ({exc})") from None
    return HttpGateways(engine, load(settings.mcp_gateways_file),
                        secret=settings.token_secret(), fast_path=settings.mcp_fast_path)


def _web_face(settings: Settings, engine: Engine,
              mailer: MailSender | None = None) -> WebFace | None:
    """The web review queue, when ``APPROVALD_PUBLIC_URL`` says where approvers reach it."""
    if settings.public_url is None:
        return None
    from approvald.bot.web.service import WebFace

    return WebFace(engine, settings, mailer)


class NoMail:
    """The mail rows, when the web face is off (no ``APPROVALD_PUBLIC_URL``): nothing can
    compose or send them, so each is parked as dead (and reported) at its first try."""

    kinds = MAIL_KINDS

    async def deliver(self, row: OutboxRecord) -> dict[str, Any] | None:
        raise Undeliverable(f"{row.kind} cannot be mailed: the web review queue is off (it "
                            "needs APPROVALD_PUBLIC_URL, APPROVALD_SMTP_URL and "
                            "APPROVALD_MAIL_FROM)")


def refuse_unsendable_mail(settings: Settings, where: str | None, *,
                           mailer: bool = False) -> None:
    """A policy in force that names the ``email`` channel, on a deployment that cannot
    send mail, stops start-up with one line naming what to set: its requests' mails would
    otherwise only be reported dead, one by one. ``mailer``: mails have somewhere to go
    other than ``APPROVALD_SMTP_URL``. ``where``: where a policy in force names the
    channel (None: none does)."""
    if where is None:
        return
    needed = [] if mailer else [("APPROVALD_SMTP_URL", settings.smtp_url),
                                ("APPROVALD_MAIL_FROM", settings.mail_from)]
    needed += [("APPROVALD_PUBLIC_URL", settings.public_url),
               ("APPROVALD_APPROVER_EMAILS", settings.approver_emails)]
    missing = [name for name, value in needed if not value]
    if missing:
        raise ConfigError(f"{missing[0]}: {where} names the \"email\" channel, but this "
                          f"deployment cannot send mail: set {' and '.join(missing)}")


async def _listen(app: web.Application, host: str, port: int) -> tuple[web.AppRunner, int]:
    """Serve ``app`` on ``host:port``: its runner and the port bound (``port`` 0: any)."""
    quiet_malformed_requests()
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    try:
        await site.start()
    except OSError:
        await runner.cleanup()
        raise
    bound = runner.addresses
    return runner, int(bound[0][1]) if bound else port


def _why(exc: OSError) -> str:
    return os.strerror(exc.errno) if exc.errno else str(exc)


class Signals:
    """SIGTERM and SIGINT for ``serve``: the first sets ``stop`` and arms a watchdog, a
    second one exits at once. SIGHUP calls ``on_hangup`` (read the keys again).

    Installed with :func:`signal.signal`, not the loop's handlers: those run only when the
    event loop gets control, and a stuck loop must not make the process unkillable short
    of SIGKILL. Nothing is lost by exiting at once: every state change is already
    committed, and a cut-off tool call is the ledger's outcome-unknown case.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, stop: asyncio.Event,
                 grace: float) -> None:
        self.loop = loop
        self.stop = stop
        self.grace = grace
        self.received: int | None = None
        self.on_hangup: Callable[[], None] | None = None  # SIGHUP: read the keys again
        self._previous: dict[signal.Signals, SignalHandler] = {}
        self._watchdog: threading.Timer | None = None

    def install(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._previous[sig] = signal.signal(sig, self._handle)
        # SIGHUP (whose default would end the process) reads the keys again
        self._previous[signal.SIGHUP] = signal.signal(signal.SIGHUP, self._hangup)

    def _hangup(self, _signum: int, _frame: FrameType | None) -> None:
        self.loop.call_soon_threadsafe(self._reload)

    def _reload(self) -> None:
        if self.on_hangup is None:
            log.warning("SIGHUP before serve started: the keys are read as it starts")
            return
        self.on_hangup()

    def restore(self) -> None:
        # the watchdog stays armed: it also covers the event loop's own teardown, and a
        # daemon thread never holds up a process that exits in time
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        if self.received is not None:
            _exit_now(signum, f"{signal.Signals(signum).name} again: exiting at once")
        self.received = signum
        self.loop.call_soon_threadsafe(self.stop.set)
        self._watchdog = threading.Timer(
            self.grace + HARD_MARGIN, _exit_now,
            args=(signum, f"still stopping {self.grace + HARD_MARGIN:g} s after "
                          f"{signal.Signals(signum).name}: exiting at once"))
        self._watchdog.daemon = True
        self._watchdog.start()


def _exit_now(signum: int, why: str) -> None:
    # no print(): this may run inside a signal handler, in the middle of another write
    with contextlib.suppress(OSError):
        os.write(sys.stderr.fileno(), f"approvald: {why}\n".encode())
    os._exit(128 + signum)


async def serve(settings: Settings) -> int:
    """Run until SIGTERM or SIGINT; 0 after a graceful stop. A token Slack refuses raises
    :class:`ConfigError` (one line, exit 2); a second signal exits at once (see above)."""
    stop = asyncio.Event()
    signals = Signals(asyncio.get_running_loop(), stop, settings.shutdown_grace)
    signals.install()  # before anything slow: a SIGTERM during migrations is heard too
    try:
        # before the database is opened: a policy this deployment cannot follow writes nothing
        refuse_unsendable_mail(settings, build_registry(settings).naming_channel("email"))
        db = await open_database(settings)
        try:
            service = Service(settings, db, stop_event=stop)
            signals.on_hangup = service.reload_keys
            fatal = await _run(service)
        finally:
            await db.close()
    finally:
        signals.restore()
    if fatal is not None:
        raise fatal
    print("approvald: stopped", file=sys.stderr, flush=True)
    return 0


EventLoopFactory = Callable[[], asyncio.AbstractEventLoop]


def event_loop(choice: str) -> tuple[str, EventLoopFactory | None]:
    """The event loop ``APPROVALD_EVENT_LOOP`` picks for ``serve``: its name, and what makes
    it (None: asyncio's own, made as :func:`asyncio.run` makes it).

    ``auto`` is uvloop wherever it is installed (a dependency where it builds: CPython on
    Linux and macOS), asyncio's own loop elsewhere; ``uvloop`` without uvloop installed is
    a configuration error, not a quiet fallback."""
    if choice == "asyncio":
        return "asyncio", None
    try:
        import uvloop
    except ImportError:
        if choice == "uvloop":
            raise ConfigError("APPROVALD_EVENT_LOOP: uvloop is not installed for this Python "
                              "(pip install uvloop; it builds on Linux and macOS), or set "
                              "APPROVALD_EVENT_LOOP=asyncio") from None
        return "asyncio", None
    return "uvloop", uvloop.new_event_loop


def running_loop_name() -> str:
    """The event loop this code runs on: ``uvloop`` or ``asyncio``."""
    module = type(asyncio.get_running_loop()).__module__
    return "uvloop" if module.partition(".")[0] == "uvloop" else "asyncio"


# the cyclic collector's young-generation threshold from start-up on (CPython's: 700)
GC_YOUNG = 10_000


def settle_heap() -> None:
    """Move everything start-up built (modules, SQLAlchemy's tables and compiled plans,
    pydantic's validators, the Slack app) out of the cyclic garbage collector's sight,
    and collect the young generation every :data:`GC_YOUNG` allocations, not 700.

    Those objects live as long as the process, yet every full collection walked all of
    them: under a burst of clicks one such collection stopped the event loop for ~170 ms
    on a 2-core machine, the slowest clicks' whole tail (issue 14's benchmarks).
    Garbage made before this point is collected first, so nothing is kept by mistake;
    objects made later are collected as before.

    An approval leaves almost no cyclic garbage (0-28 objects found per 200 approvals in
    bench_click_cpu), yet at 700 the collector ran about every three approvals and walked
    what was in flight each time, then again in the older generations: 0.27-0.50 ms of
    ``serve``'s CPU per approval (~7%), against 0.07-0.29 ms at 10,000, with no full
    collection in 1,200 approvals (one per 200 at 700); each young collection walks more
    (6-13 ms, against ~0.5 ms, gen1 5-7 ms and full 15-30 ms at 700). Peak RSS of
    bench_soak's 2,000 runs: 119.8 and 119.9 MB at 700, 120.0 and 120.6 MB at 10,000."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_YOUNG)  # the older generations' thresholds stay as they are


# full collections after start-up that freeze what they leave alive (the first requests'
# statements, plans and prepared statements); then at most SETTLE_MORE more, each only when
# a full collection left at least SETTLE_LEAST objects in the oldest generation: see Settling
SETTLE_AGAIN = 3
SETTLE_MORE = 8
SETTLE_LEAST = 20_000


class Settling:
    """The first ``times`` full collections after start-up each freeze what they left
    alive, as :func:`settle_heap` froze start-up's heap; after them, at most ``more``
    collections do too, each only when it left at least ``least`` objects in the
    generation its survivors are in (the oldest for a full one, the next older for a
    younger one): what lives long was built again, more than what is in flight.

    The first requests build what lives as long as the process too, lazily: each statement
    shape's SQLAlchemy constructs and compiled plan, asyncpg's prepared statement on each
    pooled connection, a group commit's statement for each batch size. In bench_fleet's
    ``serve`` on PostgreSQL that was 55,000-67,000 objects 20 s after start-up, about 100,000
    a minute later, against 66 right after :func:`settle_heap`; every full collection
    walked them all again, 40-150 ms of the event loop's CPU each on the loaded 2-core VM,
    about six in two minutes at 1,000 decisions a second: each a stall that every request
    arriving meanwhile waited out, the open loop's p99 (issue 50). What survived a full
    collection is what lives long; freezing it a bounded number of times keeps the cost
    bounded too: a cycle alive at one of those moments and dropped later is never
    collected (a request in flight then), so it is not done for ever.

    The first three alone were spent in the first seconds of traffic: the statements of
    later shapes (a group commit's larger batches, made once many callers came at once)
    were built after them, and bench_fleet's open loop found 64,000-80,000 objects in the
    oldest generation again (4,700 ``BindParameter``, 3,500 ``Label``, 6,000 frozensets
    among them), 54-66 ms of the event loop's CPU per full collection, under load. What
    is in flight at 1,000 decisions a second is under 10,000 objects: a collection that
    leaves ``least`` = 20,000 has found what was built to keep, and freezes it.

    Young collections count too (what one leaves goes one generation older, and is looked
    at there): at :data:`GC_YOUNG` = 10,000 the middle generation is collected only every
    ~100,000 allocations, so what the first minutes of traffic build to keep piles up in
    it, and the first middle collection walks all of it. In bench_fleet's ``serve`` on
    PostgreSQL that was 81,000-97,000 objects (the group commit's statements of each batch
    size and rider shape met during warm-up: 8,000 ``BindParameter``, 6,400 ``Label``,
    1,900 ``Select`` among them), 40-52 ms of the event loop's CPU in one step, in the
    hook's open-loop window in four runs of five: its p99. A young collection that leaves
    ``least`` in the middle generation freezes it instead, before any middle collection
    walks it."""

    def __init__(self, times: int = SETTLE_AGAIN, *, more: int = SETTLE_MORE,
                 least: int = SETTLE_LEAST) -> None:
        self.left = times
        self.more = more
        self.least = least

    def install(self) -> None:
        gc.callbacks.append(self._collected)

    def remove(self) -> None:
        with contextlib.suppress(ValueError):
            gc.callbacks.remove(self._collected)

    def _collected(self, phase: str, info: dict[str, int]) -> None:
        # (left in gc.callbacks once done, not removed while the collector walks that list)
        if phase != "stop":
            return
        generation = info["generation"]
        if generation == 2 and self.left > 0:
            self.left -= 1
            gc.freeze()  # what the collection left: all of it in the oldest generation
        elif self.more > 0 and len(gc.get_objects(min(generation + 1, 2))) >= self.least:
            # a younger collection's too: what it left went one generation older
            self.more -= 1
            gc.freeze()


async def _run(service: Service) -> ConfigError | None:
    settling = Settling()
    try:
        if not service.stop_event.is_set():  # a signal during migrations: do not start
            await service.start()  # a refused token ends it, before the banner
            settle_heap()
            settling.install()
        if not service.stop_event.is_set():
            first, *rest = service.describe().splitlines()
            print("\n".join([f"approvald: {first}; SIGTERM stops",
                             *(f"approvald: {line}" for line in rest)]),
                  file=sys.stderr, flush=True)
        await service.stop_event.wait()
        if service.fatal is None:
            log.info("stopping: letting runs reach a step boundary (at most %g s)",
                     service.settings.shutdown_grace)
    finally:
        settling.remove()
        await service.stop()
    return service.fatal


def _file_stamp(path: Path | None) -> tuple[int, int] | None:
    """When the file was last changed, and its size (None: no file, or it cannot be read):
    the policy file is read again only when this changes."""
    if path is None:
        return None
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size
