"""Encoding and sending enqueue requests: validation of one request, the lane cache, the
bulk paths (COPY, ``awa.enqueue_v1``). ``awa_django.jobs`` and ``awa_django.producer`` build on
it; it imports neither.

Every write goes through ``connections[alias]``, so a job enqueued inside
``transaction.atomic()`` commits or rolls back with the application's rows, and workers are
woken (NOTIFY) only at commit.
"""

from __future__ import annotations

import contextlib
import functools
import json
import threading
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

from django.conf import settings
from django.db import OperationalError, connections, transaction
from django.utils import timezone
from psycopg import IsolationLevel

from awa_django import serialization
from awa_django.conf import awa_settings, get_awa_settings
from awa_django.db.bulk import copy_enqueue
from awa_django.db.transactions import checked_alias, write_transaction
from awa_django.exceptions import (
    DuplicateJobError,
    InvalidOptionError,
    IsolationLevelError,
    LimitExceededError,
)
from awa_django.limits import (
    SERIAL_KEY,
    WEIGHT_KEY,
    check_max_attempts,
    check_metadata_keys,
    check_priority,
    check_queue_name,
    check_seconds,
    check_serial_key,
    check_text,
    check_weight,
)
from awa_django.retry import RETRY_KEY, RetryPolicy, check_retry
from awa_django.sql import query
from awa_django.telemetry.metrics import active_metrics
from awa_django.telemetry.tracing import active_tracing
from awa_django.types import SEAL, EnqueuedJob, JobOptions, JobRequest
from awa_django.unique import UniqueSpec, unique_spec

__all__ = [
    "OptionsMemo",
    "build_request",
    "ensure_lanes",
    "forget_known_lanes",
    "send_requests",
    "sql_limit_values",
    "sql_limits_json",
]


#: DATABASES[...]["OPTIONS"]["isolation_level"] of READ COMMITTED (psycopg's IntEnum).
_READ_COMMITTED_LEVEL = IsolationLevel.READ_COMMITTED

# Requests per statement in enqueue_many: large enough to amortise the round trips, small
# enough to keep one statement's data modest.
_CHUNK = 10_000

_known_lanes: set[tuple[str, str, int]] = set()
_known_lanes_lock = threading.Lock()


class OptionsMemo:
    """What ``build_request`` learnt from one ``JobOptions`` under one settings object: every
    option checked and encoded, so that the next request with the same options checks only its
    arguments. Held by a ``Job`` (whose options never change) and passed as ``memo``.

    Only options whose checked form cannot change between calls are remembered: none with
    ``metadata`` (a mapping the caller may mutate), a ``datetime`` ``run_after`` (its meaning
    depends on the active time zone) or while traces are on (each request carries its trace).
    A new ``AWA`` setting (a new settings object) forgets them.
    """

    __slots__ = ("entry",)

    def __init__(self) -> None:
        #: (settings, the request's option fields from ``queue`` to ``unique``) or None.
        self.entry: tuple[Any, _OptionParts] | None = None


class _OptionParts(NamedTuple):
    """The checked option fields of a request (``JobRequest`` order, ``using`` unchecked)."""

    queue: str
    priority: int
    using: str
    max_attempts: int
    run_at: datetime | None
    delay: float | None
    deadline: float | None
    metadata_json: str | None
    tags: tuple[str, ...] | None
    unique: UniqueSpec | None


