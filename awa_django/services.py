"""Operator services: queue control, statistics, workers, rings, job inspection, the DLQ.

The management commands (``awa_status``, ``awa_queue``, ``awa_dlq``, ``awa_job``) are thin
wrappers over these, and the admin uses the same functions. Every write goes through the
engine's SQL functions on the Django connection of ``using`` (default ``AWA["DATABASE_ALIAS"]``).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from datetime import datetime
from typing import Any

from django.db import connections

from awa_django.conf import get_awa_settings
from awa_django.db.storage import QueueCounts
from awa_django.db.transactions import checked_alias, write_transaction
from awa_django.exceptions import InvalidOptionError
from awa_django.limits import check_queue_name, check_text
from awa_django.sql import query

__all__ = [
    "DlqEntry",
    "QueueStats",
    "WorkerStatus",
    "dlq_list",
    "job_show",
    "queue_drain",
    "queue_pause",
    "queue_stats",
    "rings",
    "throughput",
    "workers",
]


def _cursor(using: str | None) -> Any:
    return connections[checked_alias(using or get_awa_settings().DATABASE_ALIAS)].cursor()


def _json(value: Any) -> Any:
    # Django's psycopg adapters hand jsonb back as text.
    return json.loads(value) if isinstance(value, str) else value


@dataclasses.dataclass(frozen=True, slots=True)
class QueueStats(QueueCounts):
    """Exact counts of one queue, its lag (age of the oldest available job, seconds) and the
    jobs it completed in the last hour."""

    lag_seconds: float | None
    completed_last_hour: int


@dataclasses.dataclass(frozen=True, slots=True)
class WorkerStatus:
    """One registered worker (or maintenance) process."""

    instance_id: str
    hostname: str
    pid: int
    queues: dict[str, int]
    concurrency: int
    is_leader: bool
    started_at: datetime
    last_seen_at: datetime
    seen_seconds_ago: float


@dataclasses.dataclass(frozen=True, slots=True)
class DlqEntry:
    """One dead-lettered job, as listed."""

    job_id: int
    queue: str
    kind: str
    attempt: int
    reason: str
    dlq_at: datetime


def queue_stats(using: str | None = None) -> list[QueueStats]:
    """Statistics of every known queue (scans: for operators, not for the hot path)."""
    with _cursor(using) as cursor:
        cursor.execute(query("queue_stats"))
        rows = [list(row) for row in cursor.fetchall()]
    for row in rows:
        row[11] = None if row[11] is None else float(row[11])  # numeric to float
    return [QueueStats(*row) for row in rows]


def queue_pause(queue: str, paused: bool = True, *, using: str | None = None) -> None:
    """Pause (or resume) claiming from ``queue``; producers can still enqueue to it."""
    check_queue_name(queue)
    if type(paused) is not bool:
        raise InvalidOptionError("paused", f"must be True or False, got {paused!r}")
    with _cursor(using) as cursor:
        cursor.execute(query("queue_pause"), [queue, paused])


#: Jobs one drain transaction cancels at most (each holds the queue's lanes only that long).
DRAIN_BATCH = 1000


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
    alias = using or get_awa_settings().DATABASE_ALIAS
    with _cursor(alias) as cursor:
        cursor.execute(query("job_id_high_water"))
        row = cursor.fetchone()
    high_water = int(row[0]) if row else 0
    total = 0
    while True:
        with write_transaction(alias, read_committed=True) as connection, connection.cursor() as c:
            c.execute(query("queue_drain"), [queue, DRAIN_BATCH, high_water])
            row = c.fetchone()
            done = int(row[0]) if row else 0
            if done and each_batch is not None:
                each_batch(done)
        total += done
        if done < DRAIN_BATCH:
            return total


def throughput(queue: str | None = None, *, using: str | None = None) -> list[int]:
    """Completions per minute over the last hour (60 values, oldest first)."""
    with _cursor(using) as cursor:
        cursor.execute(query("throughput"), [queue])
        return [int(row[0]) for row in cursor.fetchall()]


def workers(using: str | None = None) -> list[WorkerStatus]:
    """Registered processes, oldest first, with their leader flag."""
    with _cursor(using) as cursor:
        cursor.execute(query("workers"))
        return [
            WorkerStatus(str(r[0]), r[1], r[2], _json(r[3]), r[4], r[5], r[6], r[7], float(r[8]))
            for r in cursor.fetchall()
        ]


def rings(using: str | None = None) -> list[dict[str, Any]]:
    """Each ring's slot count, current slot, generation and last rotation."""
    with _cursor(using) as cursor:
        cursor.execute(query("rings"))
        names = ["ring", "slot_count", "current_slot", "generation", "rotated_at"]
        return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


_JOB_FIELDS = (
    "id",
    "kind",
    "queue",
    "state",
    "priority",
    "attempt",
    "max_attempts",
    "run_lease",
    "args",
    "run_at",
    "created_at",
    "attempted_at",
    "finalized_at",
    "errors",
    "result",
    "progress",
    "metadata",
    "tags",
    "in_dlq",
    "dlq_reason",
)


def job_show(job_id: int, *, using: str | None = None) -> dict[str, Any] | None:
    """One job from every plane (``awa.jobs``), or None when unknown or aged out."""
    with _cursor(using) as cursor:
        cursor.execute(query("job_show"), [job_id])
        row = cursor.fetchone()
    if row is None:
        return None
    job = dict(zip(_JOB_FIELDS, row, strict=True))
    for key in ("args", "errors", "result", "progress", "metadata"):
        job[key] = _json(job[key])
    return job


def dlq_list(
    *,
    queue: str | None = None,
    kind: str | None = None,
    limit: int = 100,
    using: str | None = None,
) -> list[DlqEntry]:
    """Dead-lettered jobs, newest first, optionally filtered by queue and kind (at most
    ``limit``, 1 to 100,000)."""
    if type(limit) is not int or not 1 <= limit <= 100_000:
        raise InvalidOptionError("limit", f"must be an int from 1 to 100000, got {limit!r}")
    for field, value in (("queue", queue), ("kind", kind)):
        if value is not None:
            check_text(field, value, max_length=255)
    with _cursor(using) as cursor:
        cursor.execute(query("dlq_list"), {"queue": queue, "kind": kind, "limit": limit})
        return [DlqEntry(*row) for row in cursor.fetchall()]
