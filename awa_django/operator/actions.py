"""Operator actions: every change an operator, the admin or a command makes to jobs and queues.

Guarantees:

* **Atomic.** Each action runs through ``write_transaction``: in the caller's transaction when
  there is one (an atomic block, or autocommit off), it joins it and commits or rolls back with
  it; in autocommit it is one transaction of its own. ``queue_drain`` outside a transaction is
  the one exception by design: one short transaction per batch of ``DRAIN_BATCH`` jobs.
* **READ COMMITTED where the engine needs it.** ``cancel``, ``resolve_callback``,
  ``extend_callback`` and each
  ``queue_drain`` batch call engine functions that lock and then re-read: a transaction of
  their own is set to READ COMMITTED whatever the alias's default, and a caller's transaction
  at another level gets ``IsolationLevelError`` before anything is written (it stays usable).
  ``dlq_retry`` too (a unique job takes its key again). ``queue_pause``, ``dlq_purge`` and
  the flow-limit writes (``set_queue_limits``, ``clear_queue_limits``, ``set_kind_limits``,
  ``clear_kind_limits``) run at any level.
* **Checked first.** Bad input raises a ``JobValidationError`` before anything is sent to the
  database, so the caller's transaction stays usable.
* **Logged.** A change of a queue's or a job kind's flow limits is logged (INFO, logger
  ``awa_django.operator``) with who made it, once it commits.
* Every write is an engine SQL function (``awa_django/sql/queries/operations.sql``) on the
  Django connection of ``using`` (default ``AWA["DATABASE_ALIAS"]``); reads live in
  :mod:`awa_django.operator.reads`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import uuid
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Literal, TypeVar

from django.db import transaction

from awa_django import serialization
from awa_django.conf import get_awa_settings
from awa_django.db.enqueue import sql_limit_values
from awa_django.db.transactions import write_transaction
from awa_django.exceptions import InvalidOptionError
from awa_django.limits import (
    MAX_TEXT,
    check_flow_limits,
    check_id,
    check_ids,
    check_kind_name,
    check_no_control,
    check_priority,
    check_queue_name,
    check_seconds,
    check_text,
    check_uuid,
    show,
)
from awa_django.operator.reads import KindLimits, QueueLimits
from awa_django.operator.rows import alias, cursor, fetch_one
from awa_django.sql import query
from awa_django.states import JobState
from awa_django.telemetry.logs import job_fields

__all__ = [
    "DRAIN_BATCH",
    "HistoryRetry",
    "cancel",
    "cancel_workflow",
    "clear_kind_limits",
    "clear_queue_limits",
    "dlq_purge",
    "dlq_retry",
    "extend_callback",
    "history_retry",
    "queue_dlq",
    "queue_drain",
    "queue_pause",
    "resolve_callback",
    "retry_workflow",
    "schedule_pause",
    "schedule_trigger",
    "set_kind_limits",
    "set_queue_limits",
]

log = logging.getLogger("awa_django.operator")

#: Jobs one drain transaction cancels at most (each holds the queue's lanes only that long).
DRAIN_BATCH = 1000

log = logging.getLogger("awa_django.operator")


@dataclasses.dataclass(frozen=True, slots=True)
class HistoryRetry:
    """What :func:`history_retry` did with one requested job.

    ``outcome``: ``retried`` (``retry_job_id`` is the new job), ``already_retried`` (an earlier
    retry made ``retry_job_id``), ``refused`` (a unique job whose key ``retry_job_id`` holds),
    ``not_retryable`` (it completed) or ``not_found`` (not in history: unknown, not finished
    yet, dead-lettered, or aged out). ``kind`` and ``queue`` are None when not found.
    """

    job_id: int
    outcome: Literal["retried", "already_retried", "refused", "not_retryable", "not_found"]
    retry_job_id: int | None
    kind: str | None
    queue: str | None


def cancel(job_id: int, *, reason: str = "cancelled", using: str | None = None) -> JobState | None:
    """Cancel one job wherever it is, in the caller's transaction.

    Returns the state it was cancelled from (``scheduled``, ``retryable``, ``available``,
    ``running``, ``waiting_external``), or ``None`` when there was nothing to cancel (unknown id,
    already terminal, or dead-lettered). A running handler is told through NOTIFY at commit and
    sees ``ctx.is_cancelled()`` turn true; its late completion is rejected as stale. ``reason``
    is text of at most 10,000 characters.
    """
    check_id("job_id", job_id)
    check_text("reason", reason, max_length=MAX_TEXT)
    with (
        write_transaction(alias(using), read_committed=True) as connection,
        connection.cursor() as c,
    ):
        c.execute(query("cancel"), [job_id, reason])
        row = c.fetchone()
    previous = None if row is None else row[0]  # one column: the state, or NULL
    return None if previous is None else JobState(previous)


def dlq_retry(
    job_ids: Sequence[int],
    *,
    queue: str | None = None,
    priority: int | None = None,
    using: str | None = None,
    on_unique_conflict: Literal["refuse", "run"] = "refuse",
) -> list[int]:
    """Move dead-lettered jobs back to work (attempt 0, error history kept); return their ids.

    ``queue`` and ``priority`` optionally send them elsewhere. Ids not in the DLQ are ignored.
    A unique job takes its key again; when another job holds it, ``on_unique_conflict`` says
    whether the job stays in the DLQ (``"refuse"``, the default: its id is not returned) or is
    retried without the key (``"run"``). All of them move, or none.
    """
    ids = check_ids("job_ids", job_ids)
    if queue is not None:
        check_queue_name(queue)
    if priority is not None:
        check_priority(priority)
    if on_unique_conflict not in ("refuse", "run"):
        raise InvalidOptionError(
            "on_unique_conflict", f"{on_unique_conflict!r} is not 'refuse' or 'run'"
        )
    with (
        write_transaction(alias(using), read_committed=True) as connection,
        connection.cursor() as c,
    ):
        c.execute(query("dlq_retry"), [ids, queue, priority, on_unique_conflict])
        return [int(job_id) for job_id, outcome in c.fetchall() if outcome == "retried"]


def history_retry(
    job_ids: Sequence[int],
    *,
    by: str | None = None,
    queue: str | None = None,
    priority: int | None = None,
    using: str | None = None,
) -> list[HistoryRetry]:
    """Retry failed and cancelled jobs from terminal history, in the caller's transaction;
    one :class:`HistoryRetry` per distinct requested id, by id.

    Each is enqueued again as a new job (new id, attempt 0, available at once) with the
    original's kind, arguments, queue, priority, ``max_attempts``, tags, metadata and per-job
    deadline; ``queue`` and ``priority`` optionally send it elsewhere. Its metadata gets
    ``awa:retried_from`` (the original id), ``awa:retried_by`` (``by``, text of at most 255
    characters: who asked) and ``awa:retried_at``. The original stays in history as it was. A
    job is retried from history at most once (a second call returns ``already_retried`` and
    the first retry's id), however many callers race. A unique job takes its key again; when
    another job holds it the retry is ``refused``. Each retry is logged at INFO on
    ``awa_django.operator`` with the job fields and ``retried_by``.
    """
    ids = check_ids("job_ids", job_ids)
    if queue is not None:
        check_queue_name(queue)
    if priority is not None:
        check_priority(priority)
    if by is not None:
        check_text("by", by, max_length=255)
    cfg = get_awa_settings()
    keep = 2 * float(cfg.HISTORY_RETENTION)  # past this, the original has left history
    with (
        write_transaction(alias(using), read_committed=True) as connection,
        connection.cursor() as c,
    ):
        c.execute(query("history_retry"), [ids, by, queue, priority, keep, *sql_limit_values()])
        rows = [HistoryRetry(int(r[0]), r[1], _maybe_int(r[2]), r[3], r[4]) for r in c.fetchall()]
    rows.sort(key=lambda r: r.job_id)
    for row in rows:
        if row.outcome == "retried":
            log.info(
                "awa: job %s retried from history as job %s by %s",
                row.job_id,
                row.retry_job_id,
                by or "(unknown)",
                extra={
                    **job_fields(row.job_id, kind=row.kind, queue=row.queue),
                    "retry_job_id": row.retry_job_id,
                    "retried_by": by,
                },
            )
    return rows


def _maybe_int(value: object) -> int | None:
    return None if value is None else int(value)  # type: ignore[call-overload]


def queue_dlq(queue: str, enabled: bool = True, *, using: str | None = None) -> bool:
    """Turn ``queue``'s dead letter queue on or off: whether its jobs that fail for good go to
    the DLQ or to history as failed, from the next failure on (every worker reads it when a
    job fails). Returns whether the setting changed. ``AWA["QUEUES"][queue]["dlq"]``, when
    set, is written again by every process that starts."""
    check_queue_name(queue)
    if type(enabled) is not bool:
        raise InvalidOptionError("enabled", f"must be True or False, got {enabled!r}")
    with write_transaction(alias(using), statements=1) as connection, connection.cursor() as c:
        c.execute(query("queue_dlq"), [queue, enabled])
        row = c.fetchone()
    return bool(row and row[0])  # one column: whether it changed


def dlq_purge(job_ids: Sequence[int], *, using: str | None = None) -> list[int]:
    """Delete dead-lettered jobs for good; return the ids purged. All of them go, or none."""
    ids = check_ids("job_ids", job_ids)
    with write_transaction(alias(using)) as connection, connection.cursor() as c:
        c.execute(query("dlq_purge"), [ids])
        return [int(row[0]) for row in c.fetchall()]  # one column: the job id


def resolve_callback(
    callback_id: uuid.UUID | str,
    *,
    result: object = None,
    error: str | None = None,
    terminal: bool = False,
    using: str | None = None,
) -> str:
    """Resolve an attempt that registered ``callback_id`` (``ctx.callback_id``), in the
    caller's transaction.

    Without ``error`` the job completes with ``result`` (JSON), or, when its handler waited with
    ``WaitForCallback(..., resume=True)``, runs again at once with ``result`` as
    ``ctx.callback_result`` (no attempt counted, progress kept). With ``error`` (text) the
    attempt fails: retried with backoff like a raised exception, or failed at once when
    ``terminal``. Returns ``resolved``, ``stale`` (already resolved, timed out and rescued, or
    cancelled) or ``unknown``. Fenced by ``(job_id, run_lease)`` like every other finalization.
    The attempt may not have parked yet (the external system answered before the handler
    returned): the resolution is then kept and applied when it parks (``resolved`` too).
    """
    cfg = get_awa_settings()
    callback = check_uuid("callback_id", callback_id)
    if type(terminal) is not bool:
        raise InvalidOptionError("terminal", f"must be True or False, got {terminal!r}")
    result_json = serialization.dumps(
        result, "result", max_bytes=cfg.RESULT_MAX_BYTES, max_depth=cfg.JSON_MAX_DEPTH
    )
    error_json = None
    if error is not None:
        message = check_text("error", error, max_length=MAX_TEXT)
        error_json = json.dumps({"type": "awa_django.CallbackError", "message": message})
    with (
        write_transaction(alias(using), read_committed=True) as connection,
        connection.cursor() as c,
    ):
        c.execute(
            query("callback_resolve_v2"),
            [str(callback), result_json, error_json, terminal, cfg.RETRY_BACKOFF_BASE],
        )
        row = c.fetchone()
    outcome = "unknown" if row is None else str(row[0])  # (outcome, job_id, run_lease)
    # 'accepted' (kept for the park) has always been reported as 'resolved' here.
    return "resolved" if outcome == "accepted" else outcome


def extend_callback(
    callback_id: uuid.UUID | str,
    timeout: float | timedelta | None = None,
    *,
    using: str | None = None,
) -> str:
    """Extend the wait of the attempt that registered ``callback_id``, in the caller's
    transaction, so that long external work is not rescued as "callback timed out".

    Its timeout becomes ``timeout`` from now on the database clock (seconds or a
    ``timedelta``, above 0 and at most 100 years; None: the wait's own timeout), unless it is
    later already (an extension never shortens a wait). Returns ``extended``; ``pending`` when
    the attempt registered the callback but has not parked yet (the extension is kept: its wait
    lasts until the later of the extension and its own timeout); ``stale`` when it was
    resolved, rescued or cancelled; ``unknown`` when no attempt holds the callback. The new
    timeout shows in the admin's callback waits (``awa.callback_waits``).
    """
    callback = check_uuid("callback_id", callback_id)
    seconds = None if timeout is None else check_seconds("timeout", timeout)
    with (
        write_transaction(alias(using), read_committed=True) as connection,
        connection.cursor() as c,
    ):
        c.execute(query("callback_extend"), [str(callback), seconds])
        row = c.fetchone()
    return "unknown" if row is None else str(row[0])  # (outcome, timeout_at)


def queue_pause(queue: str, paused: bool = True, *, using: str | None = None) -> None:
    """Pause (or resume) claiming from ``queue``; producers can still enqueue to it. Workers
    see the change at their next claim once it commits."""
    check_queue_name(queue)
    if type(paused) is not bool:
        raise InvalidOptionError("paused", f"must be True or False, got {paused!r}")
    with write_transaction(alias(using), statements=1) as connection, connection.cursor() as c:
        c.execute(query("queue_pause"), [queue, paused])


def queue_drain(
    queue: str,
    *,
    using: str | None = None,
    each_batch: Callable[[int], None] | None = None,
) -> int:
    """Cancel every job of ``queue`` that was waiting (available, scheduled, retryable) when
    the drain began; running jobs finish. Returns how many were cancelled.

    Outside a transaction it works in batches of 1,000 jobs, each one short transaction of its
    own (claimers skip a lane only while its batch runs); inside ``transaction.atomic()`` every
    batch is part of the caller's transaction. ``each_batch(cancelled)`` runs inside each
    batch's transaction after a batch that cancelled something (the admin writes its
    ``LogEntry`` there, so each entry commits with the cancellations it records).
    """
    check_queue_name(queue)
    if each_batch is not None and not callable(each_batch):
        raise InvalidOptionError("each_batch", f"{show(each_batch)} is not callable")
    database = alias(using)
    with cursor(database) as c:
        c.execute(query("job_id_high_water"))
        row = c.fetchone()
    high_water = int(row[0]) if row else 0  # one column: the last job id handed out
    total = 0
    while True:
        with write_transaction(database, read_committed=True) as connection:
            with connection.cursor() as c:
                c.execute(query("queue_drain"), [queue, DRAIN_BATCH, high_water])
                row = c.fetchone()
            done = int(row[0]) if row else 0  # one column: how many it cancelled
            if done and each_batch is not None:
                each_batch(done)
        total += done
        if done < DRAIN_BATCH:
            return total


def schedule_pause(
    name: str, paused: bool = True, *, by: str | None = None, using: str | None = None
) -> bool:
    """Pause (or resume) the periodic schedule ``name``; return whether it exists.

    A paused schedule does not fire. On resume it starts again from now: fires that fell in
    the pause are skipped, not made up. ``by`` (text) is recorded as who paused it. The state
    survives restarts and syncs.
    """
    check_text("name", name, max_length=255)
    if type(paused) is not bool:
        raise InvalidOptionError("paused", f"must be True or False, got {paused!r}")
    if by is not None:
        check_text("by", by, max_length=255)
    with write_transaction(alias(using), statements=1) as connection, connection.cursor() as c:
        c.execute(query("cron_pause"), [name, paused, by])
        row = c.fetchone()
    return bool(row and row[0])  # one column: whether the schedule exists


def schedule_trigger(name: str, *, using: str | None = None) -> int | None:
    """Enqueue one job of the periodic schedule ``name`` now, in the caller's transaction,
    whether or not it is paused, without changing its fire times; return the job id (None for
    an unknown schedule). The job's metadata has ``cron_name``, ``cron_fire_time`` (now) and
    ``cron_trigger: "manual"``."""
    check_text("name", name, max_length=255)
    with write_transaction(alias(using), statements=1) as connection, connection.cursor() as c:
        c.execute(query("cron_trigger"), [name, *sql_limit_values()])
        row = c.fetchone()
    return None if row is None or row[0] is None else int(row[0])


def set_queue_limits(
    queue: str,
    *,
    global_concurrency: int | None = None,
    rate_limit: float | None = None,
    rate_burst: int | None = None,
    actor: str,
    using: str | None = None,
) -> QueueLimits:
    """Set ``queue``'s flow limits across the fleet (docs/flow.md) as an operator override;
    return the limits now in force.

    The given limits **replace** the queue's limits as a whole: one left out (None) is lifted,
    also when ``AWA["QUEUES"]`` sets it, until :func:`clear_queue_limits`. ``global_concurrency``
    is an int from 1 to 10,000 (attempts running at once, counted by job weight),
    ``rate_limit`` a finite number of jobs per second above 0 and at most 1,000,000,
    ``rate_burst`` an int from 1 to 1,000,000 and only with a rate; at least one limit is
    given. ``actor`` (text, at most 255 characters) is recorded as who set them. The row's
    source is ``"operator"``: a worker starting with other settings leaves it alone.

    Bad input raises ``InvalidOptionError`` before anything is written. The write and the read
    of the result are one transaction (the caller's, or one of its own in autocommit); workers
    apply the new limits from their next claim (within a poll interval) once it commits. A
    lowered concurrency limit holds at once: attempts already running keep their permits, and
    no new one starts until the permits in use are under the new limit.
    """
    check_queue_name(queue)
    limits = check_flow_limits(global_concurrency, rate_limit, rate_burst)
    who = _actor(actor)
    limits_now = _flow_write(using, [queue, *limits, who, False, None], queue, who, "set")
    if limits_now is None:  # flow_set_v1 returns the row it wrote, in the same transaction
        raise RuntimeError(f"awa.flow_set_v1 wrote no limits for queue {queue!r}")
    return limits_now


def clear_queue_limits(queue: str, *, actor: str, using: str | None = None) -> QueueLimits | None:
    """Remove the operator's override of ``queue``'s flow limits; return the limits now in
    force, or None when the queue has none.

    The queue goes back to what this project's ``AWA["QUEUES"]`` says (its
    ``global_concurrency``, ``rate_limit``, ``rate_burst``), written as its ``"settings"`` row
    at once, with ``actor`` (text, at most 255 characters) as who wrote it; without such
    settings the queue has no flow limit. Clearing a queue that has no override writes its
    settings again (idempotent). One transaction (the caller's, or one of its own).
    """
    check_queue_name(queue)
    who = _actor(actor)
    configured = get_awa_settings().QUEUES.get(queue)
    settings = (
        json.dumps(configured.flow_limits())
        if configured is not None and configured.has_flow_limits
        else None
    )
    return _flow_write(using, [queue, None, None, None, who, True, settings], queue, who, "cleared")


def _actor(actor: object) -> str:
    who = check_text("actor", actor, max_length=255)
    if not who.strip():
        raise InvalidOptionError("actor", "must name who made the change")
    return check_no_control("actor", who)


def _flow_write(
    using: str | None,
    params: list[int | float | str | bool | None],
    queue: str,
    actor: str,
    done: str,
) -> QueueLimits | None:
    """``awa.flow_set_v1`` then the queue's limits now in force (see :func:`_write_limits`)."""
    return _write_limits(
        QueueLimits, "flow_set", "queue_limits_of", "queue", using, params, queue, actor, done
    )


_Limits = TypeVar("_Limits", QueueLimits, KindLimits)


def _write_limits(
    model: type[_Limits],
    statement: str,
    read: str,
    noun: str,
    using: str | None,
    params: list[int | float | str | bool | None],
    name: str,
    actor: str,
    done: str,
) -> _Limits | None:
    """Query ``statement`` (``awa.flow_set_v1`` or ``awa.flow_kind_set_v1``) then, by query
    ``read``, the limits of ``name`` now in force, in one transaction; logged once it
    commits."""
    database = alias(using)
    with write_transaction(database, statements=2) as connection:
        with connection.cursor() as c:
            c.execute(query(statement), params)
            c.fetchall()
        limits = fetch_one(model, read, [name], using=database)
        now = "no limits" if limits is None else limits.summary(in_use=False)

        def record() -> None:
            log.info("flow limits of %s %s %s by %s: %s", noun, name, done, actor, now)

        if connection.in_atomic_block:
            transaction.on_commit(record, using=database)
        else:  # autocommit turned off by the caller: Django keeps no commit hooks there
            record()
    return limits


def set_kind_limits(
    kind: str,
    *,
    global_concurrency: int | None = None,
    rate_limit: float | None = None,
    rate_burst: int | None = None,
    actor: str,
    using: str | None = None,
) -> KindLimits:
    """Set job kind ``kind``'s flow limits across the fleet as an operator override; return the
    limits now in force.

    As :func:`~awa_django.operator.set_queue_limits` for a queue: the given limits replace the
    kind's as a whole (one left out is lifted, also when ``@job`` or ``AWA["KINDS"]`` sets it,
    until :func:`clear_kind_limits`); the same bounds; ``actor`` (text, at most 255
    characters) is recorded. ``kind`` is any job kind name (1-255 characters): kinds are names
    in the database, so one no process registers may be limited too. Bad input raises
    ``InvalidOptionError`` before anything is written; workers apply the limits from their
    next claim (within a poll interval) once the transaction commits.
    """
    check_kind_name(kind)
    limits = check_flow_limits(global_concurrency, rate_limit, rate_burst)
    who = _actor(actor)
    now = _kind_write(using, [kind, *limits, who, False, None], kind, who, "set")
    if now is None:  # flow_kind_set_v1 returns the row it wrote, in the same transaction
        raise RuntimeError(f"awa.flow_kind_set_v1 wrote no limits for kind {kind!r}")
    return now


def clear_kind_limits(kind: str, *, actor: str, using: str | None = None) -> KindLimits | None:
    """Remove the operator's override of ``kind``'s flow limits; return the limits now in
    force (what this project's ``@job`` and ``AWA["KINDS"]`` give the kind, written as its
    ``"settings"`` row), or None when it has none. One transaction."""
    from awa_django.jobs import kind_flow_limits

    check_kind_name(kind)
    who = _actor(actor)
    configured = kind_flow_limits().get(kind)
    settings = json.dumps(configured) if configured is not None else None
    return _kind_write(using, [kind, None, None, None, who, True, settings], kind, who, "cleared")


def _kind_write(
    using: str | None,
    params: list[int | float | str | bool | None],
    kind: str,
    actor: str,
    done: str,
) -> KindLimits | None:
    """``awa.flow_kind_set_v1`` then the kind's limits now in force (see
    :func:`_write_limits`)."""
    return _write_limits(
        KindLimits, "flow_kind_set", "kind_limits_of", "kind", using, params, kind, actor, done
    )


def cancel_workflow(
    workflow_id: int, *, reason: str = "workflow cancelled", using: str | None = None
) -> int:
    """Cancel every step of a workflow (or batch) that has not ended, in the caller's
    transaction: steps waiting for their dependencies, live jobs (a running handler is told, as
    by ``cancel``) and dead-lettered steps (they leave the DLQ for history). Returns how many
    steps were cancelled (0 for an unknown or finished workflow)."""
    check_id("workflow_id", workflow_id)
    check_text("reason", reason, max_length=MAX_TEXT)
    with (
        write_transaction(alias(using), read_committed=True) as connection,
        connection.cursor() as c,
    ):
        c.execute(query("workflow_cancel"), [workflow_id, reason])
        row = c.fetchone()
    return int(row[0]) if row else 0


def retry_workflow(workflow_id: int, *, using: str | None = None) -> list[int]:
    """Retry the dead-lettered steps of a workflow (or batch); once they complete, the workflow
    goes on. Returns the job ids retried."""
    check_id("workflow_id", workflow_id)
    with (
        write_transaction(alias(using), read_committed=True) as connection,
        connection.cursor() as c,
    ):
        c.execute(query("workflow_retry"), [workflow_id])
        return [int(row[0]) for row in c.fetchall()]