def build_request(
    kind: str,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    options: JobOptions,
    *,
    task_backend: str | None = None,
    task_options: Mapping[str, Any] | None = None,
    memo: OptionsMemo | None = None,
) -> JobRequest:
    """Validate one request and encode it; raise a ``JobValidationError`` subclass if it is bad.

    ``task_backend`` marks a django.tasks task (the backend's alias is stored with the
    arguments, so the worker resolves the kind as a task of that backend); ``task_options``
    (JSON) are stored beside it (awa_django/backends/stored.py). ``memo`` (the same one for
    the same ``options`` only) skips checking options that were checked before: the request
    is the same, and so is the error for a bad one (the options are checked in full until
    they have passed once; the arguments and ``using`` every time, in the same order).
    """
    cfg = get_awa_settings()
    if memo is not None and task_backend is None:
        entry = memo.entry
        if entry is not None and entry[0] is cfg and active_tracing() is None:
            parts = entry[1]
            using = checked_alias(parts.using)
            args_json = serialization.dumps(
                {"args": args, "kwargs": kwargs},
                "args",
                max_bytes=cfg.ARGS_MAX_BYTES,
                max_depth=cfg.JSON_MAX_DEPTH,
                envelope=2,
            )
            return JobRequest(
                kind,
                parts.queue,
                parts.priority,
                using,
                parts.max_attempts,
                args_json,
                parts.run_at,
                parts.delay,
                parts.deadline,
                parts.metadata_json,
                parts.tags,
                SEAL,
                parts.unique,
            )
        request = _build_request(kind, args, kwargs, options, cfg, None, None)
        if (
            options.metadata is None
            and not isinstance(options.run_after, datetime)
            and active_tracing() is None
        ):
            memo.entry = (
                cfg,
                _OptionParts(
                    request.queue,
                    request.priority,
                    request.using,
                    request.max_attempts,
                    request.run_at,
                    request.delay,
                    request.deadline,
                    request.metadata_json,
                    request.tags,
                    request.unique,
                ),
            )
        return request
    return _build_request(kind, args, kwargs, options, cfg, task_backend, task_options)


def _build_request(
    kind: str,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    options: JobOptions,
    cfg: Any,
    task_backend: str | None,
    task_options: Mapping[str, Any] | None,
) -> JobRequest:
    queue = options.queue if options.queue is not None else cfg.DEFAULT_QUEUE
    check_queue_name(queue)
    priority = check_priority(options.priority)
    max_attempts = check_max_attempts(
        options.max_attempts if options.max_attempts is not None else cfg.MAX_ATTEMPTS
    )
    using = checked_alias(cfg.DATABASE_ALIAS if options.using is None else options.using)
    document: dict[str, Any] = {"args": args, "kwargs": kwargs}
    if task_backend is not None:
        document["task"] = {**(task_options or {}), "backend": task_backend}
    args_json = serialization.dumps(
        document,
        "args",
        max_bytes=cfg.ARGS_MAX_BYTES,
        max_depth=cfg.JSON_MAX_DEPTH,
        envelope=2,
    )
    run_at, delay = _timing(options.run_after)
    metadata_json = None
    retry = check_retry(options.retry)
    weight = check_weight(options.weight)
    serial_key = None if options.serial_key is None else check_serial_key(options.serial_key)
    tracing = active_tracing()  # None unless OpenTelemetry traces are on
    trace = tracing.metadata() if tracing is not None else None
    if (
        options.metadata is not None
        or retry is not None
        or weight != 1
        or serial_key is not None
        or trace
    ):
        metadata_json = _metadata_json(options.metadata, cfg, retry, weight, serial_key, trace)
    if type(options.unique) is not bool:
        raise InvalidOptionError(
            "unique", f"must be True or False, got {type(options.unique).__name__}"
        )
    unique = (
        None
        if not options.unique
        and options.unique_key is None
        and options.unique_for is None
        and options.unique_states is None
        and options.on_conflict == "return"
        else unique_spec(
            options.unique,
            options.unique_key,
            options.unique_for,
            options.unique_states,
            options.on_conflict,
        )
    )
    # Positional: a named tuple is built fastest so (enqueue_many prepares thousands).
    return JobRequest(
        kind,
        queue,
        priority,
        using,
        max_attempts,
        args_json,
        run_at,
        delay,
        None if options.deadline is None else check_seconds("deadline", options.deadline),
        metadata_json,
        _check_tags(options.tags) if options.tags else None,
        SEAL,
        unique,
    )


