"""Operator reads: queue statistics, flow limits, workers, rings, throughput, one job, the DLQ.

Guarantees:

* **Nothing here writes.** Each function runs one read-only statement on the Django connection
  of ``using`` (default ``AWA["DATABASE_ALIAS"]``), in the caller's transaction when there is
  one; every change lives in :mod:`awa_django.operator.actions`.
* **Typed rows.** Each returns frozen dataclasses built by column name
  (:func:`awa_django.operator.rows.fetch`), never tuples indexed by position; states are
  :class:`~awa_django.states.JobState` members and JSON columns are decoded.
* Bad arguments raise a ``JobValidationError`` before anything is sent to the database.
* These scan (the statistics, the DLQ list): they are for operators and pages, not for the hot
  path.
"""

from __future__ import annotations

import dataclasses
import math
from datetime import datetime
from typing import Literal

from awa_django.cron import next_fire
from awa_django.db.storage import QueueCounts
from awa_django.exceptions import InvalidOptionError
from awa_django.limits import check_id, check_queue_name, check_text, rate_text, show
from awa_django.operator.descriptors import (
    DescriptorStatus,
    UndeclaredKind,
    descriptors,
    undeclared_kinds,
)
from awa_django.operator.rows import Json, Param, cursor, fetch, fetch_one, json_value
from awa_django.sql import query
from awa_django.states import JobState
from awa_django.workflows import WorkflowStatus

__all__ = [
    "DescriptorStatus",
    "DlqEntry",
    "JobDetail",
    "JobSummary",
    "KindLimits",
    "OutcomeMinute",
    "QueueLimits",
    "QueueMinute",
    "QueueStats",
    "ReplicaStatus",
    "RingState",
    "ScheduleStatus",
    "UndeclaredKind",
    "WorkerStatus",
    "WorkflowOf",
    "WorkflowStepState",
    "descriptors",
    "dlq_list",
    "job_list",
    "job_show",
    "kind_limits",
    "outcomes_per_minute",
    "paused_queues",
    "queue_dlq_enabled",
    "queue_limits",
    "queue_minutes",
    "queue_stats",
    "replica_status",
    "rings",
    "schedules",
    "throughput",
    "undeclared_kinds",
    "workers",
    "workflow_counts",
    "workflow_of",
    "workflow_steps",
    "workflows",
]


@dataclasses.dataclass(frozen=True, slots=True)
class QueueStats(QueueCounts):
    """Exact counts of one queue, its lag (age of the oldest available job, seconds) and the
    jobs it completed in the last hour."""

    lag_seconds: float | None
    completed_last_hour: int


@dataclasses.dataclass(frozen=True, slots=True)
class QueueLimits:
    """One queue's flow limits in force across the fleet (``awa.flow_limits``, docs/flow.md).

    ``global_concurrency`` is the most attempts of the queue running at once, counted by job
    weight, and ``in_use`` the permits held now (read from the server's lock table; None when
    the queue has no concurrency limit, as nothing is counted then). ``rate_limit`` is jobs
    started per second and ``rate_burst`` the burst as set (None: the default,
    :attr:`burst_in_force`). ``source`` is ``"settings"`` (written from ``AWA["QUEUES"]`` by
    the workers) or ``"operator"`` (an override from the admin or ``awa_queue limit``, which
    settings leave alone until it is cleared); ``updated_by`` says who wrote it.
    """

    queue: str
    global_concurrency: int | None
    in_use: int | None
    rate_limit: float | None
    rate_burst: int | None
    source: Literal["settings", "operator"]
    updated_by: str | None
    updated_at: datetime

    @property
    def burst_in_force(self) -> int | None:
        """The burst the claim applies: ``rate_burst``, or by default a tenth of a second's
        worth of jobs, at least 1 (None without a rate)."""
        if self.rate_limit is None:
            return None
        if self.rate_burst is not None:
            return self.rate_burst
        return max(1, math.ceil(self.rate_limit / 10))

    def summary(self, *, in_use: bool = True) -> str:
        """One line: ``limit N (in use M), rate R/s burst B, source`` (the parts it has; the
        permits in use only with ``in_use``)."""
        parts = []
        if self.global_concurrency is not None:
            used = f" (in use {self.in_use or 0})" if in_use else ""
            parts.append(f"limit {self.global_concurrency}{used}")
        if self.rate_limit is not None:
            parts.append(f"rate {rate_text(self.rate_limit)}/s burst {self.burst_in_force}")
        return ", ".join([*(parts or ["no limits"]), self.source])


