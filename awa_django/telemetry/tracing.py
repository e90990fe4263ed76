"""OpenTelemetry traces (``AWA["OTEL_TRACES"]``): a job carries the trace of the code that
enqueued it, and its handler runs in a span of that trace.

* At enqueue (every producer path goes through ``build_request``), the current trace context is
  written into the job's metadata in W3C Trace Context form, under the reserved keys
  ``awa:traceparent`` (and ``awa:tracestate`` when there is one), through the global text map
  propagator. Nothing is added outside a recording span.
* The worker runs each attempt's handler in a span ``process <queue>`` (kind CONSUMER, the
  messaging semantic conventions' attributes), whose parent is the enqueuing span and which
  also links to it: the request and the jobs it caused are one trace. A retried attempt is
  another span of the same trace. The span is current in the handler (its own spans are
  children of it, sync or async); it ends when the handler returns or raises, with status
  ERROR and the exception's type when the attempt failed.

With traces off nothing here imports OpenTelemetry: the producer and the worker each test one
``is None``.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from awa_django._version import __version__
from awa_django.conf import get_awa_settings

if TYPE_CHECKING:
    from opentelemetry.trace import Span, TracerProvider

    from awa_django.db.storage import ClaimedJob, Finalization

__all__ = [
    "TRACEPARENT",
    "TRACESTATE",
    "Tracing",
    "active_tracing",
    "attach_span",
    "detach_span",
    "use_tracer_provider",
]

#: The metadata keys of the enqueuing trace.
TRACEPARENT = "awa:traceparent"
TRACESTATE = "awa:tracestate"


class Tracing:
    """The worker's and the producer's side of traces, for one tracer provider."""

    def __init__(self, provider: TracerProvider | None = None) -> None:
        from opentelemetry import context as otel_context
        from opentelemetry import propagate, trace

        self._trace = trace
        self._context = otel_context
        self._propagate = propagate
        self.tracer = (provider or trace.get_tracer_provider()).get_tracer(
            "awa_django", __version__
        )

    def metadata(self) -> dict[str, str]:
        """The current trace context as job metadata (empty outside a recording span)."""
        if not self._trace.get_current_span().get_span_context().is_valid:
            return {}
        carrier: dict[str, str] = {}
        self._propagate.inject(carrier)
        found = {}
        if "traceparent" in carrier:
            found[TRACEPARENT] = carrier["traceparent"]
            if carrier.get("tracestate"):
                found[TRACESTATE] = carrier["tracestate"]
        return found

    def start(self, job: ClaimedJob) -> Span:
        """The span of one attempt, started now (not current anywhere yet)."""
        trace = self._trace
        parent = None
        links = []
        metadata = job.metadata
        if isinstance(metadata, dict) and isinstance(metadata.get(TRACEPARENT), str):
            carrier = {"traceparent": metadata[TRACEPARENT]}
            if isinstance(metadata.get(TRACESTATE), str):
                carrier["tracestate"] = metadata[TRACESTATE]
            parent = self._propagate.extract(carrier)
            enqueued = trace.get_current_span(parent).get_span_context()
            if enqueued.is_valid:
                links.append(trace.Link(enqueued))
            else:
                parent = None
        return self.tracer.start_span(
            f"process {job.queue}",
            context=parent if parent is not None else self._context.Context(),
            kind=trace.SpanKind.CONSUMER,
            links=links,
            attributes={
                "messaging.system": "awa",
                "messaging.operation.name": "process",
                "messaging.operation.type": "process",
                "messaging.destination.name": job.queue,
                "messaging.message.id": str(job.job_id),
                "awa.job.kind": job.kind,
                "awa.job.attempt": job.attempt,
                "awa.job.run_lease": job.run_lease,
            },
        )

    def attach(self, span: Span) -> object:
        """Make ``span`` current in this context (a token for :meth:`detach`)."""
        return self._context.attach(self._trace.set_span_in_context(span))

    def detach(self, token: object) -> None:
        self._context.detach(token)  # type: ignore[arg-type]

    def end(self, span: Span, outcome: Finalization, exc: BaseException | None) -> None:
        """End an attempt's span with its outcome (never raises)."""
        try:
            span.set_attribute("awa.job.outcome", outcome.outcome)
            error = outcome.error
            if error is not None and outcome.outcome in ("retry", "fail"):
                from opentelemetry.trace import Status, StatusCode

                span.set_attribute("error.type", str(error.get("type", "error")))
                span.set_status(Status(StatusCode.ERROR, str(error.get("message", ""))[:500]))
                if exc is not None and isinstance(exc, Exception):
                    span.record_exception(exc)
            span.end()
        except Exception:  # pragma: no cover - a broken exporter must not lose the outcome
            pass


_tracing: Tracing | None = None
_provider: Any = None
_forced = False
_lock = threading.Lock()


def use_tracer_provider(provider: TracerProvider | None, *, force: bool = True) -> None:
    """Trace into ``provider`` from now on (None: the global one), with traces on whatever
    ``AWA["OTEL_TRACES"]`` says when ``force`` (for tests and for processes that set up
    tracing in code)."""
    global _tracing, _provider, _forced
    with _lock:
        _provider, _forced, _tracing = provider, force, None


def active_tracing() -> Tracing | None:
    """This process's :class:`Tracing` when traces are on (made on first use), else None."""
    global _tracing
    if not (_forced or get_awa_settings().OTEL_TRACES):
        return None
    found = _tracing
    if found is not None:
        return found
    with _lock:
        if _tracing is None:
            try:
                _tracing = Tracing(_provider)
            except ImportError as exc:
                from django.core.exceptions import ImproperlyConfigured

                raise ImproperlyConfigured(
                    "AWA['OTEL_TRACES'] needs OpenTelemetry: pip install 'awa-django[otel]' "
                    f"({exc})"
                ) from exc
        return _tracing


def attach_span(span: Span) -> object:
    """Make ``span`` current in this context (a sync handler's thread); a token for
    :func:`detach_span`. Only called when traces are on."""
    from opentelemetry import context as otel_context
    from opentelemetry import trace

    return otel_context.attach(trace.set_span_in_context(span))


def detach_span(token: object) -> None:
    from opentelemetry import context as otel_context

    otel_context.detach(token)  # type: ignore[arg-type]