def _metadata_json(
    given: object,
    cfg: Any,
    retry: RetryPolicy | None,
    weight: int,
    serial_key: str | None,
    trace: dict[str, str] | None,
) -> str:
    """The metadata stored with a job, as JSON text: the caller's (``given``, a mapping whose
    keys are checked), and what awa_django keeps there: the job's retry policy, its weight (when
    not 1), its serial key and the enqueuing trace."""
    metadata: dict[Any, Any] = {}
    if given is not None:
        if not isinstance(given, Mapping):
            raise InvalidOptionError("metadata", "must be a mapping (a JSON object)")
        metadata = dict(given)
        check_metadata_keys(metadata)
    if retry is not None:
        # Stored with the job, so that every retry path follows it (awa_django/retry.py).
        metadata[RETRY_KEY] = retry.to_value()
    if weight != 1:
        metadata[WEIGHT_KEY] = weight
    if serial_key is not None:
        # Read by awa.claim_v3: one job of the key (in its queue) runs at a time.
        metadata[SERIAL_KEY] = serial_key
    if trace:
        # The enqueuing trace, for the handler's span (awa_django/telemetry/tracing.py).
        metadata.update(trace)
    return serialization.dumps(
        metadata,
        "metadata",
        max_bytes=cfg.METADATA_MAX_BYTES,
        max_depth=cfg.JSON_MAX_DEPTH,
    )


def _timing(run_after: datetime | timedelta | None) -> tuple[datetime | None, float | None]:
    """(run_at, delay) of a ``run_after``: an aware datetime (any that Python holds, which
    PostgreSQL stores too) or a delay of at most 100 years (a past one means now)."""
    if run_after is None:
        return None, None
    if isinstance(run_after, timedelta):
        if run_after <= timedelta(0):
            return None, None
        return None, check_seconds("run_after", run_after)
    if isinstance(run_after, datetime):
        if timezone.is_naive(run_after):
            if settings.USE_TZ:
                raise InvalidOptionError(
                    "run_after", "is a naive datetime while USE_TZ is on; pass an aware datetime"
                )
            try:
                run_after = timezone.make_aware(run_after)
            except (OverflowError, ValueError) as exc:
                raise InvalidOptionError("run_after", f"{run_after!r}: {exc}") from None
        try:
            # A plain datetime in UTC: PostgreSQL refuses offsets of 16 h and more, and a
            # subclass could render itself as anything.
            utc = run_after.astimezone(UTC)
            return datetime(
                utc.year,
                utc.month,
                utc.day,
                utc.hour,
                utc.minute,
                utc.second,
                utc.microsecond,
                tzinfo=UTC,
            ), None
        except (OverflowError, ValueError, TypeError) as exc:
            raise InvalidOptionError(
                "run_after", f"{run_after!r} is not a time PostgreSQL can store in UTC ({exc})"
            ) from None
    raise InvalidOptionError("run_after", "must be an aware datetime, a timedelta or None")


def _check_tags(tags: tuple[str, ...]) -> tuple[str, ...]:
    cfg = get_awa_settings()
    if len(tags) > cfg.MAX_TAGS:
        raise LimitExceededError("tags", f"{len(tags)} tags exceeds the limit of {cfg.MAX_TAGS}")
    for tag in tags:
        if type(tag) is not str or not tag:
            raise InvalidOptionError(
                "tags",
                f"{tag!r}: every tag must be a non-empty string of at most "
                f"{cfg.TAG_MAX_LENGTH} characters",
            )
        check_text("tags", tag, max_length=cfg.TAG_MAX_LENGTH)
    return tags


#: Called with the alias and the jobs after every enqueue, when set: awa_django.testing's
#: immediate mode (docs/testing.md) sets it when it is imported. None otherwise.
after_enqueue: Callable[[str, Sequence[EnqueuedJob]], None] | None = None


def send_requests(requests: Sequence[JobRequest], using: str) -> list[EnqueuedJob]:
    """Write validated requests on ``using``'s Django connection; return handles in order."""
    if not requests:
        return []
    sent = _send_requests(requests, using)
    metrics = active_metrics()
    if metrics is not None:  # OpenTelemetry metrics on: count what was written
        metrics.count("enqueued", [(job.queue, job.kind) for job in sent if not job.duplicate])
    hook = after_enqueue
    if hook is not None:
        hook(using, sent)
    return sent