@dataclasses.dataclass(frozen=True, slots=True)
class KindLimits:
    """One job kind's flow limits in force across the fleet (``awa.flow_kind_limits``).

    ``global_concurrency`` is the most attempts of the kind running at once, in every queue,
    counted by job weight, and ``in_use`` the kind's permits held now (read from the server's
    lock table; None without a concurrency limit). ``rate_limit`` is jobs of the kind started
    per second and ``rate_burst`` the burst as set (None: the default,
    :attr:`burst_in_force`). ``waiting`` counts the jobs its limits hold parked now (shown as
    available everywhere). ``source`` is ``"settings"`` (from ``@job`` and ``AWA["KINDS"]``,
    written by the workers) or ``"operator"`` (the admin or ``awa_queue limit --kind``);
    ``updated_by`` says who wrote it.
    """

    kind: str
    global_concurrency: int | None
    in_use: int | None
    rate_limit: float | None
    rate_burst: int | None
    waiting: int
    source: Literal["settings", "operator"]
    updated_by: str | None
    updated_at: datetime

    @property
    def burst_in_force(self) -> int | None:
        """The burst the claim applies: ``rate_burst``, or a tenth of a second's worth of jobs,
        at least 1 (None without a rate)."""
        if self.rate_limit is None:
            return None
        if self.rate_burst is not None:
            return self.rate_burst
        return max(1, math.ceil(self.rate_limit / 10))

    def summary(self, *, in_use: bool = True) -> str:
        """One line: ``limit N (in use M), rate R/s burst B, W parked, source`` (the parts it
        has; what is in use and parked only with ``in_use``)."""
        parts = []
        if self.global_concurrency is not None:
            used = f" (in use {self.in_use or 0})" if in_use else ""
            parts.append(f"limit {self.global_concurrency}{used}")
        if self.rate_limit is not None:
            parts.append(f"rate {rate_text(self.rate_limit)}/s burst {self.burst_in_force}")
        if not parts:
            parts.append("no limits")
        if in_use and self.waiting:
            parts.append(f"{self.waiting} parked")
        return ", ".join([*parts, self.source])


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
class RingState:
    """One ring (``queue``, ``claim``, ``lease``): its slot count, current slot, generation and
    last rotation."""

    ring: str
    slot_count: int
    current_slot: int
    generation: int
    rotated_at: datetime


@dataclasses.dataclass(frozen=True, slots=True)
class JobDetail:
    """One job as ``awa.jobs`` shows it, from whichever plane holds it (live, history, DLQ).

    ``args``, ``errors`` (one object per failed attempt), ``result``, ``progress`` and
    ``metadata`` are decoded JSON.
    """

    id: int
    kind: str
    queue: str
    state: JobState
    priority: int
    attempt: int
    max_attempts: int
    run_lease: int
    args: Json
    run_at: datetime | None
    created_at: datetime | None
    attempted_at: datetime | None
    finalized_at: datetime | None
    errors: Json
    result: Json
    progress: Json
    metadata: Json
    tags: list[str] | None
    in_dlq: bool
    dlq_reason: str | None


@dataclasses.dataclass(frozen=True, slots=True)
class JobSummary:
    """One job as :func:`job_list` lists it (``awa.jobs``; a dead-lettered job is ``failed``
    with ``in_dlq``)."""

    id: int
    kind: str
    queue: str
    state: JobState
    priority: int
    attempt: int
    max_attempts: int
    run_at: datetime | None
    created_at: datetime | None
    finalized_at: datetime | None
    tags: list[str] | None
    in_dlq: bool


@dataclasses.dataclass(frozen=True, slots=True)
class DlqEntry:
    """One dead-lettered job, as listed."""

    job_id: int
    queue: str
    kind: str
    attempt: int
    reason: str
    dlq_at: datetime


