"""Traces of what the runtime does, for whoever exports them (``bot/tracing.py`` turns
them on for ``serve`` from the standard ``OTEL_*`` variables). The runtime only calls the
methods of :class:`Tracer`; the default one records nothing and imports nothing, so the
runtime depends on no tracing library and pays nothing when tracing is off.

Spans (names and attributes are the exporter's contract; attributes are prefixed
``approvald.``):

* ``run.step``: one iteration of the agent loop (``run_id``, ``agent``, ``step``);
* ``model.call``: the model producing a step's reply (``model``, ``instructions_version``);
* ``tool.call``: one tool invocation through the ledger (``tool``, ``call_id``,
  ``idempotency_key``, ``policy``, ``approval_id``, ``status``);
* ``approval.decision``: one decision attempt (``approval_id``, ``verdict``, ``actor``,
  ``outcome``, ``run_id``, ``run_ready``);
* ``approval.wait``: a request's life from ``requested_at`` to its decision, recorded
  when the decision is made (a child of the decision: it starts before its parent).

A decision that makes a run ready is remembered, per run, by :meth:`Tracer.remember`; the
next advance of that run *in this process* parents its steps on it, so the click, its
decision and the resumed run's steps and tool calls form one trace. A decision also
stores its span's context with the request (:meth:`Tracer.traceparent`, the W3C
``traceparent`` string, in ``approvals.decision_trace``), so a run resumed by another
process (the deciding replica died first, say) starts a trace of its own whose step
*links* the decision that resolved its call, or the answer about its unknown outcome
(:meth:`Tracer.link`, with the link attribute ``approvald.approval_id``). Its spans
carry the same ``approvald.run_id`` too.
"""

from __future__ import annotations

import contextlib
import traceback
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager
from contextvars import Token
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

from approvald.runtime.policies.sensitive import mask_text

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Span as OtelSpan
    from opentelemetry.trace import TracerProvider

Value = str | bool | int | float
PREFIX = "approvald."


class Span:
    """A span being recorded; this one drops what it is told."""

    def set(self, **attributes: Value | None) -> None:
        """Add attributes (``None`` values are left out)."""


class Steps:
    """The ``run.step`` spans of one advance of a run: one open at a time."""

    def next(self, **attributes: Value | None) -> Span:
        """End the current step's span, if any, and start the next one."""
        return _NOOP_SPAN


_NOOP_SPAN = Span()
_NOOP_STEPS = Steps()
H = TypeVar("H")


class _Holding(AbstractContextManager[H]):
    """``with``: ``held``, and nothing else done. What the tracer that records nothing
    opens around a decision, a model call, a run's steps: entered and left with two
    calls, not a generator's five (issue 50). Shared: it keeps nothing of a use."""

    __slots__ = ("_held",)

    def __init__(self, held: H) -> None:
        self._held = held

    def __enter__(self) -> H:
        return self._held

    def __exit__(self, *_exc: object) -> None:
        return None


_NOOP_SPAN_BLOCK = _Holding(_NOOP_SPAN)
_NOOP_STEPS_BLOCK = _Holding(_NOOP_STEPS)


class Tracer:
    """Records nothing; subclass and override to export (see :class:`OtelTracer`)."""

    enabled = False

    def span(self, name: str, **attributes: Value | None) -> AbstractContextManager[Span]:
        """A span around the block, a child of the current one (an escaping exception is
        recorded on it)."""
        return _NOOP_SPAN_BLOCK

    def interval(self, name: str, *, start: datetime, end: datetime,
                 **attributes: Value | None) -> None:
        """A span that already happened, from ``start`` to ``end``, under the current one."""

    def remember(self, run_id: str) -> None:
        """The current span is where ``run_id``'s next advance in this process goes on."""

    def traceparent(self) -> str | None:
        """The current span as a W3C ``traceparent``, to store with what it decided (None
        when nothing is recorded)."""
        return None

    def link(self, traceparent: str, **attributes: Value | None) -> None:
        """Link the current span to the stored span ``traceparent`` names, unless that
        span is in the current trace already (its parent, say)."""

    def steps(self, run_id: str) -> AbstractContextManager[Steps]:
        """The step spans of one advance of ``run_id``: children of the span remembered
        for it (then forgotten), else of the current one."""
        return _NOOP_STEPS_BLOCK