def _send_requests(requests: Sequence[JobRequest], using: str) -> list[EnqueuedJob]:
    _ensure_lanes(using, {(r.queue, r.priority) for r in requests})
    if any(r.unique is not None for r in requests):
        return _send_unique(requests, using)
    statements = 1 if len(requests) == 1 else 2
    with (
        write_transaction(using, statements=statements) as connection,
        connection.cursor() as cursor,
    ):
        if len(requests) == 1:
            r = requests[0]
            cursor.execute(query("enqueue_one"), _one_values(r, _sql_limit_values()))
            row = cursor.fetchone()
            return [EnqueuedJob(row[0], r.kind, r.queue, r.priority, row[1], using)]
        results: list[EnqueuedJob] = []
        copy_allowed: bool | None = None
        for start in range(0, len(requests), _CHUNK):
            chunk = requests[start : start + _CHUNK]
            immediate = all(r.run_at is None and r.delay is None for r in chunk)
            if immediate and copy_allowed is None:
                copy_allowed = _copy_allowed(cursor)
            if immediate and copy_allowed:
                # Everything runs now: reserve lanes and ids, then COPY (about twice as fast).
                # The raw psycopg cursor's errors become Django's, as for any ORM query.
                with connection.wrap_database_errors:
                    ids = copy_enqueue(cursor.cursor, chunk)
                results.extend(
                    EnqueuedJob(job_id, r.kind, r.queue, r.priority, "available", using)
                    for r, job_id in zip(chunk, ids, strict=True)
                )
                continue
            # Timed requests (or a role that may not write the ring, docs/roles.md): the server
            # validates them and splits them into ready and deferred on its own clock.
            payload = serialization.encode([r.payload_value() for r in chunk])
            cursor.execute(query("enqueue"), [payload, _sql_limits()])
            rows = cursor.fetchall()
            results.extend(
                EnqueuedJob(row[0], r.kind, r.queue, r.priority, row[1], using)
                for r, row in zip(chunk, rows, strict=True)
            )
    return results


def _copy_allowed(cursor: Any) -> bool:
    """Whether the connection's role may COPY into the ready ring itself. A least-privilege
    application role (manage.py awa_roles) may not: its batches go through ``awa.enqueue_v1``,
    which runs as its owner and validates every request. Asked once per batch: the role of a
    connection can change between transactions (``SET ROLE``)."""
    cursor.execute(query("copy_allowed"))
    row = cursor.fetchone()
    return bool(row is not None and row[0])


#: How many times a batch with unique requests is sent again after a deadlock (two producers
#: taking overlapping keys in different orders): the loser's batch is rolled back, so it waits
#: for the winner's the next time and sees its keys.
_DEADLOCK_RETRIES = 3


def _send_unique(requests: Sequence[JobRequest], using: str) -> list[EnqueuedJob]:
    """``_send_unique_once``, sent again when a batch of several requests lost a deadlock or
    a contended key (SQLSTATE 40P01, 40001): it ran in a savepoint or a transaction of its own,
    rolled back whole. A single request in the caller's transaction is not retried (the
    transaction is aborted; the error is raised)."""
    caller = connections[using]
    retriable = len(requests) > 1 or not (caller.in_atomic_block or not caller.get_autocommit())
    for attempt in range(_DEADLOCK_RETRIES + 1):
        try:
            return _send_unique_once(requests, using)
        except OperationalError as exc:
            code = getattr(exc.__cause__, "sqlstate", None)
            if not retriable or attempt == _DEADLOCK_RETRIES or code not in ("40P01", "40001"):
                raise
    raise AssertionError("unreachable")  # pragma: no cover


