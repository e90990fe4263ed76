"""Typed wrappers over the storage engine's SQL functions, for worker-side psycopg connections.

Each function is one statement (one short transaction in autocommit mode) per batch. No SQL
text lives here: statements come from ``awa_django/sql/queries/storage.sql``.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any, NamedTuple

import psycopg
from psycopg.rows import RowMaker, no_result

from awa_django import serialization
from awa_django.sql import query

__all__ = [
    "Claimed",
    "ClaimedJob",
    "Finalization",
    "QueueCounts",
    "QueueReadiness",
    "aclaim",
    "aclaim_units",
    "afinalize",
    "aheartbeat",
    "aqueues_ready",
    "claim",
    "finalize",
    "finalize_statement",
    "heartbeat",
    "promote",
    "queue_counts",
    "queue_depth",
    "queues_ready",
]


class ClaimedJob(NamedTuple):
    """One claimed attempt. ``(job_id, run_lease)`` is its identity for every later write.

    Built from a row of ``awa.claim_v3`` by column name (the ``claim`` query names each column
    after a field). ``args_json`` is left undecoded: the executor decodes it once, where it
    needs it. ``metadata``, ``tags`` and ``errors`` (of the previous attempts) are the job's,
    for its context.

    A named tuple (immutable, fields by name): built once per claimed row, where a frozen
    dataclass cost about 1 µs a row (docs/performance.md, "Per-job cost of the worker").
    """

    job_id: int
    run_lease: int
    attempt: int
    max_attempts: int
    claim_slot: int
    kind: str
    args_json: str
    queue: str
    priority: int
    deadline_at: datetime | None
    timeout_secs: float | None
    progress: Any
    metadata: Any = None
    tags: list[str] | None = None
    errors: Any = None
    weight: int = 1
    permits: list[int] | None = None
    serial_lock: int | None = None
    #: Seconds from when the job was due (its ``run_at``) to this claim, on the database
    #: clock: its queue wait (None on rows built elsewhere).
    wait_secs: float | None = None


class Claimed(NamedTuple):
    """What one claim returned (``aclaim_units``).

    ``jobs`` are the attempts claimed, in claim order. ``limited`` tells that a flow limit of
    the queue (global concurrency or rate, docs/flow.md) or of a job kind held the claim back;
    ``wait`` is then the seconds until the queue's rate limit lets the next job through (None:
    permits ran out, or no queue rate limit bound): claim no sooner. ``soft_wait`` is the
    seconds until the rate limit of a kind whose jobs are parked lets the next one through:
    claim again then, or sooner when woken (other jobs of the queue may arrive meanwhile).
    """

    jobs: list[ClaimedJob]
    limited: bool = False
    wait: float | None = None
    soft_wait: float | None = None


class Finalization(NamedTuple):
    """The outcome of one attempt for ``finalize``.

    ``outcome`` is ``completed``, ``retry``, ``snooze``, ``cancel``, ``fail`` or ``wait``;
    ``result_json`` is the encoded return value (completed); ``error`` is ``{"type",
    "message", "traceback"}`` of storable text; ``delay`` (seconds) is the RetryAfter or Snooze
    delay; ``backoff_base`` (a retry without a delay) is ``RETRY_BACKOFF_BASE``, the base of
    the backoff the database computes from the job's retry policy; ``progress_json`` the
    progress the attempt set, as checked JSON text; ``has_state`` tells that the attempt may
    own an ``attempt_state`` row (it heartbeated, flushed progress or registered a callback);
    ``callback_id``, ``timeout`` and ``resume`` are a wait's (``WaitForCallback``).
    Values are checked before one is built; ``awa.finalize_v1`` checks them again and refuses
    a batch holding a bad one. A named tuple, like
    ``ClaimedJob`` (one is built per finished attempt).
    """

    job_id: int
    run_lease: int
    claim_slot: int
    outcome: str
    result_json: str | None = None
    error: dict[str, Any] | None = None
    delay: float | None = None
    progress_json: str | None = None
    has_state: bool = False
    callback_id: uuid.UUID | None = None
    timeout: float | None = None
    backoff_base: float | None = None
    resume: bool = False

    def to_json(self) -> str:
        """This outcome as one JSON object of the array ``awa.finalize_v1`` takes."""
        return serialization.encode(self.to_value())

    def is_plain_completion(self) -> bool:
        """A completion with a ``null`` result and nothing else to write (the common case)."""
        return (
            self.outcome == "completed"
            and self.result_json == "null"
            and self.error is None
            and self.delay is None
            and self.progress_json is None
            and not self.has_state
            and self.callback_id is None
        )

    def to_value(self) -> dict[str, Any]:
        """The object ``to_json`` encodes."""
        value: dict[str, Any] = {
            "id": self.job_id,
            "lease": self.run_lease,
            "slot": self.claim_slot,
            "outcome": self.outcome,
        }
        if self.result_json is not None:
            value["result"] = serialization.fragment(self.result_json)
        if self.error is not None:
            value["error"] = self.error
        if self.delay is not None:
            value["delay"] = float(self.delay)
        if self.backoff_base is not None:
            value["backoff_base"] = float(self.backoff_base)
        if self.progress_json is not None:
            value["progress"] = serialization.fragment(self.progress_json)
        if self.has_state:
            value["st"] = True
        if self.callback_id is not None:
            value["callback_id"] = str(self.callback_id)
            value["timeout"] = float(self.timeout or 3600)
            if self.resume:
                value["resume"] = True
        return value

    @staticmethod
    def batch_json(items: Sequence[Finalization]) -> str:
        """The JSON array of ``items`` that ``awa.finalize_v1`` takes.

        Plain completions (``is_plain_completion``: the bulk of a busy worker's outcomes) are
        written as fixed text around their three integers; the others go through the encoder,
        in the same order. Both give the same JSON (tests/storage/test_finalize.py compares
        them).
        """
        parts: list[str] = []
        for item in items:
            if (
                item.is_plain_completion()
                and type(item.job_id) is int
                and type(item.run_lease) is int
                and type(item.claim_slot) is int
            ):
                parts.append(
                    f'{{"id":{item.job_id},"lease":{item.run_lease},'
                    f'"slot":{item.claim_slot},"outcome":"completed","result":null}}'
                )
            else:
                parts.append(serialization.encode(item.to_value()))
        return "[" + ",".join(parts) + "]"


@dataclasses.dataclass(frozen=True, slots=True)
class QueueCounts:
    """Job counts of one queue, computed on demand (``awa.queue_counts_v1()``).

    Every count is exact: the live ones counted, ``completed``, ``failed`` and ``cancelled``
    (terminal history, as long as it is retained) from the history's own counts, at any size.
    """

    queue: str
    available: int
    running: int
    waiting_external: int
    scheduled: int
    retryable: int
    completed: int
    failed: int
    cancelled: int
    dlq: int
    paused: bool


_CLAIMED_JOB_FIELDS = ClaimedJob._fields

#: A row in the fields' order as a ``ClaimedJob``, without binding 15 arguments.
_new_claimed_job = ClaimedJob._make


def _claimed_job(
    cursor: psycopg.Cursor[object] | psycopg.AsyncCursor[object],
) -> RowMaker[ClaimedJob]:
    """The row factory of the ``claim`` query: each row as a ``ClaimedJob``, by column name.

    The result's column names are matched to the fields once per result (a missing, extra or
    misspelt column raises ``TypeError``); rows are then built in the fields' order without a
    dict per row, as fast as ``ClaimedJob(*row)`` (``psycopg.rows.class_row`` is about three
    times slower on this path).
    """
    if cursor.description is None:
        return no_result
    names = [column.name for column in cursor.description]
    if sorted(names) != sorted(_CLAIMED_JOB_FIELDS):
        raise TypeError(f"claim columns {names} do not match ClaimedJob {_CLAIMED_JOB_FIELDS}")
    order = [names.index(field) for field in _CLAIMED_JOB_FIELDS]
    if order == list(range(len(order))):
        return _new_claimed_job
    return lambda values: ClaimedJob(*[values[i] for i in order])


def _claim_params(
    queue: str,
    limit: int,
    worker_id: uuid.UUID | None,
    aging: float,
    deadline: float | None,
    max_weight: int | None = None,
    held: Sequence[int] | None = None,
    release: Sequence[int] | None = None,
    serial_held: Sequence[int] | None = None,
    serial_release: Sequence[int] | None = None,
) -> list[Any]:
    return [
        queue,
        limit,
        worker_id,
        aging,
        deadline,
        max_weight,
        _int_array(held),
        _int_array(release),
        _int_array(serial_held),
        _int_array(serial_release),
    ]


def _int_array(keys: Sequence[int] | None) -> str | None:
    """Lock keys as an ``integer[]`` literal (a quarter of what adapting a list costs); each
    is checked to be an ``int`` first, so nothing but digits and signs reaches the text."""
    if keys is None:
        return None
    for key in keys:
        if type(key) is not int:
            raise TypeError(f"lock keys are ints, got {type(key).__name__}")
    return "{" + ",".join(map(str, keys)) + "}"


def _claimed(rows: list[ClaimedJob]) -> Claimed:
    """Split a claim's rows into its jobs and its flow-limit marker (a last row, job_id NULL)."""
    last: Any = rows[-1].job_id if rows else 0  # None on the marker row only
    if last is None:
        marker = rows.pop()
        return Claimed(rows, True, marker.timeout_secs, marker.wait_secs)
    return Claimed(rows)


