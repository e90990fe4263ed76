"""Plain value types shared by the producer API."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, TypeAlias

from awa_django import serialization
from awa_django.retry import RetryPolicy

if TYPE_CHECKING:
    from awa_django.unique import UniqueSpec

__all__ = ["JSON", "SEAL", "EnqueuedJob", "JobOptions", "JobRequest"]

#: A JSON value as ``json.loads`` returns it: what awa_django's jsonb columns hold (arguments,
#: results, metadata, progress, errors).
JSON: TypeAlias = dict[str, "JSON"] | list["JSON"] | str | int | float | bool | None


#: Set on every request ``awa_django.db.enqueue.build_request`` makes (and only on those).
SEAL = object()


@dataclasses.dataclass(frozen=True, slots=True)
class JobOptions:
    """Options of one enqueue. ``None`` means "the setting's default" where one applies.

    ``run_after`` is an aware ``datetime`` or a ``timedelta`` measured on the database clock at
    enqueue; ``deadline`` is the hard time limit of one attempt (seconds or ``timedelta``);
    ``retry`` the job's retry policy, stored with it (``awa_django.RetryPolicy``).
    ``weight`` (1-10,000, default 1) is how many execution slots of a worker process and how
    many permits of the queue's global concurrency limit one attempt takes (docs/flow.md).
    ``serial_key`` (a string of 1-255 characters) makes the job run only while no other job of
    its queue with the same key runs, after the older ones (docs/flow.md, "Per-key
    serialisation").
    ``unique`` (or any of ``unique_key``, ``unique_for``, ``unique_states``) makes the job hold
    a key while it may block duplicates; ``on_conflict`` says what enqueueing a duplicate does
    (``"return"`` the existing job's handle, or ``"raise"`` ``DuplicateJobError``).
    """

    queue: str | None = None
    priority: int = 0
    max_attempts: int | None = None
    run_after: datetime | timedelta | None = None
    deadline: float | timedelta | None = None
    tags: tuple[str, ...] = ()
    metadata: Mapping[str, object] | None = None
    using: str | None = None
    unique: bool = False
    unique_key: str | None = None
    unique_for: float | timedelta | None = None
    unique_states: tuple[str, ...] | None = None
    on_conflict: Literal["return", "raise"] = "return"
    retry: RetryPolicy | None = None
    weight: int = 1
    serial_key: str | None = None


class _JobRequestFields(NamedTuple):
    """The fields of a ``JobRequest``."""

    kind: str
    queue: str
    priority: int
    using: str
    max_attempts: int
    args_json: str
    run_at: datetime | None = None
    delay: float | None = None
    deadline: float | None = None
    metadata_json: str | None = None
    tags: tuple[str, ...] | None = None
    sealed: object = None
    unique: UniqueSpec | None = None


class JobRequest(_JobRequestFields):
    """A validated, encoded job request not yet sent (from ``Job.prepare``). Immutable (a named
    tuple: cheap to create by the thousand).

    Every field is already checked; ``args_json`` and ``metadata_json`` are the encoded JSON.
    ``run_at`` (aware, UTC) and ``delay`` (seconds, measured on the database clock) are
    exclusive. Only requests made by ``Job.prepare`` are accepted by ``enqueue_many``: one
    rebuilt with ``_replace`` or constructed by hand is refused (it is not ``sealed``), since
    the bulk path writes rows without checking them again.
    """

    __slots__ = ()

    def _replace(self, **changes: Any) -> JobRequest:
        """A copy with ``changes``, no longer sealed: ``enqueue_many`` refuses it."""
        values = self._asdict()
        unknown = set(changes) - set(values)
        if unknown:
            raise ValueError(f"Got unexpected field names: {sorted(unknown)!r}")
        values.update(changes, sealed=None)
        return JobRequest(**values)

    def payload(self) -> str:
        """This request as one JSON object of the array ``awa.enqueue_v1`` takes."""
        return serialization.encode(self.payload_value())

    def payload_value(self) -> dict[str, Any]:
        """The object ``payload`` encodes (``send_requests`` encodes a batch of them at once)."""
        value: dict[str, Any] = {
            "kind": self.kind,
            "queue": self.queue,
            "priority": self.priority,
            "max_attempts": self.max_attempts,
            "args": serialization.fragment(self.args_json),
        }
        if self.run_at is not None:
            value["run_at"] = self.run_at.isoformat()
        if self.delay is not None:
            value["delay"] = self.delay
        if self.deadline is not None:
            value["deadline"] = self.deadline
        if self.metadata_json is not None:
            value["metadata"] = serialization.fragment(self.metadata_json)
        if self.tags:
            value["tags"] = list(self.tags)
        return value


class EnqueuedJob(NamedTuple):
    """A job written in the caller's transaction: visible to workers once that commits.

    ``state`` is ``available`` or ``scheduled`` (a future ``run_after``). Immutable (a named
    tuple: cheap to create by the thousand in ``enqueue_many``).

    ``duplicate`` is True when a unique job was not written because another job holds its key:
    ``id``, ``queue``, ``priority`` and ``state`` are then that job's.

    ``wait(timeout)`` blocks until the job has ended and returns its ``JobOutcome``;
    ``result(timeout)`` (and ``await aresult(timeout)``) returns its result, or raises
    ``JobFailedError`` when it failed or was cancelled (docs/workflows.md, "Waiting").
    """

    id: int
    kind: str
    queue: str
    priority: int
    state: str
    using: str
    duplicate: bool = False

    def wait(self, timeout: float | None = None) -> Any:
        """Block until the job has ended (``TimeoutError`` after ``timeout`` seconds); return
        its ``awa_django.workflows.JobOutcome``."""
        return job_waiters[0](self, timeout)

    def result(self, timeout: float | None = None) -> Any:
        """``wait``, then the job's result; ``JobFailedError`` when it did not complete."""
        return job_waiters[1](self, timeout)

    async def aresult(self, timeout: float | None = None) -> Any:
        """Async ``result``."""
        return await job_waiters[2](self, timeout)


#: The waits of ``EnqueuedJob`` (set by ``awa_django.workflows``, which the package imports):
#: wait, result, async result.
job_waiters: tuple[Any, Any, Any] = (None, None, None)