def _attributes(attributes: Mapping[str, Value | None]) -> dict[str, Value]:
    # attributes are ids and names; masked anyway, as everything a collector keeps
    return {PREFIX + k: mask_text(v) if isinstance(v, str) else v
            for k, v in attributes.items() if v is not None}


def _record(span: OtelSpan, exc: BaseException) -> None:
    """Record ``exc`` on ``span`` as OpenTelemetry would, its message and stack trace with
    what the detectors find masked (an error may quote a tool's arguments)."""
    from opentelemetry import trace

    span.record_exception(exc, attributes={
        "exception.message": mask_text(str(exc)),
        "exception.stacktrace": mask_text("".join(traceback.format_exception(exc)))})
    span.set_status(trace.Status(trace.StatusCode.ERROR, type(exc).__name__))


def _ns(at: datetime) -> int:
    return int(at.timestamp() * 1_000_000_000)


class _Span(Span):
    def __init__(self, span: OtelSpan) -> None:
        self._span = span

    def set(self, **attributes: Value | None) -> None:
        self._span.set_attributes(_attributes(attributes))


class _Steps(Steps):
    def __init__(self, tracer: OtelTracer, parent: Context | None) -> None:
        self._tracer = tracer
        self._parent = parent
        self._open: tuple[OtelSpan, Token[Context]] | None = None

    def next(self, **attributes: Value | None) -> Span:
        from opentelemetry import context, trace

        self.close()
        span = self._tracer.otel.start_span("run.step", context=self._parent,
                                            attributes=_attributes(attributes))
        self._open = (span, context.attach(trace.set_span_in_context(span)))
        return _Span(span)

    def close(self, exc: BaseException | None = None) -> None:
        if self._open is None:
            return
        from opentelemetry import context

        span, token = self._open
        self._open = None
        context.detach(token)
        if exc is not None:
            _record(span, exc)
        span.end()


class OtelTracer(Tracer):
    """Spans through OpenTelemetry's API, on ``provider`` (default: the global one).

    Needs ``opentelemetry-api`` (the ``otel`` extra); what is exported, and
    where, is the provider's business.
    """

    enabled = True

    def __init__(self, provider: TracerProvider | None = None, *, keep: int = 10_000) -> None:
        from opentelemetry import trace

        self.otel = trace.get_tracer("approvald", tracer_provider=provider)
        self.keep = keep
        self._resume: OrderedDict[str, Context] = OrderedDict()

    @contextlib.contextmanager
    def span(self, name: str, **attributes: Value | None) -> Iterator[Span]:
        with self.otel.start_as_current_span(name, attributes=_attributes(attributes),
                                             record_exception=False,
                                             set_status_on_exception=False) as s:
            try:
                yield _Span(s)
            except BaseException as exc:
                _record(s, exc)
                raise

    def interval(self, name: str, *, start: datetime, end: datetime,
                 **attributes: Value | None) -> None:
        span = self.otel.start_span(name, attributes=_attributes(attributes),
                                    start_time=_ns(start))
        span.end(end_time=max(_ns(end), _ns(start)))

    def remember(self, run_id: str) -> None:
        from opentelemetry import context

        self._resume[run_id] = context.get_current()
        self._resume.move_to_end(run_id)
        while len(self._resume) > self.keep:
            self._resume.popitem(last=False)

    def traceparent(self) -> str | None:
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        carrier: dict[str, str] = {}
        TraceContextTextMapPropagator().inject(carrier)  # nothing without a valid span
        return carrier.get("traceparent")

    def link(self, traceparent: str, **attributes: Value | None) -> None:
        from opentelemetry import trace
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        stored = trace.get_current_span(
            TraceContextTextMapPropagator().extract({"traceparent": traceparent}))
        linked = stored.get_span_context()
        current = trace.get_current_span()
        if not linked.is_valid or not current.is_recording() \
                or current.get_span_context().trace_id == linked.trace_id:
            return
        current.add_link(linked, _attributes(attributes))

    @contextlib.contextmanager
    def steps(self, run_id: str) -> Iterator[Steps]:
        steps = _Steps(self, self._resume.pop(run_id, None))
        try:
            yield steps
        except BaseException as exc:
            steps.close(exc)
            raise
        steps.close()


def model_name(model: Any) -> str:
    """What a span calls a model: its ``model`` attribute if it is a string (an OpenAI
    model's name, say), else its class."""
    name = getattr(model, "model", None)
    return name if isinstance(name, str) else type(model).__name__