@dataclasses.dataclass(frozen=True, slots=True)
class ScheduleStatus:
    """One periodic schedule as stored (``awa.cron_schedule_status``).

    ``next_fire_at`` is computed here, with cronsim, from the stored expression and time zone
    and the database clock (None for a paused schedule, or one whose expression this process
    cannot read); ``last_fire_at`` is the last fire time that enqueued a job, ``last_job_id``
    the last job it enqueued (a manual trigger included) and ``last_job_state`` that job's
    state (None once it left history). ``catch_up`` is the most missed fires made up after
    downtime (1: only the latest).
    """

    name: str
    kind: str
    cron_expr: str
    timezone: str
    catch_up: int
    queue: str
    priority: int
    enabled: bool
    next_fire_at: datetime | None
    last_fire_at: datetime | None
    last_job_id: int | None
    last_job_state: JobState | None
    paused_at: datetime | None
    paused_by: str | None


def _schedule(*, now: datetime, fire_after: datetime, **values: object) -> ScheduleStatus:
    status = ScheduleStatus(next_fire_at=None, **values)  # type: ignore[arg-type]
    if not status.enabled:
        return status
    try:
        upcoming = next_fire(status.cron_expr, status.timezone, max(fire_after, now))
    except Exception:  # an expression or zone this process cannot read: shown without
        return status
    return dataclasses.replace(status, next_fire_at=upcoming)


def schedules(name: str | None = None, *, using: str | None = None) -> list[ScheduleStatus]:
    """Every periodic schedule (or the one called ``name``), by name, with its next fire time
    on the database clock."""
    if name is not None:
        check_text("name", name, max_length=255)
    params: dict[str, Param] = {"name": name}
    return fetch(_schedule, "cron_list", params, using=using, convert={"last_job_state": JobState})


def queue_stats(using: str | None = None) -> list[QueueStats]:
    """Statistics of every known queue, by name (``awa.queue_stats_v1()``), every count exact:
    the history counts come from the history's own counts, at any size."""
    return fetch(QueueStats, "queue_stats", using=using)


def queue_limits(using: str | None = None) -> list[QueueLimits]:
    """The flow limits of every queue that has some, by queue name, with the permits in use
    now (``awa.flow_status_v1()``; it reads the server's lock table: for operators, not for
    the hot path). Queues without a row have no fleet-wide limit."""
    return fetch(QueueLimits, "queue_limits", using=using)


def kind_limits(using: str | None = None) -> list[KindLimits]:
    """The flow limits of every job kind that has some (or jobs parked by them), by kind, with
    the permits in use and the jobs parked now (``awa.flow_kind_status_v1()``: it reads the
    server's lock table, for operators, not for the hot path)."""
    return fetch(KindLimits, "kind_limits", using=using)


def throughput(queue: str | None = None, *, using: str | None = None) -> list[int]:
    """Completions per minute over the last hour (60 values, oldest first) of ``queue``, or of
    every queue when it is None."""
    if queue is not None:
        check_queue_name(queue)
    with cursor(using) as c:
        c.execute(query("throughput"), [queue])
        return [int(row[0]) for row in c.fetchall()]  # one column


@dataclasses.dataclass(frozen=True, slots=True)
class OutcomeMinute:
    """One minute of a queue's outcomes: jobs completed, failed (to history), cancelled, and
    dead-lettered in it."""

    completed: int
    failed: int
    cancelled: int
    dead_lettered: int


def outcomes_per_minute(queue: str, *, using: str | None = None) -> list[OutcomeMinute]:
    """``queue``'s outcomes per minute over the last hour (60 values, oldest first): one index
    range of its history per outcome, and one of its DLQ."""
    check_queue_name(queue)
    with cursor(using) as c:
        c.execute(query("outcomes_per_minute"), [queue])
        return [OutcomeMinute(*map(int, row)) for row in c.fetchall()]


@dataclasses.dataclass(frozen=True, slots=True)
class QueueMinute:
    """One minute of a queue, as the maintenance leader rolled it up (``awa.queue_minutes``)
    about 10 s after it ended.

    ``recorded`` is False for a minute not rolled up (no leader ran then, or not yet): every
    other figure is then None. Outcomes count the jobs that completed, failed (to history), were
    cancelled, or went to the DLQ in the minute; ``retried`` the attempts that failed in the
    minute and were scheduled to run again (their backoff waited out or not; never fewer than
    an earlier read of the minute showed). Times are in seconds, over at most 2,000 of the
    minute's completed and failed jobs: the queue wait (started minus ``run_at``) and run time
    (finished minus started) of the attempt that finished, p50 and p95; None when none
    finished. ``available``, ``retryable`` and ``oldest_seconds`` (the age of the oldest
    available job) are the queue as it was when the minute was rolled up, for the newest minute
    of each roll-up (the others read None); ``available`` is exact up to 10,000 per lane.
    """

    minute: datetime
    recorded: bool
    completed: int | None
    failed: int | None
    cancelled: int | None
    dead_lettered: int | None
    retried: int | None
    wait_p50: float | None
    wait_p95: float | None
    run_p50: float | None
    run_p95: float | None
    available: int | None
    retryable: int | None
    oldest_seconds: float | None


