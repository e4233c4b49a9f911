"""Health, readiness and Prometheus metrics for ``serve``.

* ``/healthz``: the process is up (200 whatever Slack or the database is doing);
* ``/readyz``: the database answers and its schema is the one this code expects; 503 with
  the reason otherwise (see :mod:`bot.readiness`). Both are on ``serve``'s HTTP listener
  (the Slack listener in HTTP mode; in Socket Mode, and without Slack, a listener of
  their own on ``APPROVALD_PORT``);
* ``/metrics``: the Prometheus text format, on a listener of its own
  (``APPROVALD_METRICS_ADDR``, loopback by default): the counts it shows are the
  business's, not for whoever can reach Slack's or the API's listener. Gauges are read
  from the database at scrape time (so every replica reports the same backlog); counters
  and histograms count what this process did since it started.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime
from typing import Any

from aiohttp import web
from approvald.bot.readiness import Readiness
from approvald.runtime import Engine, Meter
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import generate_latest

log = logging.getLogger("approvald.metrics")

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class PrometheusMeter(Meter):
    """The runtime's events as Prometheus counters and histograms, plus the database
    gauges refreshed on each scrape. One registry per process (tests make several)."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.decisions = Counter("approvald_decisions", "Decision attempts by outcome "
                                 "(approved, denied, redirected, voted, edited, "
                                 "refused:<reason>, ...)", ["outcome"], registry=r)
        self._decided: dict[str, Counter] = {}
        self.decision_seconds = Histogram("approvald_decision_seconds", "Time to record a "
                                          "decision (the click's answer waits for it)",
                                          buckets=LATENCY_BUCKETS, registry=r)
        self.tool_start_seconds = Histogram(
            "approvald_click_to_tool_start_seconds", "From a decision recorded here to the "
            "approved call starting here", buckets=LATENCY_BUCKETS, registry=r)
        self.expiries = Counter("approvald_expiries", "Requests expired by silence", registry=r)
        self.escalations = Counter("approvald_escalations", "Expired requests escalated to "
                                   "the next rung", registry=r)
        self.reminders = Counter("approvald_reminders", "Reminders sent", registry=r)
        self.takeovers = Counter("approvald_lease_takeovers", "Runs taken over from a worker "
                                 "whose lease had lapsed (expired, or its process is gone)",
                                 registry=r)
        self.key_refusals = Counter(
            "approvald_data_key_refusals", "Sealed values this process could not open (it "
            "lacks their data key, or they do not open under it): each part that needs one "
            "meets it again at its next turn until the key is given", registry=r)
        self.slack_errors = Counter("approvald_slack_api_errors", "Slack Web API calls that "
                                    "failed, by method and error", ["method", "error"],
                                    registry=r)
        self.runs = Gauge("approvald_runs", "Runs by status", ["status"], registry=r)
        self.pending = Gauge("approvald_pending_approvals", "Requests waiting for a "
                             "decision", registry=r)
        self.pending_age = Gauge("approvald_oldest_pending_approval_age_seconds",
                                 "Age of the oldest request waiting for a decision",
                                 registry=r)
        self.outbox = Gauge("approvald_outbox_backlog", "Deliveries to Slack not made yet",
                            registry=r)
        self.outbox_age = Gauge("approvald_outbox_oldest_age_seconds", "Age of the oldest "
                                "delivery not made yet", registry=r)
        self.dead = Gauge("approvald_dead_deliveries", "Deliveries given up (see `approvald "
                          "outbox list --dead`)", registry=r)

    # -- the runtime's events ------------------------------------------------------------
    def decision(self, outcome: str, seconds: float) -> None:
        # each outcome's child counter, looked up once (labels() is three Python calls)
        counter = self._decided.get(outcome)
        if counter is None:
            counter = self._decided[outcome] = self.decisions.labels(outcome=outcome)
        counter.inc()
        self.decision_seconds.observe(seconds)

    def tool_started(self, seconds: float) -> None:
        self.tool_start_seconds.observe(seconds)

    def data_key_refused(self) -> None:
        self.key_refusals.inc()

    def expired(self, n: int) -> None:
        self.expiries.inc(n)

    def escalated(self, n: int) -> None:
        self.escalations.inc(n)

    def reminded(self, n: int) -> None:
        self.reminders.inc(n)

    def lease_taken_over(self, n: int) -> None:
        self.takeovers.inc(n)

    def slack_error(self, method: str, error: str) -> None:
        self.slack_errors.labels(method=method or "unknown", error=error or "unknown").inc()

    # -- a scrape ------------------------------------------------------------------------
    async def refresh(self, engine: Engine) -> None:
        s = await engine.documents.figures()
        now = engine.now()
        self.runs.clear()
        for status, n in s.runs.items():
            self.runs.labels(status=status).set(n)
        self.pending.set(s.pending_approvals)
        self.pending_age.set(_age(now, s.oldest_pending_at))
        self.outbox.set(s.outbox_pending)
        self.outbox_age.set(_age(now, s.oldest_outbox_at))
        self.dead.set(s.outbox_dead)


def _age(now: datetime, since: datetime | None) -> float:
    return 0.0 if since is None else max(0.0, (now - since).total_seconds())


def slack_method(exc: BaseException) -> tuple[str, str]:
    """(method, error) of a failed Slack call, as far as the exception tells."""
    response = getattr(exc, "response", None)
    url = str(getattr(response, "api_url", "") or "")
    method = url.rstrip("/").rsplit("/", 1)[-1] if url else ""
    data = getattr(response, "data", None)
    error = data.get("error") if isinstance(data, dict) else None
    status = getattr(response, "status_code", None)
    return method, str(error or (f"http_{status}" if status else type(exc).__name__))


def add_routes(app: web.Application, readiness: Readiness,
               describe: Callable[[], dict[str, Any]]) -> None:
    """Add ``/healthz`` and ``/readyz`` to ``app``."""

    async def healthz(_request: web.Request) -> web.StreamResponse:
        return web.json_response({"ok": True, **describe()})

    async def readyz(_request: web.Request) -> web.StreamResponse:
        status, body = await readiness.check()
        return web.json_response(body, status=status)

    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)


def add_metrics_route(app: web.Application, engine: Engine, meter: PrometheusMeter) -> None:
    """Add ``/metrics`` to ``app`` (the metrics listener's)."""

    async def metrics(_request: web.Request) -> web.StreamResponse:
        try:
            await meter.refresh(engine)
        except Exception as exc:  # still serve the process's own counters
            log.warning("metrics: cannot read the database (%s: %s)", type(exc).__name__, exc)
        body = generate_latest(meter.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    app.router.add_get("/metrics", metrics)
