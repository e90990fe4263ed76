"""``drain()``: run enqueued jobs in-process, inside the test's transaction.

It claims through the test's own Django connection, so it sees jobs the test enqueued and has
not committed, runs each handler in the calling thread, and writes the outcome through the
engine's normal fenced finalization. The test's transaction is never the handler's: a
savepoint is set in it before each handler runs, and only a transaction the handler leaves
open is rolled back (back to that savepoint), failing the job with ``TransactionLeftOpen`` as a
worker would.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Iterable
from typing import Any, cast

from django.db import connections

from awa_django.conf import get_awa_settings
from awa_django.context import JobContext
from awa_django.db.storage import ClaimedJob, Finalization, finalize_statement
from awa_django.db.transactions import (
    checked_alias,
)
from awa_django.exceptions import IsolationLevelError
from awa_django.limits import check_queue_name
from awa_django.sql import query
from awa_django.testing.handler_call import call_handler
from awa_django.worker.finalizations import outcome_of
from awa_django.worker.prepared import prepare

__all__ = ["JobRun", "drain", "kind_names"]

_TEST_WORKER = uuid.UUID("00000000-0000-0000-0000-0000000000aa")
_PROMOTE_BATCH = 4096


@dataclasses.dataclass(frozen=True, slots=True)
class JobRun:
    """One job ``drain()`` ran: its id, kind, queue, the outcome written (``completed``,
    ``retry``, ``snooze``, ``cancel``, ``fail``, ``wait``), the decoded result (a task's return
    value, as ``get_result(...).return_value`` reads it) and the error."""

    id: int
    kind: str
    queue: str
    outcome: str
    result: Any = None
    error: dict[str, Any] | None = None


def drain(
    queues: str | Iterable[str] | None = None,
    *,
    kinds: object = None,
    with_scheduled: bool = False,
    using: str | None = None,
    max_jobs: int = 1000,
) -> list[JobRun]:
    """Run every available job of ``queues`` (default: all) in-process until none is left or
    ``max_jobs`` ran; return what happened to each, in the order they ran. Jobs the handlers
    enqueue run in the same call.

    ``kinds`` (a kind's name, a ``@job`` function or a django.tasks ``Task``, or a list of
    them) runs only jobs of those kinds: a job of another kind at the head of a queue is set
    aside and put back when the call ends, behind the queue's other jobs, its attempts
    unchanged. ``with_scheduled=True`` also runs scheduled jobs and retries as if their time
    had come, again and again until none is left (a job that always fails runs until its
    attempts are spent).

    A queue's and a job kind's flow limits (docs/flow.md) apply: a job's permits and serial
    key are handed back when it ends (the key to its next job, which a later round runs), and
    jobs a rate limit holds back (of a queue, or parked by their kind's) are left for a later
    call. Raises ``TypeError`` or ``ValueError`` for a bad argument, with nothing run."""
    if isinstance(max_jobs, bool) or not isinstance(max_jobs, int) or max_jobs < 0:
        raise ValueError(f"max_jobs must be an int of at least 0, got {max_jobs!r}")
    if not isinstance(with_scheduled, bool):
        raise TypeError(f"with_scheduled must be a bool, got {with_scheduled!r}")
    wanted = kind_names(kinds)
    cfg = get_awa_settings()
    alias = checked_alias(using or cfg.DATABASE_ALIAS)
    names = _queue_names(queues)
    _check_isolation(alias)
    if names is None:
        with connections[alias].cursor() as cursor:
            cursor.execute(query("queues_known"))
            names = [row[0] for row in cursor.fetchall()]
    runs: list[JobRun] = []
    aside: list[bool] = []
    try:
        while True:
            ran = len(runs)
            # What the leader would have made available: jobs due by now (the wall clock's:
            # a test's transaction keeps the time it began), and with_scheduled all of them.
            _make_due(alias, names, wanted, "testing_make_due" if with_scheduled else "testing_due")
            _round(alias, names, wanted, cfg, runs, max_jobs, aside)
            if aside:
                aside.clear()
                _promote(alias)  # the jobs of other kinds, back into their queues
            if not with_scheduled or len(runs) == ran or len(runs) >= max_jobs:
                return runs
    finally:
        if aside:  # interrupted (Ctrl-C): the jobs set aside go back all the same
            _promote(alias)


def _check_isolation(alias: str) -> None:
    """``IsolationLevelError`` unless the alias's transactions run at READ COMMITTED, as the
    claim needs: before anything is sent, the transaction stays usable."""
    with connections[alias].cursor() as cursor:
        cursor.execute(query("isolation"))
        row = cursor.fetchone()
    level = str(row[0]) if row else ""
    if level not in ("read committed", "read uncommitted"):
        raise IsolationLevelError(
            f"drain() claims jobs, which needs READ COMMITTED, but {alias!r} runs at "
            f"{level.upper()}"
        )


def kind_names(kinds: object) -> frozenset[str] | None:
    """The job kinds ``kinds`` names (None: every kind): a kind's name, a ``@job`` function,
    a django.tasks ``Task``, or a list, tuple or set of them."""
    if kinds is None:
        return None
    items = kinds if isinstance(kinds, list | tuple | set | frozenset) else [kinds]
    names = set()
    for item in items:
        name = item if isinstance(item, str) else getattr(item, "kind", None)
        if name is None:
            name = getattr(item, "module_path", None)  # a django.tasks Task
        if not isinstance(name, str) or not name:
            raise TypeError(
                f"a job kind is its name (str), a @job function or a django.tasks Task, "
                f"not {item!r}"
            )
        names.add(name)
    return frozenset(names)


def _queue_names(queues: str | Iterable[str] | None) -> list[str] | None:
    """The queues named (None: every queue); a name that is not a queue's is refused."""
    if queues is None:
        return None
    if isinstance(cast(object, queues), bytes | bytearray):
        raise TypeError(f"queues are named by str, not {type(queues).__name__}")
    names = [queues] if isinstance(queues, str) else list(queues)
    for name in names:
        if not isinstance(name, str):
            raise TypeError(f"a queue is named by a str, not {name!r}")
        check_queue_name(name)
    return names


def _round(
    alias: str,
    names: list[str],
    wanted: frozenset[str] | None,
    cfg: Any,
    runs: list[JobRun],
    max_jobs: int,
    aside: list[bool],
) -> None:
    """Run the queues' available jobs until none is left; ``aside`` gets an entry as soon as
    one is set aside."""
    progress = True
    while progress and len(runs) < max_jobs:
        progress = False
        for queue in names:
            job = _claim(alias, queue, cfg)
            if job is None:
                continue  # nothing to run, or the queue's flow limits hold it back
            progress = True
            try:
                if wanted is not None and job.kind not in wanted:
                    aside.append(True)
                    _set_aside(alias, job)
                else:
                    runs.append(_run(alias, job, cfg))
            finally:
                # A cursor of its own: the handler may have replaced the connection.
                with connections[alias].cursor() as cursor:
                    if job.permits:  # the queue's global-concurrency permits (docs/flow.md)
                        cursor.execute(query("flow_release"), [job.permits])
                    if job.serial_lock is not None:  # handed on to the key's next job
                        cursor.execute(query("serial_release"), [[job.serial_lock]])
            if len(runs) >= max_jobs:
                break


def _set_aside(alias: str, job: ClaimedJob) -> None:
    """Put a claimed job of a kind the caller did not ask for aside, as a snooze of no delay
    does: scheduled again now, its attempt not counted."""
    snooze = Finalization(job.job_id, job.run_lease, job.claim_slot, "snooze", delay=0.0)
    with connections[alias].cursor() as cursor:
        cursor.execute(finalize_statement([snooze]), [Finalization.batch_json([snooze])])
        cursor.fetchall()


def _make_due(alias: str, names: list[str], wanted: frozenset[str] | None, statement: str) -> None:
    """Bring the queues' deferred jobs (of the wanted kinds) to now: those due by the wall
    clock (``testing_due``), or all of them (``testing_make_due``); then promote."""
    if names:
        kinds = None if wanted is None else sorted(wanted)
        with connections[alias].cursor() as cursor:
            cursor.execute(query(statement), {"queues": names, "kinds": kinds})
    _promote(alias)


def _promote(alias: str) -> None:
    """Move every due scheduled job and retry into its queue (as the maintenance leader
    does)."""
    with connections[alias].cursor() as cursor:
        while True:
            cursor.execute(query("promote"), [_PROMOTE_BATCH])
            row = cursor.fetchone()
            if row is None or row[0] < _PROMOTE_BATCH:
                return


def _claim(alias: str, queue: str, cfg: Any) -> ClaimedJob | None:
    """The next job of ``queue``, claimed through the ``alias`` connection, or None."""
    with connections[alias].cursor() as cursor:
        # No deadline, max weight, or permits and serial keys held or handed back.
        cursor.execute(
            query("claim"),
            [queue, 1, _TEST_WORKER, cfg.PRIORITY_AGING_INTERVAL, *([None] * 6)],
        )
        row = cursor.fetchone()
        if row is None or row[0] is None:
            return None
        fields = dict(zip([c.name for c in cursor.description], row, strict=True))
    # Django's adapters hand jsonb back as text.
    for name in ("progress", "metadata", "errors"):
        if isinstance(fields[name], str):
            fields[name] = json.loads(fields[name])
    return ClaimedJob(**fields)


def _is_task(job: ClaimedJob) -> bool:
    """Whether ``job`` is a django.tasks task (its arguments carry a task document)."""
    try:
        document = json.loads(job.args_json)
    except ValueError:
        return False
    return isinstance(document, dict) and document.get("task") is not None


def _run(alias: str, job: ClaimedJob, cfg: Any) -> JobRun:
    registered: list[uuid.UUID] = []

    def register(ctx: JobContext, callback_id: uuid.UUID) -> None:
        with connections[alias].cursor() as cursor:
            cursor.execute(query("callback_register"), [ctx.id, ctx.run_lease, callback_id])
            cursor.fetchall()
        registered.append(callback_id)

    ctx = JobContext.for_job(job, registrar=register)
    attempt = prepare(job, ctx)
    value: Any = None
    exc: BaseException | None = None
    if attempt.failure is None:
        assert attempt.handle is not None
        value, exc = call_handler(attempt)
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
    with connections[alias].cursor() as cursor:
        cursor.execute(finalize_statement([outcome]), [Finalization.batch_json([outcome])])
        cursor.fetchall()
    result = json.loads(outcome.result_json) if outcome.result_json is not None else None
    if result is not None and _is_task(job):
        from awa_django.backends.stored import unwrap_result  # needs django.tasks

        result, _ = unwrap_result(result)  # the task's return value, as get_result reads it
    reported = outcome.outcome
    if reported == "retry" and job.attempt >= job.max_attempts:
        reported = "fail"  # no attempt left: the database fails it (or dead-letters it)
    if isinstance(exc, KeyboardInterrupt):
        raise exc  # in a test run, most likely the developer's Ctrl-C: its outcome is written
    return JobRun(job.job_id, job.kind, job.queue, reported, result, outcome.error)
