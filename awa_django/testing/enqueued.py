"""What a test enqueued: ``enqueued_jobs()``, ``assert_enqueued()``, ``assert_not_enqueued()``.

They read the jobs waiting to run (available, scheduled, retryable) through the test's own
Django connection, so jobs the test enqueued and has not committed are there. A failed
assertion says what was expected and lists what was enqueued, each job with the fields that
differ.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from django.db import connections

from awa_django.conf import get_awa_settings
from awa_django.limits import check_queue_name
from awa_django.sql import query
from awa_django.testing.drain import kind_names

__all__ = ["QueuedJob", "assert_enqueued", "assert_not_enqueued", "enqueued_jobs"]

#: How many jobs a failed assertion lists before it only counts the rest.
_SHOWN = 20


@dataclasses.dataclass(frozen=True, slots=True)
class QueuedJob:
    """A job waiting to run: ``state`` is ``available``, ``scheduled`` or ``retryable``.
    ``args`` and ``kwargs`` are the decoded JSON the handler will be called with (a tuple was
    stored as a list); a django.tasks task's are the task's."""

    id: int
    kind: str
    queue: str
    state: str
    priority: int
    attempt: int
    max_attempts: int
    args: list[Any]
    kwargs: dict[str, Any]
    run_at: datetime | None
    tags: list[str]
    metadata: dict[str, Any]


def enqueued_jobs(
    kind: object = None,
    *,
    queue: str | Iterable[str] | None = None,
    using: str | None = None,
) -> list[QueuedJob]:
    """The jobs waiting to run (available, scheduled, retryable), oldest first, of ``kind``
    (a kind's name, a ``@job`` function or a django.tasks ``Task``, or a list of them; None:
    every kind) and ``queue`` (a name or a list; None: every queue)."""
    kinds = kind_names(kind)
    queues = [queue] if isinstance(queue, str) else None if queue is None else list(queue)
    for name in queues or ():
        check_queue_name(name)
    alias = using or get_awa_settings().DATABASE_ALIAS
    with connections[alias].cursor() as cursor:
        cursor.execute(query("testing_waiting_jobs"), {"queues": queues})
        rows = cursor.fetchall()
    jobs = [_queued(row) for row in rows]
    return [job for job in jobs if kinds is None or job.kind in kinds]


def assert_enqueued(
    kind: object,
    *,
    args: Sequence[Any] | None = None,
    kwargs: Mapping[str, Any] | None = None,
    queue: str | None = None,
    priority: int | None = None,
    tags: Iterable[str] | None = None,
    count: int | None = None,
    using: str | None = None,
) -> list[QueuedJob]:
    """Assert that jobs of ``kind`` wait to run with these fields, and return them.

    ``args`` must equal the job's positional arguments (a tuple compares as the list it was
    stored as); ``kwargs`` names keyword arguments the job must have with these values (others
    may be there too); ``tags`` are tags the job must carry. ``count``: exactly that many
    match (default: at least one). Raises ``AssertionError`` listing what was enqueued."""
    if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 0):
        raise ValueError(f"count must be an int of at least 0, got {count!r}")
    expected = _Expected.of(kind, args, kwargs, queue, priority, tags)
    jobs = enqueued_jobs(using=using)
    matching = [job for job in jobs if not expected.differences(job)]
    if (len(matching) >= 1) if count is None else (len(matching) == count):
        return matching
    wanted = "at least 1" if count is None else str(count)
    raise AssertionError(
        f"expected {wanted} enqueued {expected.describe()}; found {len(matching)}.\n"
        + _report(expected, jobs)
    )


def assert_not_enqueued(
    kind: object,
    *,
    args: Sequence[Any] | None = None,
    kwargs: Mapping[str, Any] | None = None,
    queue: str | None = None,
    priority: int | None = None,
    tags: Iterable[str] | None = None,
    using: str | None = None,
) -> None:
    """Assert that no job of ``kind`` with these fields waits to run (the fields match as in
    :func:`assert_enqueued`). Raises ``AssertionError`` listing the jobs that match."""
    expected = _Expected.of(kind, args, kwargs, queue, priority, tags)
    matching = [job for job in enqueued_jobs(using=using) if not expected.differences(job)]
    if matching:
        raise AssertionError(
            f"expected no enqueued {expected.describe()}; found {len(matching)}:\n"
            + "\n".join(f"  {_line(job)}" for job in matching[:_SHOWN])
            + _more(len(matching))
        )


@dataclasses.dataclass(frozen=True, slots=True)
class _Expected:
    kinds: frozenset[str]
    args: list[Any] | None
    kwargs: dict[str, Any] | None
    queue: str | None
    priority: int | None
    tags: frozenset[str] | None

    @classmethod
    def of(
        cls,
        kind: object,
        args: Sequence[Any] | None,
        kwargs: Mapping[str, Any] | None,
        queue: str | None,
        priority: int | None,
        tags: Iterable[str] | None,
    ) -> _Expected:
        kinds = kind_names(kind)
        if kinds is None:
            raise TypeError("name the job kind to look for (its name, @job function or Task)")
        if args is not None and (isinstance(args, str | bytes) or not isinstance(args, Sequence)):
            raise TypeError(f"args must be a list or tuple, got {type(args).__name__}")
        if kwargs is not None and not isinstance(kwargs, Mapping):
            raise TypeError(f"kwargs must be a mapping, got {type(kwargs).__name__}")
        if queue is not None:
            if not isinstance(queue, str):
                raise TypeError(f"queue must be a str, got {queue!r}")
            check_queue_name(queue)
        if priority is not None and (isinstance(priority, bool) or not isinstance(priority, int)):
            raise TypeError(f"priority must be an int, got {priority!r}")
        if tags is not None and isinstance(tags, str):
            raise TypeError("tags must be a list of str, not one str")
        return cls(
            kinds,
            None if args is None else _as_stored("args", list(args)),
            None if kwargs is None else _as_stored("kwargs", dict(kwargs)),
            queue,
            priority,
            None if tags is None else frozenset(tags),
        )

    def describe(self) -> str:
        parts = [f"job of kind {' or '.join(sorted(self.kinds))}"]
        if self.args is not None:
            parts.append(f"args {_show(self.args)}")
        if self.kwargs is not None:
            parts.append(f"kwargs including {_show(self.kwargs)}")
        if self.queue is not None:
            parts.append(f"in queue {self.queue!r}")
        if self.priority is not None:
            parts.append(f"at priority {self.priority}")
        if self.tags is not None:
            parts.append(f"tagged {sorted(self.tags)}")
        return ", ".join(parts)

    def differences(self, job: QueuedJob) -> list[str]:
        """What of ``job`` differs from what is expected (empty: it matches)."""
        found = []
        if job.kind not in self.kinds:
            found.append(f"kind {job.kind}")
        if self.args is not None and _show(job.args, cut=False) != _show(self.args, cut=False):
            found.append(f"args {_show(job.args)}")
        if self.kwargs is not None:
            for key, value in self.kwargs.items():
                if key not in job.kwargs:
                    found.append(f"no kwarg {key!r}")
                elif _show(job.kwargs[key], cut=False) != _show(value, cut=False):
                    found.append(f"kwarg {key!r} is {_show(job.kwargs[key])}, not {_show(value)}")
        if self.queue is not None and job.queue != self.queue:
            found.append(f"queue {job.queue!r}")
        if self.priority is not None and job.priority != self.priority:
            found.append(f"priority {job.priority}")
        if self.tags is not None and not self.tags <= set(job.tags):
            found.append(f"tags {sorted(job.tags)}")
        return found


def _report(expected: _Expected, jobs: list[QueuedJob]) -> str:
    """The jobs of the expected kinds, each with what differs; the others counted by kind."""
    same_kind = [job for job in jobs if job.kind in expected.kinds]
    if not jobs:
        return "Nothing is enqueued (available, scheduled or retryable)."
    lines = []
    if same_kind:
        lines.append(f"Enqueued jobs of that kind ({len(same_kind)}):")
        for job in same_kind[:_SHOWN]:
            differs = expected.differences(job)
            note = f"  <- {'; '.join(differs)}" if differs else "  (matches)"
            lines.append(f"  {_line(job)}{note}")
        lines.append(_more(len(same_kind)).strip("\n"))
    else:
        lines.append("No job of that kind is enqueued.")
    others = Counter(job.kind for job in jobs if job.kind not in expected.kinds)
    if others:
        listed = ", ".join(f"{kind} x{n}" for kind, n in others.most_common(_SHOWN))
        lines.append(f"Other enqueued jobs ({sum(others.values())}): {listed}")
    return "\n".join(line for line in lines if line)


def _line(job: QueuedJob) -> str:
    text = (
        f"#{job.id} {job.kind} queue={job.queue!r} {job.state} args={_show(job.args)} "
        f"kwargs={_show(job.kwargs)}"
    )
    if job.priority:
        text += f" priority={job.priority}"
    if job.tags:
        text += f" tags={job.tags}"
    return text


def _more(n: int) -> str:
    return f"\n  ... and {n - _SHOWN} more" if n > _SHOWN else ""


def _show(value: Any, *, cut: bool = True) -> str:
    """``value`` as JSON text, keys sorted: two values match when these are equal, so that
    ``true`` is not ``1`` and ``2.0`` is not ``2`` (as the handler sees them)."""
    text = json.dumps(value, ensure_ascii=False, sort_keys=True)
    return text if not cut or len(text) <= 200 else text[:197] + "..."


def _as_stored(field: str, value: Any) -> Any:
    """``value`` as the job's JSON stores it (tuples as lists); ``TypeError`` for what JSON
    cannot hold (a model instance, a set, bytes, NaN), which no job could match."""
    try:
        return json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{field} must be plain JSON, as jobs hold it: {exc}") from None


def _queued(row: Sequence[Any]) -> QueuedJob:
    (job_id, kind, queue, state, priority, attempt, max_attempts, args, run_at, tags, meta) = row
    document = _json(args)
    positional = document.get("args") if isinstance(document, dict) else None
    named = document.get("kwargs") if isinstance(document, dict) else None
    metadata = _json(meta)
    return QueuedJob(
        id=job_id,
        kind=kind,
        queue=queue,
        state=state,
        priority=priority,
        attempt=attempt,
        max_attempts=max_attempts,
        args=positional if isinstance(positional, list) else [],
        kwargs=named if isinstance(named, dict) else {},
        run_at=run_at,
        tags=list(tags or []),
        metadata=metadata if isinstance(metadata, dict) else {},
    )


def _json(value: Any) -> Any:
    """Django's adapters hand jsonb back as text."""
    return json.loads(value) if isinstance(value, str) else value