def _finalize_payload(items: Sequence[Finalization]) -> str:
    return Finalization.batch_json(items)


def finalize_statement(items: Sequence[Finalization]) -> str:
    """The statement that writes ``items``: ``finalize`` (awa.finalize_v2), or
    ``finalize_waits`` (awa.finalize_v3, which also records each wait's mode and timeout and
    resumes an answered ``resume`` wait) for a batch that parks attempts."""
    for item in items:
        if item.callback_id is not None:
            return query("finalize_waits")
    return query("finalize")


def _heartbeat_payload(attempts: Sequence[tuple[int, int, str | None]]) -> str:
    return serialization.encode(
        [
            {"id": int(job_id), "lease": int(lease)}
            if progress is None
            else {
                "id": int(job_id),
                "lease": int(lease),
                "progress": serialization.fragment(progress),
            }
            for job_id, lease, progress in attempts
        ]
    )


def _pairs(rows: list[tuple[Any, ...]]) -> list[tuple[int, int]]:
    return [(row[0], row[1]) for row in rows]


def claim(
    conn: psycopg.Connection[Any],
    queue: str,
    limit: int,
    worker_id: uuid.UUID | None = None,
    *,
    aging_interval: float = 60.0,
    default_deadline: float | None = None,
    serial_held: Sequence[int] | None = None,
    serial_release: Sequence[int] | None = None,
) -> list[ClaimedJob]:
    """Claim up to ``limit`` units of ``queue`` in one short transaction (see ``awa.claim_v3``).

    A job takes its weight in units (1 unless it was enqueued with ``weight``). On a queue with
    a global concurrency limit the jobs' permits are held by ``conn``'s session until handed
    back (``awa.flow_release_v1`` with each job's ``permits``, or the session's end). A job
    enqueued with a ``serial_key`` holds its key's run lock (``serial_lock``) the same way:
    pass the locks of jobs still running as ``serial_held`` (a session takes its own lock
    again), and hand them back with ``serial_release`` or ``awa.serial_release_v1``.
    """
    params = _claim_params(
        queue,
        limit,
        worker_id,
        aging_interval,
        default_deadline,
        serial_held=serial_held,
        serial_release=serial_release,
    )
    with conn.cursor(row_factory=_claimed_job) as cursor:
        return _claimed(cursor.execute(query("claim"), params).fetchall()).jobs


