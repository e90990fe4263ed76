"""OpenTelemetry traces (docs/observability.md, "Traces"): the enqueuing request's trace context
is stored with the job (W3C traceparent in its metadata), and the handler runs in a span of
that trace, linked to the request's span, current in the handler (its own spans are children),
sync and async; a failed attempt's span has status ERROR."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from awa_django.telemetry.tracing import TRACEPARENT, use_tracer_provider
from awa_django.worker.config import build_config
from awa_django.worker.runtime import WorkerRuntime
from tests.jobs import observability as obsjobs
from tests.support.awa_schema import job_state
from tests.support.database import pg
from tests.support.polling import wait_for

pytestmark = [pytest.mark.usefixtures("clean_awa"), pytest.mark.worker]

_PROVIDER = TracerProvider()
_EXPORTER = InMemorySpanExporter()
_PROVIDER.add_span_processor(SimpleSpanProcessor(_EXPORTER))
# The handlers' own spans go through the global provider (set once per process).
trace.set_tracer_provider(_PROVIDER)


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    _EXPORTER.clear()
    use_tracer_provider(_PROVIDER)
    yield _EXPORTER
    use_tracer_provider(None, force=False)


def run_until_finalized(ids: list[int]) -> None:
    runtime = WorkerRuntime(build_config(queues=[("obs", 8)], concurrency=8), handle_signals=False)
    thread = threading.Thread(target=lambda: asyncio.run(runtime.run()))
    thread.start()

    def done() -> bool:
        with pg() as conn:
            return all(
                (s := job_state(conn, i)) is not None and s["state"] in ("completed", "failed")
                for i in ids
            )

    try:
        wait_for(done, timeout=30, message="the traced jobs to end")
    finally:
        runtime.request_stop()
        thread.join(30)


def test_a_request_and_the_jobs_it_enqueued_are_one_trace(spans: InMemorySpanExporter) -> None:
    untraced = obsjobs.says.enqueue(0)  # outside any span: no trace context stored
    with trace.get_tracer("tests").start_as_current_span("GET /orders") as request:
        sync_job = obsjobs.traced.enqueue(1)
        async_job = obsjobs.traced_async.enqueue(2)
        failing = obsjobs.fails.enqueue(3)  # two attempts: two spans of the trace, both ERROR
    context = request.get_span_context()
    with pg() as conn:
        metadata = job_state(conn, sync_job.id)["metadata"]  # type: ignore[index]
        assert job_state(conn, untraced.id)["metadata"] is None  # type: ignore[index]
    assert metadata[TRACEPARENT].startswith(f"00-{context.trace_id:032x}-{context.span_id:016x}-")
    run_until_finalized([untraced.id, sync_job.id, async_job.id, failing.id])
    finished = spans.get_finished_spans()
    jobs: dict[str, list[Any]] = {}
    for span in finished:
        if span.name == "process obs":
            jobs.setdefault(span.attributes["messaging.message.id"], []).append(span)
    for job in (sync_job, async_job, failing):
        for span in jobs[str(job.id)]:
            assert span.context.trace_id == context.trace_id  # one trace with the request
            assert span.parent is not None and span.parent.span_id == context.span_id
            assert [link.context.span_id for link in span.links] == [context.span_id]
            assert span.kind == trace.SpanKind.CONSUMER
            assert span.attributes["messaging.system"] == "awa"
            assert span.attributes["messaging.destination.name"] == "obs"
            assert span.attributes["awa.job.kind"] == job.kind
    [untraced_span] = jobs[str(untraced.id)]
    assert untraced_span.parent is None and untraced_span.context.trace_id != context.trace_id
    # The handlers' own spans are children of their job's span, sync and async.
    for name, job in (
        ("inside the sync handler", sync_job),
        ("inside the async handler", async_job),
    ):
        [inner] = [s for s in finished if s.name == name]
        [outer] = jobs[str(job.id)]
        assert inner.parent is not None and inner.parent.span_id == outer.context.span_id
        assert outer.attributes["awa.job.outcome"] == "completed"
    # Each attempt of the failing job is a span with status ERROR.
    attempts = sorted(jobs[str(failing.id)], key=lambda s: s.attributes["awa.job.attempt"])
    assert [s.attributes["awa.job.attempt"] for s in attempts] == [1, 2]
    assert all(s.status.status_code == trace.StatusCode.ERROR for s in attempts)
    assert [s.attributes["error.type"] for s in attempts] == ["ValueError", "ValueError"]
    assert [s.attributes["awa.job.outcome"] for s in attempts] == ["retry", "retry"]