def _send_unique_once(requests: Sequence[JobRequest], using: str) -> list[EnqueuedJob]:
    """Write requests of which some are unique, one ``awa.enqueue_one_v3`` each, in order (a
    duplicate of an earlier request of the batch included), in one READ COMMITTED transaction
    (``IsolationLevelError`` in a caller's transaction at another level, nothing written).
    A duplicate with ``on_conflict="raise"`` raises ``DuplicateJobError`` once every request
    is sent, with none of the batch written (its own transaction in autocommit, a savepoint in
    the caller's), the caller's transaction still usable."""
    results: list[EnqueuedJob] = []
    raised: EnqueuedJob | None = None
    limits = _sql_limit_values()
    caller = connections[using]
    in_caller = caller.in_atomic_block or not caller.get_autocommit()
    # In the caller's transaction, a batch runs in a savepoint, so that a refusal (a duplicate
    # with on_conflict="raise", an isolation level other than READ COMMITTED) leaves none of it
    # written. The level is checked by the SQL function itself (which then writes nothing and
    # names the level): no round trip of its own.
    savepoint = in_caller and len(requests) > 1
    # Our own transaction is set to READ COMMITTED only when the alias is configured otherwise.
    own_rc = not in_caller and caller.settings_dict.get("OPTIONS", {}).get(
        "isolation_level"
    ) not in (None, _READ_COMMITTED_LEVEL)
    with (
        transaction.atomic(using=using) if savepoint else contextlib.nullcontext(),
        write_transaction(using, statements=len(requests), read_committed=own_rc) as connection,
        connection.cursor() as cursor,
    ):
        # The unique requests are sent in key order (after the others, which keep input order),
        # so that two batches taking overlapping keys take them in the same order; handles come
        # back in input order.
        order = sorted(range(len(requests)), key=lambda i: _send_order(requests[i], i))
        params = [
            [*_one_values(r, limits), *_unique_values(r.unique)]
            for r in (requests[i] for i in order)
        ]
        if len(params) == 1:
            cursor.execute(query("enqueue_one_unique"), params[0])
            rows = [cursor.fetchone()]
        else:
            # One pipelined executemany: the statements stream without a round trip each.
            with connection.wrap_database_errors:
                raw = cursor.cursor
                raw.executemany(query("enqueue_one_unique"), params, returning=True)
                rows = []
                while True:
                    rows.append(raw.fetchone())
                    if not raw.nextset():
                        break
        by_input: list[Any] = [None] * len(requests)
        for i, row in zip(order, rows, strict=True):
            by_input[i] = row
        for r, (job_id, state, queue, priority, duplicate) in zip(requests, by_input, strict=True):
            if job_id is None:
                raise IsolationLevelError(
                    f"a unique enqueue needs READ COMMITTED, but the caller's transaction on "
                    f"{using!r} runs at {str(state).upper()}"
                )
            handle = EnqueuedJob(job_id, r.kind, queue, priority, state, using, duplicate)
            results.append(handle)
            spec = r.unique
            if duplicate and spec is not None and spec.on_conflict == "raise" and raised is None:
                raised = handle
        if raised is not None:
            written = {h.id for h in results if not h.duplicate}
            raise DuplicateJobError(raised, in_batch=raised.id in written)
    return results


def _one_values(r: JobRequest, limits: tuple[int, ...]) -> list[Any]:
    """The arguments of ``awa.enqueue_one_v2`` (the first ones of ``enqueue_one_v3``)."""
    return [
        r.kind,
        r.queue,
        r.priority,
        r.args_json,
        r.max_attempts,
        r.run_at,
        r.delay,
        r.deadline,
        r.metadata_json,
        list(r.tags) if r.tags else None,
        *limits,
    ]


def _send_order(request: JobRequest, index: int) -> tuple[Any, ...]:
    """Where ``request`` goes in a batch sent to ``awa.enqueue_one_v3``: plain requests first
    in input order, then unique ones by kind and key (input order among equal keys, so the
    first of a batch's duplicates is the one written)."""
    spec = request.unique
    if spec is None:
        return (0, index)
    if spec.key is not None:
        text = "key:" + spec.key
    else:
        text = "args:" + json.dumps(json.loads(request.args_json), sort_keys=True)
    return (1, request.kind, text, index)


def _unique_values(spec: UniqueSpec | None) -> tuple[Any, ...]:
    """The unique arguments of ``awa.enqueue_one_v3`` for ``spec`` (None: not unique)."""
    if spec is None:
        return (False, None, None, None)
    return (
        True,
        spec.key,
        spec.for_seconds,
        list(spec.states) if spec.states is not None else None,
    )


#: How much larger PostgreSQL's binary jsonb can be than compact JSON text: a one-digit number
#: in an array is 2 bytes of text ("0,") and 12 of jsonb (entry header, aligned numeric); every
#: other value costs less (tests/django/test_producer_faults.py measures the shapes).
JSONB_GROWTH = 6

#: The SQL functions take their limits as PostgreSQL integers.
_MAX_INT4 = 2**31 - 1