async def aclaim(
    conn: psycopg.AsyncConnection[Any],
    queue: str,
    limit: int,
    worker_id: uuid.UUID | None = None,
    *,
    aging_interval: float = 60.0,
    default_deadline: float | None = None,
) -> list[ClaimedJob]:
    """Async ``claim``."""
    params = _claim_params(queue, limit, worker_id, aging_interval, default_deadline)
    async with conn.cursor(row_factory=_claimed_job) as cursor:
        await cursor.execute(query("claim"), params)
        return _claimed(await cursor.fetchall()).jobs


async def aclaim_units(
    conn: psycopg.AsyncConnection[Any],
    queue: str,
    units: int,
    worker_id: uuid.UUID | None = None,
    *,
    aging_interval: float = 60.0,
    default_deadline: float | None = None,
    max_weight: int | None = None,
    held: Sequence[int] | None = None,
    release: Sequence[int] | None = None,
    serial_held: Sequence[int] | None = None,
    serial_release: Sequence[int] | None = None,
) -> Claimed:
    """The worker's claim: up to ``units`` of ``queue`` within its flow limits.

    ``release`` (permits of attempts that ended) is handed back first, in the same statement,
    also when ``units`` is 0; ``held`` (permits of attempts still running) is never taken twice;
    ``max_weight`` caps a job's weight to what this process could ever run. ``serial_held`` and
    ``serial_release`` are the same for serial keys' run locks (``ClaimedJob.serial_lock``):
    released keys are handed on to the oldest job waiting for them.
    """
    params = _claim_params(
        queue,
        units,
        worker_id,
        aging_interval,
        default_deadline,
        max_weight,
        held,
        release,
        serial_held,
        serial_release,
    )
    async with conn.cursor(row_factory=_claimed_job) as cursor:
        await cursor.execute(query("claim"), params)
        return _claimed(await cursor.fetchall())


