"""Helpers for your own tests: run enqueued jobs in-process, inside the test's transaction.

``drain()`` works in a plain ``django.test.TestCase`` (or a pytest-django ``db`` test): it claims
through the same Django connection, so it sees jobs your test enqueued and has not committed,
runs each handler in the calling thread, and writes the outcome through the engine's normal
fenced finalization. No worker process, no commit needed::

    from awa_django.testing import drain

    def test_signup_sends_welcome(self):
        signup(email="a@example.com")   # enqueues send_welcome in its atomic block
        [run] = drain("emails")
        assert run.outcome == "completed" and run.result == "sent"

Retries and snoozes land in the deferred plane as they would in production; ``drain()`` does not
run them again (call your handler's ``.call()`` to unit-test it directly).
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Iterable
from typing import Any

from asgiref.sync import async_to_sync
from django.db import connections

from awa_django.conf import get_awa_settings
from awa_django.context import JobContext
from awa_django.db.storage import ClaimedJob, Finalization, finalize_statement
from awa_django.sql import query
from awa_django.worker.finalizations import outcome_of
from awa_django.worker.prepared import prepare

__all__ = ["JobRun", "drain"]

_TEST_WORKER = uuid.UUID("00000000-0000-0000-0000-0000000000aa")


@dataclasses.dataclass(frozen=True, slots=True)
class JobRun:
    """One job ``drain()`` ran: its id, kind, queue, the outcome written (``completed``,
    ``retry``, ``snooze``, ``cancel``, ``fail``, ``wait``), the decoded result and the error."""

    id: int
    kind: str
    queue: str
    outcome: str
    result: Any = None
    error: dict[str, Any] | None = None


def drain(
    queues: str | Iterable[str] | None = None, *, using: str | None = None, max_jobs: int = 1000
) -> list[JobRun]:
    """Run every available job of ``queues`` (default: all) in-process until none is left or
    ``max_jobs`` ran; return what happened to each, in the order they ran.

    A queue's and a job kind's flow limits (docs/flow.md) apply: a job's permits and serial
    key are handed back when it ends (the key to its next job, which a later round runs), and
    jobs a rate limit holds back (of a queue, or parked by their kind's) are left for a later
    call."""
    cfg = get_awa_settings()
    connection = connections[using or cfg.DATABASE_ALIAS]
    names = [queues] if isinstance(queues, str) else list(queues) if queues else None
    runs: list[JobRun] = []
    with connection.cursor() as cursor:
        if names is None:
            cursor.execute(query("queues_known"))
            names = [row[0] for row in cursor.fetchall()]
        progress = True
        while progress and len(runs) < max_jobs:
            progress = False
            for queue in names:
                # No deadline, max weight, or permits and serial keys held or handed back.
                cursor.execute(
                    query("claim"),
                    [queue, 1, _TEST_WORKER, cfg.PRIORITY_AGING_INTERVAL, *([None] * 6)],
                )
                row = cursor.fetchone()
                if row is None or row[0] is None:
                    continue  # nothing to run, or the queue's flow limits hold it back
                progress = True
                fields = dict(zip([c.name for c in cursor.description], row, strict=True))
                # Django's adapters hand jsonb back as text.
                for name in ("progress", "metadata", "errors"):
                    if isinstance(fields[name], str):
                        fields[name] = json.loads(fields[name])
                job = ClaimedJob(**fields)
                try:
                    runs.append(_run(cursor, job, cfg))
                finally:
                    if job.permits:  # the queue's global-concurrency permits (docs/flow.md)
                        cursor.execute(query("flow_release"), [job.permits])
                    if job.serial_lock is not None:  # handed on to the key's next job
                        cursor.execute(query("serial_release"), [[job.serial_lock]])
                if len(runs) >= max_jobs:
                    break
    return runs


def _run(cursor: Any, job: ClaimedJob, cfg: Any) -> JobRun:
    registered: list[uuid.UUID] = []

    def register(ctx: JobContext, callback_id: uuid.UUID) -> None:
        cursor.execute(query("callback_register"), [ctx.id, ctx.run_lease, callback_id])
        cursor.fetchall()
        registered.append(callback_id)

    ctx = JobContext.for_job(job, registrar=register)
    attempt = prepare(job, ctx)
    value: Any = None
    exc: BaseException | None = None
    if attempt.failure is None:
        assert attempt.handle is not None
        try:
            func = attempt.handle.func
            value = (async_to_sync(func) if attempt.handle.is_async else func)(
                *attempt.call_args(), **attempt.kwargs
            )
        except KeyboardInterrupt:
            raise  # in a test run, most likely the developer's Ctrl-C
        except BaseException as error:  # SystemExit, CancelledError...: the job fails
            exc = error
    outcome: Finalization = outcome_of(
        attempt,
        value=value,
        exc=exc,
        result_max_bytes=cfg.RESULT_MAX_BYTES,
        max_depth=cfg.JSON_MAX_DEPTH,
        has_state=bool(registered),
        progress_json=ctx.progress_json if ctx.progress_set else None,
        backoff_base=cfg.RETRY_BACKOFF_BASE,
    )
    cursor.execute(finalize_statement([outcome]), [Finalization.batch_json([outcome])])
    cursor.fetchall()
    result = json.loads(outcome.result_json) if outcome.result_json is not None else None
    reported = outcome.outcome
    if reported == "retry" and job.attempt >= job.max_attempts:
        reported = "fail"  # no attempt left: the database fails it (or dead-letters it)
    return JobRun(job.job_id, job.kind, job.queue, reported, result, outcome.error)