#: The longest span :func:`queue_minutes` reads: the 24 hours the roll-up keeps.
QUEUE_MINUTES_MAX = 1440


def queue_minutes(queue: str, minutes: int = 60, *, using: str | None = None) -> list[QueueMinute]:
    """``queue``'s last ``minutes`` minutes (1 to 1,440), oldest first, one
    :class:`QueueMinute` each, up to the last minute that ended at least 10 s ago."""
    check_queue_name(queue)
    if type(minutes) is not int or not 1 <= minutes <= QUEUE_MINUTES_MAX:
        raise InvalidOptionError(
            "minutes", f"{show(minutes)} is not an int from 1 to {QUEUE_MINUTES_MAX}"
        )
    return fetch(QueueMinute, "queue_minutes", [queue, minutes], using=using)


def _queue_slots(value: object) -> dict[str, int]:
    """A worker row's ``queues`` ({name: concurrency}); a row of another shape (written by
    another version, or by hand) reads as no queues rather than failing every reader."""
    decoded = json_value(value)
    if not isinstance(decoded, dict):
        return {}
    return {str(name): slots for name, slots in decoded.items() if type(slots) is int}


def workers(using: str | None = None) -> list[WorkerStatus]:
    """Registered processes, oldest first, with their leader flag and how long ago (by the
    database's clock) each was last seen."""
    return fetch(
        WorkerStatus,
        "workers",
        using=using,
        convert={"instance_id": str, "queues": _queue_slots, "seen_seconds_ago": float},
    )


def rings(using: str | None = None) -> list[RingState]:
    """Each ring's state, by ring name."""
    return fetch(RingState, "rings", using=using)


_JSON_COLUMNS = ("args", "errors", "result", "progress", "metadata")


def job_show(job_id: int, *, using: str | None = None) -> JobDetail | None:
    """One job from every plane (``awa.jobs``), or None when unknown or aged out of history."""
    return fetch_one(
        JobDetail,
        "job_show",
        [check_id("job_id", job_id)],
        using=using,
        convert={"state": JobState, **dict.fromkeys(_JSON_COLUMNS, json_value)},
    )


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
    params: dict[str, Param] = {"queue": queue, "kind": kind, "limit": limit}
    return fetch(DlqEntry, "dlq_list", params, using=using)


def job_list(
    *,
    state: JobState | str | None = None,
    queue: str | None = None,
    kind: str | None = None,
    tag: str | None = None,
    in_dlq: bool | None = None,
    limit: int = 100,
    using: str | None = None,
) -> list[JobSummary]:
    """Jobs from every plane, newest (highest id) first, at most ``limit`` (1 to 100,000),
    filtered by ``state`` (a :class:`~awa_django.states.JobState` value), ``queue``, ``kind``
    (exactly), ``tag`` (jobs carrying it) and ``in_dlq``.

    A queue, kind or terminal state narrows history to an index range; a tag alone does not:
    history is read newest first until ``limit`` jobs carry it (docs/observability.md).
    """
    if type(limit) is not int or not 1 <= limit <= 100_000:
        raise InvalidOptionError("limit", f"must be an int from 1 to 100000, got {limit!r}")
    if state is not None and state not in JobState.values:
        raise InvalidOptionError(
            "state", f"{show(state)} is not one of {', '.join(JobState.values)}"
        )
    if queue is not None:
        check_queue_name(queue)
    for field, value in (("kind", kind), ("tag", tag)):
        if value is not None:
            check_text(field, value, max_length=255)
    if in_dlq is not None and type(in_dlq) is not bool:
        raise InvalidOptionError("in_dlq", f"must be True, False or None, got {in_dlq!r}")
    params: dict[str, Param] = {
        "state": None if state is None else str(state),
        "queue": queue,
        "kind": kind,
        "tag": tag,
        "dlq": in_dlq,
        "limit": limit,
    }
    return fetch(JobSummary, "job_list", params, using=using, convert={"state": JobState})