def _stored_size_limit(text_bytes: int) -> int:
    """The jsonb size that JSON text of at most ``text_bytes`` bytes can take, at most."""
    return min(text_bytes * JSONB_GROWTH + 4096, _MAX_INT4)


@functools.lru_cache(maxsize=8)
def _sql_limits_for(
    args_max: int, meta_max: int, depth: int, max_tags: int, tag_len: int
) -> tuple[int, int, int, int, int]:
    return (
        _stored_size_limit(args_max),
        _stored_size_limit(meta_max),
        depth,
        max_tags,
        tag_len,
    )


def _sql_limit_values() -> tuple[int, int, int, int, int]:
    """The limits the SQL functions re-check, in ``awa.enqueue_one_v2``'s argument order.

    The SQL functions re-check limits as a second line for raw-SQL producers. They measure
    Postgres's binary jsonb size where Python measures JSON text, so Python (which has already
    applied the exact limits) passes a margin: a request accepted here is never refused there.
    """
    cfg = get_awa_settings()
    return _sql_limits_for(
        cfg.ARGS_MAX_BYTES,
        cfg.METADATA_MAX_BYTES,
        cfg.JSON_MAX_DEPTH,
        cfg.MAX_TAGS,
        cfg.TAG_MAX_LENGTH,
    )


_LIMIT_KEYS = (
    "args_max_bytes",
    "metadata_max_bytes",
    "json_max_depth",
    "max_tags",
    "tag_max_length",
)


@functools.lru_cache(maxsize=8)
def _limits_json(values: tuple[int, int, int, int, int]) -> str:
    return json.dumps(dict(zip(_LIMIT_KEYS, values, strict=True)))


def sql_limit_values() -> tuple[int, int, int, int, int]:
    """The five size limits (with the margin above) that ``awa.enqueue_one_v2`` and the
    functions built on it (``awa.cron_fire_v1``, ``awa.cron_trigger_v1``) take last."""
    return _sql_limit_values()


def _sql_limits() -> str:
    """The same limits as the JSON object of ``awa.enqueue_v1``."""
    return _limits_json(_sql_limit_values())


def sql_limits_json() -> str:
    """The limits as the JSON object ``awa.enqueue_v1`` and ``awa.workflow_enqueue_v1`` take."""
    return _sql_limits()


def ensure_lanes(using: str, pairs: set[tuple[str, int]]) -> None:
    """Make sure the lanes of each (queue, priority) exist before a producer's statement (see
    ``_ensure_lanes``)."""
    _ensure_lanes(using, pairs)


def _ensure_lanes(using: str, pairs: set[tuple[str, int]]) -> None:
    """Make sure the lanes of each (queue, priority) exist before the producer's statement.

    Lanes are created on a separate short connection when the caller is inside an atomic block:
    created inside the caller's transaction, they would make every other producer of a new queue
    wait for that transaction to end.
    """
    missing = [(q, p) for q, p in pairs if (using, q, p) not in _known_lanes]
    if not missing:
        return
    connection = connections[using]
    with connection.cursor() as cursor:
        absent = []
        for queue, priority in missing:
            cursor.execute(query("lanes_known"), [queue, priority])
            row = cursor.fetchone()
            if row is not None and row[0] > 0:
                _remember(using, queue, priority)
            else:
                absent.append((queue, priority))
    if not absent:
        return
    if connection.in_atomic_block:
        side = connections.create_connection(using)
        try:
            side.set_autocommit(True)
            with side.cursor() as cursor:
                _create_lanes(cursor, absent)
        finally:
            side.close()
    else:
        with connection.cursor() as cursor:
            _create_lanes(cursor, absent)
    for queue, priority in absent:
        _remember(using, queue, priority)


def _create_lanes(cursor: Any, pairs: list[tuple[str, int]]) -> None:
    for queue, priority in sorted(pairs):
        cursor.execute(query("ensure_lanes"), [queue, priority, awa_settings.ENQUEUE_SHARDS])


def _remember(using: str, queue: str, priority: int) -> None:
    with _known_lanes_lock:
        _known_lanes.add((using, queue, priority))


def forget_known_lanes() -> None:
    """Clear the per-process cache of lanes known to exist (for tests that drop the schema)."""
    with _known_lanes_lock:
        _known_lanes.clear()