def finalize(conn: psycopg.Connection[Any], items: Sequence[Finalization]) -> list[tuple[int, int]]:
    """Write a batch of outcomes in one statement; return the stale ``(job_id, run_lease)``s.

    A stale attempt (already closed by rescue, cancel or another finalizer) changes nothing.
    """
    if not items:
        return []
    return _pairs(conn.execute(finalize_statement(items), [_finalize_payload(items)]).fetchall())


async def afinalize(
    conn: psycopg.AsyncConnection[Any], items: Sequence[Finalization]
) -> list[tuple[int, int]]:
    """Async ``finalize``."""
    if not items:
        return []
    cursor = await conn.execute(finalize_statement(items), [_finalize_payload(items)])
    return _pairs(await cursor.fetchall())


def heartbeat(
    conn: psycopg.Connection[Any], attempts: Sequence[tuple[int, int, str | None]]
) -> list[tuple[int, int]]:
    """Refresh ``(job_id, run_lease, progress JSON text or None)`` attempts in one statement.

    Returns the attempts that are no longer open (their handlers should stop).
    """
    if not attempts:
        return []
    return _pairs(conn.execute(query("heartbeat"), [_heartbeat_payload(attempts)]).fetchall())


async def aheartbeat(
    conn: psycopg.AsyncConnection[Any], attempts: Sequence[tuple[int, int, str | None]]
) -> list[tuple[int, int]]:
    """Async ``heartbeat``."""
    if not attempts:
        return []
    cursor = await conn.execute(query("heartbeat"), [_heartbeat_payload(attempts)])
    return _pairs(await cursor.fetchall())


def promote(conn: psycopg.Connection[Any], limit: int = 4096) -> int:
    """Promote up to ``limit`` due deferred jobs into the ready ring; return how many moved."""
    row = conn.execute(query("promote"), [limit]).fetchone()
    return 0 if row is None else int(row[0])


def queue_depth(conn: psycopg.Connection[Any], queue: str | None = None) -> dict[str, int]:
    """Approximate available jobs per queue from lane cursors (cheap; may over-count briefly)."""
    return {row[0]: int(row[1]) for row in conn.execute(query("queue_depth"), [queue]).fetchall()}


def queue_counts(conn: psycopg.Connection[Any]) -> list[QueueCounts]:
    """Exact counts per queue and state (scans live planes and retained history)."""
    return [QueueCounts(*row) for row in conn.execute(query("queue_counts")).fetchall()]


class QueueReadiness(NamedTuple):
    """One queue as the sweep of idle queues read it (``awa.queues_ready_v2``).

    ``ready``: a claim now would take a job from it. ``stamp``: a digest of its lanes' last
    positions when each of them is spent (claimed or rolled back), else None: handed back with
    the next probe, an unchanged stamp proves its lanes still hold nothing, at the cost of
    reading their sequences only. ``upto``: the queue was read in part (more lanes than one
    probe reads): the last lane read, to probe it again from there; else None.
    """

    queue: str
    ready: bool
    stamp: int | None
    upto: int | None


def _ready_params(
    queues: Sequence[str],
    stamps: Sequence[int | None] | None,
    caps: Sequence[int] | None,
    max_lanes: int,
    after_lane: int | None,
) -> dict[str, Any]:
    return {
        "queues": list(queues),
        "stamps": None if stamps is None else list(stamps),
        "caps": None if caps is None else list(caps),
        "max_lanes": max_lanes,
        "after_lane": after_lane,
    }


def queues_ready(
    conn: psycopg.Connection[Any],
    queues: Sequence[str],
    *,
    stamps: Sequence[int | None] | None = None,
    caps: Sequence[int] | None = None,
    max_lanes: int = 128,
    after_lane: int | None = None,
) -> list[QueueReadiness]:
    """Which of ``queues`` a claim would take a job from now: a row per queue read, in order,
    as many as fit in ``max_lanes`` lanes (at least the first; see ``QueueReadiness``).
    ``stamps`` and ``caps`` are per queue: the stamps the last probe gave (or None), and the
    most units the worker could give one job of it. ``conn`` must hold no flow permits."""
    params = _ready_params(queues, stamps, caps, max_lanes, after_lane)
    return [QueueReadiness(*row) for row in conn.execute(query("queues_ready"), params)]


async def aqueues_ready(
    conn: psycopg.AsyncConnection[Any],
    queues: Sequence[str],
    *,
    stamps: Sequence[int | None] | None = None,
    caps: Sequence[int] | None = None,
    max_lanes: int = 128,
    after_lane: int | None = None,
) -> list[QueueReadiness]:
    """Async ``queues_ready``."""
    params = _ready_params(queues, stamps, caps, max_lanes, after_lane)
    cursor = await conn.execute(query("queues_ready"), params)
    return [QueueReadiness(*row) for row in await cursor.fetchall()]