@dataclasses.dataclass(frozen=True, slots=True)
class ReplicaStatus:
    """Whether a database is a standby (``in_recovery``) and, if so, how far behind its primary.

    ``lag_seconds`` is 0 when the standby has replayed every change it received; otherwise the
    age of the last transaction it replayed (``last_replayed_at``), by its own clock: an upper
    bound, as the primary may have committed nothing for a while before. ``replay_paused``:
    WAL replay is paused (``pg_wal_replay_pause()``), so the lag grows until it is resumed.
    All None/False for a database that is not a standby.
    """

    in_recovery: bool
    lag_seconds: float | None
    replay_paused: bool
    last_replayed_at: datetime | None


def replica_status(using: str | None = None) -> ReplicaStatus:
    """Whether ``using``'s database is a streaming replica, and its lag (see
    :class:`ReplicaStatus`); the admin and ``awa_status`` show it for
    ``AWA["READ_DATABASE_ALIAS"]``."""
    status = fetch_one(ReplicaStatus, "replica_status", using=using)
    assert status is not None  # one row, always
    return status


def paused_queues(*, using: str | None = None) -> frozenset[str]:
    """The names of the queues paused now (``queue_pause``): their jobs wait, unclaimed."""
    with cursor(using) as c:
        c.execute(query("paused_queues"))
        return frozenset(str(row[0]) for row in c.fetchall())  # one column


def queue_dlq_enabled(queue: str, *, using: str | None = None) -> bool:
    """Whether ``queue``'s jobs that fail for good go to the dead letter queue (true for a
    queue never set otherwise)."""
    check_queue_name(queue)
    with cursor(using) as c:
        c.execute(query("queue_dlq_enabled"), [queue])
        row = c.fetchone()
    return True if row is None else bool(row[0])  # one column


# Workflows ---------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class WorkflowStepState:
    """One step of a workflow: its name, job, policy, dependencies (job ids) and state: waiting
    (for its dependencies), a job state, ``dead_lettered``, ``skipped``, or ``gone`` (purged
    from the DLQ, or its history pruned)."""

    step: str
    job_id: int
    kind: str | None
    queue: str | None
    on_failure: str
    state: str
    after: list[int]


@dataclasses.dataclass(frozen=True, slots=True)
class WorkflowOf:
    """The workflow a job is a step of."""

    workflow_id: int
    name: str
    kind: str
    step: str


def workflows(
    state: str | None = None,
    *,
    limit: int = 100,
    before: int | None = None,
    using: str | None = None,
) -> list[WorkflowStatus]:
    """Workflows and batches newest first (ids below ``before``), of one ``state`` (running,
    completed, failed) when given."""
    if state not in (None, "running", "completed", "failed"):
        raise InvalidOptionError(
            "state", f"must be running, completed or failed, got {show(state)}"
        )
    if type(limit) is not int or not 0 <= limit <= 10_000:
        raise InvalidOptionError("limit", "must be an int from 0 to 10,000")
    if before is not None:
        check_id("before", before)
    return fetch(WorkflowStatus, "workflow_list", [state, limit, before], using=using)


def workflow_steps(
    workflow_id: int, *, limit: int = 10_000, using: str | None = None
) -> list[WorkflowStepState]:
    """The steps of a workflow in the order they were added (at most ``limit``)."""
    check_id("workflow_id", workflow_id)
    if type(limit) is not int or not 0 <= limit <= 100_002:
        raise InvalidOptionError("limit", "must be an int from 0 to 100,002")
    return fetch(
        WorkflowStepState,
        "workflow_steps",
        [workflow_id, limit],
        using=using,
        convert={"after": list},
    )


def workflow_of(job_id: int, *, using: str | None = None) -> WorkflowOf | None:
    """The workflow job ``job_id`` is a step of, or None."""
    return fetch_one(WorkflowOf, "workflow_of", [check_id("job_id", job_id)], using=using)


def workflow_counts(using: str | None = None) -> dict[tuple[str, str], int]:
    """How many workflows and batches are in each state: ``{(kind, state): n}``."""
    with cursor(using) as c:
        c.execute(query("workflow_counts"))
        return {(str(k), str(s)): int(n) for k, s, n in c.fetchall()}
