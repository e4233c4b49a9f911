"""OpenTelemetry traces for ``serve``, off unless the standard ``OTEL_*`` variables ask
for them (the spans themselves are described in ``runtime/record/tracing.py``).

Tracing is on when ``OTEL_TRACES_EXPORTER`` names an exporter (``otlp``, ``console``, or
both, comma-separated; ``none`` turns it off), or, with that variable unset, when an OTLP
endpoint is set (``OTEL_EXPORTER_OTLP_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``).
``OTEL_SDK_DISABLED=true`` turns it off whatever else is set. OTLP goes over HTTP with
protobuf (``opentelemetry-exporter-otlp-proto-http``, in the ``otel`` extra),
configured by its own ``OTEL_EXPORTER_OTLP_*`` variables; the service is named by
``OTEL_SERVICE_NAME`` (default ``approvald``) and ``OTEL_RESOURCE_ATTRIBUTES``; sampling
and batching follow ``OTEL_TRACES_SAMPLER*`` and ``OTEL_BSP_*``. Tracing asked for without
the packages it needs stops start-up with one line naming the variable.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from approvald.bot.install import install_command
from approvald.runtime import ConfigError, OtelTracer, Tracer

if TYPE_CHECKING:  # imported when tracing is on, not before (see from_environment)
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter

log = logging.getLogger("approvald.tracing")

ENDPOINTS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
# what turns tracing on (the SDK reads the rest of OpenTelemetry's own variables itself)
ENVIRONMENT = {
    "OTEL_TRACES_EXPORTER": "`otlp`, `console` (comma-separated) or `none`: turns "
                            "OpenTelemetry tracing on for `serve` (needs the `otel` extra)",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "an OTLP/HTTP endpoint for spans; set, it turns "
                                          "tracing on (else `OTEL_EXPORTER_OTLP_ENDPOINT`)",
    "OTEL_EXPORTER_OTLP_ENDPOINT": "an OTLP/HTTP endpoint; set, it turns tracing on",
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "`http/protobuf` if set (else "
                                          "`OTEL_EXPORTER_OTLP_PROTOCOL`): approvald exports "
                                          "OTLP over HTTP only; another value stops serve "
                                          "with one line",
    "OTEL_EXPORTER_OTLP_PROTOCOL": "read when `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL` is not set",
    "OTEL_SDK_DISABLED": "`true` turns tracing off whatever else is set. The SDK's other "
                         "`OTEL_*` variables (service name, headers, sampling, batching) "
                         "apply as OpenTelemetry documents them",
}


@dataclass
class Tracing:
    """The tracer ``serve`` gives its engine, and how to flush what it holds at exit."""

    tracer: Tracer
    provider: TracerProvider | None = None  # when tracing is on

    async def shutdown(self, *, within: float = 3.0) -> None:
        """Export what is still buffered, waiting at most ``within`` seconds (an exporter
        that cannot reach its collector does not hold up the exit; its spans are lost)."""
        if self.provider is None:
            return
        provider, self.provider = self.provider, None
        flusher = threading.Thread(target=provider.shutdown, name="otel-shutdown",
                                   daemon=True)
        flusher.start()
        await asyncio.to_thread(flusher.join, within)


def exporters_asked(env: Mapping[str, str]) -> tuple[str, list[str]]:
    """The variable that turned tracing on and the exporters it names ([] when off)."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return "OTEL_SDK_DISABLED", []
    names = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if names:
        chosen = [n.strip() for n in names.split(",") if n.strip() and n.strip() != "none"]
        return "OTEL_TRACES_EXPORTER", chosen
    for var in ENDPOINTS:
        if env.get(var, "").strip():
            return var, ["otlp"]
    return "", []


def from_environment(env: Mapping[str, str] | None = None) -> Tracing:
    """A :class:`Tracing` as the ``OTEL_*`` variables say: off (a tracer that records
    nothing) unless they ask for an exporter. Raises :class:`ConfigError` when they ask
    for one that is unknown or not installed."""
    env = os.environ if env is None else env
    var, names = exporters_asked(env)
    if not names:
        return Tracing(Tracer())
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        raise ConfigError(f"{var}: tracing needs OpenTelemetry's SDK: "
                          f"{install_command('otel')}") from None
    exporters = [_exporter(var, name, env) for name in names]
    resource = Resource.create()
    if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
        resource = resource.merge(Resource({"service.name": "approvald"}))
    provider = TracerProvider(resource=resource, shutdown_on_exit=False)  # Service.stop
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    log.info("tracing on: exporting spans to %s (%s)", ", ".join(names), var)
    return Tracing(OtelTracer(provider), provider)


def _exporter(var: str, name: str, env: Mapping[str, str]) -> SpanExporter:
    if name == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    if name != "otlp":
        raise ConfigError(f"OTEL_TRACES_EXPORTER: unknown exporter {name!r} "
                          "(approvald supports otlp, console and none)")
    for protocol_var in ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"):
        protocol = env.get(protocol_var, "").strip()
        if protocol:
            if protocol != "http/protobuf":
                raise ConfigError(f"{protocol_var}: approvald exports OTLP as http/protobuf "
                                  f"only, not {protocol!r}")
            break
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    except ImportError:
        raise ConfigError(f"{var}: the OTLP exporter is not installed: "
                          f"{install_command('otel')}") from None
    otlp: SpanExporter = OTLPSpanExporter()  # a SpanExporter (unchecked: not in dev)
    return otlp
