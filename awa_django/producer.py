"""Transactional enqueue through Django's own database connection.

Every write goes through ``connections[alias]``, so a job enqueued inside
``transaction.atomic()`` commits or rolls back with the application's rows, and workers are
woken (NOTIFY) only at commit. There is no ``on_commit`` and no outbox.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, Literal

from asgiref.sync import sync_to_async

from awa_django.conf import awa_settings
from awa_django.db.enqueue import build_request, send_requests
from awa_django.exceptions import InvalidArgumentsError, InvalidOptionError
from awa_django.jobs import get_job
from awa_django.limits import tag_tuple
from awa_django.retry import RetryPolicy
from awa_django.types import SEAL, EnqueuedJob, JobOptions, JobRequest
from awa_django.unique import states_tuple

__all__ = ["aenqueue", "aenqueue_many", "enqueue", "enqueue_many"]


def enqueue(
    kind: str,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    *,
    queue: str | None = None,
    priority: int | None = None,
    run_after: datetime | timedelta | None = None,
    max_attempts: int | None = None,
    deadline: float | timedelta | None = None,
    tags: Iterable[str] | None = None,
    metadata: Mapping[str, object] | None = None,
    using: str | None = None,
    unique: bool | None = None,
    unique_key: str | None = None,
    unique_for: float | timedelta | None = None,
    unique_states: Iterable[str] | None = None,
    on_conflict: Literal["return", "raise"] | None = None,
    retry: RetryPolicy | None = None,
    weight: int | None = None,
    serial_key: str | None = None,
) -> EnqueuedJob:
    """Enqueue one job of a registered ``kind`` in the caller's transaction.

    ``args`` is a list or tuple and ``kwargs`` a mapping (a string is refused, not split into
    characters). Options left as ``None`` take the ``@job`` defaults, then the settings'
    defaults. Raises a ``JobValidationError`` subclass, with nothing written and the caller's
    transaction untouched, for an unknown kind or bad input. The unique options are those of
    ``Job.using`` (docs/jobs.md, "Unique jobs"); ``serial_key`` that of ``Job.using``
    (docs/flow.md, "Per-key serialisation").
    """
    handle = get_job(kind)
    if type(args) not in (list, tuple):
        raise InvalidArgumentsError("args", f"must be a list or tuple, got {type(args).__name__}")
    if kwargs is not None and not isinstance(kwargs, Mapping):
        raise InvalidArgumentsError("kwargs", f"must be a mapping, got {type(kwargs).__name__}")
    if tags is not None:
        tags = tag_tuple(tags)
    base = handle.options
    options = JobOptions(
        queue=queue if queue is not None else base.queue,
        priority=priority if priority is not None else base.priority,
        max_attempts=max_attempts if max_attempts is not None else base.max_attempts,
        run_after=run_after if run_after is not None else base.run_after,
        deadline=deadline if deadline is not None else base.deadline,
        tags=tags if tags is not None else base.tags,
        metadata=metadata if metadata is not None else base.metadata,
        using=using if using is not None else base.using,
        unique=unique if unique is not None else base.unique,
        unique_key=unique_key if unique_key is not None else base.unique_key,
        unique_for=unique_for if unique_for is not None else base.unique_for,
        unique_states=(
            states_tuple(unique_states) if unique_states is not None else base.unique_states
        ),
        on_conflict=on_conflict if on_conflict is not None else base.on_conflict,
        retry=retry if retry is not None else base.retry,
        weight=weight if weight is not None else base.weight,
        serial_key=serial_key if serial_key is not None else base.serial_key,
    )
    request = build_request(kind, tuple(args), dict(kwargs or {}), options)
    return send_requests([request], request.using)[0]


def enqueue_many(requests: Iterable[JobRequest], using: str | None = None) -> list[EnqueuedJob]:
    """Enqueue prepared requests (``Job.prepare``) in the caller's transaction, in bulk.

    Requests that run at once are written with COPY, 10,000 per statement (a batch with any
    ``run_after``, or a connection whose role may not write the ready ring, such as the
    application role of ``manage.py awa_roles``, goes through ``awa.enqueue_v1`` instead,
    at less than half the speed). Order within a lane follows the
    input. All requests must target ``using`` (default ``AWA["DATABASE_ALIAS"]``). Returns
    handles in input order.

    All or nothing: outside ``transaction.atomic()`` the whole batch is one transaction of its
    own; inside, it is part of the caller's. Anything that is not a ``JobRequest`` is refused
    (``InvalidOptionError``) before anything is written.
    """
    alias = awa_settings.DATABASE_ALIAS if using is None else using
    if isinstance(requests, str | bytes | Mapping) or not isinstance(requests, Iterable):
        raise InvalidOptionError("requests", "must be an iterable of Job.prepare() requests")
    batch = list(requests)
    for index, request in enumerate(batch):
        if type(request) is not JobRequest or request.sealed is not SEAL:
            raise InvalidOptionError(
                "requests",
                f"item {index} is not a request made by Job.prepare() "
                f"(got {type(request).__name__}; requests cannot be rebuilt or constructed)",
            )
        if request.using != alias:
            raise InvalidOptionError(
                "using",
                f"request for {request.kind!r} targets database {request.using!r}, "
                f"but enqueue_many was given {alias!r}",
            )
    return send_requests(batch, alias)


async def aenqueue(kind: str, *args: Any, **options: Any) -> EnqueuedJob:
    """Async ``enqueue`` (Django's thread-sensitive executor, like the async ORM)."""
    return await sync_to_async(enqueue, thread_sensitive=True)(kind, *args, **options)


async def aenqueue_many(
    requests: Iterable[JobRequest], using: str | None = None
) -> list[EnqueuedJob]:
    """Async ``enqueue_many``."""
    return await sync_to_async(enqueue_many, thread_sensitive=True)(list(requests), using)
