"""The context a handler registered with ``@job(takes_context=True)`` receives as its first
argument."""

from __future__ import annotations

import math
import uuid
from collections.abc import Awaitable, Callable, Iterable
from datetime import datetime
from typing import TYPE_CHECKING, NamedTuple, Protocol, cast

from django.db import OperationalError, connections

from awa_django import serialization
from awa_django.conf import awa_settings
from awa_django.exceptions import InvalidOptionError, LimitExceededError
from awa_django.limits import check_text
from awa_django.sql import query
from awa_django.types import JSON

if TYPE_CHECKING:
    from awa_django.db.storage import ClaimedJob

__all__ = ["JobContext", "WorkflowStep"]

#: Registers a callback id for an attempt in the database, before the handler can hand it out:
#: ``(ctx, callback_id) -> None``, blocking (sync handlers).
Registrar = Callable[["JobContext", uuid.UUID], None]
#: The same for async handlers: ``(ctx, callback_id) -> awaitable``.
AsyncRegistrar = Callable[["JobContext", uuid.UUID], Awaitable[None]]


class Runtime(Protocol):
    """What a context needs of the worker running it."""

    instance_id: uuid.UUID

    def request_flush(self) -> None:
        """Write pending progress with the next heartbeat batch, at once."""


#: The metadata key under which a resumed job carries the callback that resumed it.
_RESUMED_KEY = "awa:callback"
#: The metadata key of a workflow step: its workflow's id, its name and its dependencies' ends.
_WORKFLOW_KEY = "awa:workflow"
#: The most stored bytes ``JobContext.upstream`` reads at once (the dependencies' results).
_UPSTREAM_MAX_BYTES = 64 * 1024 * 1024


class WorkflowStep(NamedTuple):
    """What ``JobContext.workflow`` returns."""

    id: int
    step: str
    counts: dict[str, int]


# Progress is stored with the attempt: the same bounds as job metadata.
_PROGRESS_MAX_BYTES = 65_536
_PROGRESS_MAX_DEPTH = 32


class JobContext:
    """One attempt of one job, as seen by its handler (``@job(takes_context=True)``).

    ``id``, ``run_lease``, ``attempt`` (1 on the first), ``max_attempts``, ``queue``, ``kind``,
    ``deadline_at``; the job's ``metadata`` (a dict, empty when none) and ``tags`` (a tuple) as
    enqueued; ``errors``: the errors of the previous attempts, oldest first (each a dict with
    ``message``, ``attempt``, ``at`` and, for exceptions, ``type`` and ``traceback``).

    ``is_cancelled()`` turns true when the attempt is cancelled (admin or API), rescued, or past
    its hard deadline, and when the worker shuts down hard; a handler should then stop. Progress
    set with ``set_progress`` is checked at once (JSON only, like job arguments), written with
    the next heartbeat (or ``flush_progress``), kept across retries and cleared on success.
    """

    __slots__ = (
        "_aregistrar",
        "_callback_id",
        "_cancelled",
        "_progress",
        "_progress_dirty",
        "_progress_json",
        "_progress_set",
        "_registrar",
        "_runtime",
        "_upstream",
        "_upstream_results",
        "attempt",
        "deadline_at",
        "errors",
        "id",
        "kind",
        "max_attempts",
        "metadata",
        "queue",
        "run_lease",
        "tags",
    )

    def __init__(
        self,
        *,
        job_id: int,
        run_lease: int,
        attempt: int,
        max_attempts: int,
        queue: str,
        kind: str,
        deadline_at: datetime | None,
        progress: JSON,
        runtime: Runtime | None = None,
        registrar: Registrar | None = None,
        aregistrar: AsyncRegistrar | None = None,
        metadata: object = None,
        tags: Iterable[str] | None = None,
        errors: object = None,
    ) -> None:
        self.id = job_id
        self.run_lease = run_lease
        self.attempt = attempt
        self.max_attempts = max_attempts
        self.queue = queue
        self.kind = kind
        self.deadline_at = deadline_at
        self.metadata: dict[str, JSON] = dict(metadata) if isinstance(metadata, dict) else {}
        self.tags: tuple[str, ...] = tuple(tags or ())
        self.errors: list[JSON] = list(errors) if isinstance(errors, list) else []
        # A plain flag, not a threading.Event: set from the event loop, read from any thread
        # (attribute reads and writes are atomic), and an Event per job cost ~15 % of a no-op
        # job's CPU in the profile (docs/performance.md).
        self._cancelled = False
        self._progress: JSON = progress
        self._progress_json: str | None = None
        self._progress_dirty = False
        self._progress_set = False
        self._callback_id: uuid.UUID | None = None
        self._runtime = runtime
        self._registrar = registrar
        self._aregistrar = aregistrar
        self._upstream: dict[str, tuple[str, JSON]] | None = None
        self._upstream_results = False

    @classmethod
    def for_job(
        cls,
        job: ClaimedJob,
        runtime: Runtime | None = None,
        *,
        registrar: Registrar | None = None,
        aregistrar: AsyncRegistrar | None = None,
    ) -> JobContext:
        """The context of a claimed attempt (an ``awa_django.db.storage.ClaimedJob``)."""
        return cls(
            job_id=job.job_id,
            run_lease=job.run_lease,
            attempt=job.attempt,
            max_attempts=job.max_attempts,
            queue=job.queue,
            kind=job.kind,
            deadline_at=job.deadline_at,
            progress=job.progress,
            runtime=runtime,
            registrar=registrar,
            aregistrar=aregistrar,
            metadata=job.metadata,
            tags=job.tags,
            errors=job.errors,
        )

    def __repr__(self) -> str:
        return f"<JobContext id={self.id} attempt={self.attempt} lease={self.run_lease}>"

    @property
    def worker_id(self) -> str | None:
        """The id of the worker process running this attempt (as recorded with its claim), or
        None outside a worker."""
        instance = getattr(self._runtime, "instance_id", None)
        return None if instance is None else str(instance)

    # -- callbacks ---------------------------------------------------------------------------

    @property
    def callback_id(self) -> uuid.UUID:
        """This attempt's callback id, for ``WaitForCallback``.

        The first read registers it in the database (one round trip) before returning it, so an
        external system that answers before the handler returns is not lost. In an async
        handler, call ``await ctx.aregister_callback()`` first (a read before that raises
        ``RuntimeError``, since registering would block the event loop).
        """
        if self._callback_id is None:
            callback_id = uuid.uuid4()
            if self._registrar is not None:
                self._registrar(self, callback_id)
            self._callback_id = callback_id
        return self._callback_id

    async def aregister_callback(self) -> uuid.UUID:
        """Async: register this attempt's callback id (once) and return it (``callback_id``)."""
        if self._callback_id is None:
            callback_id = uuid.uuid4()
            if self._aregistrar is not None:
                await self._aregistrar(self, callback_id)
            elif self._registrar is not None:
                from asgiref.sync import sync_to_async

                await sync_to_async(self._registrar, thread_sensitive=True)(self, callback_id)
            self._callback_id = callback_id
        return self._callback_id

    @property
    def registered_callback_id(self) -> uuid.UUID | None:
        """The callback id registered so far (None when none was): reads nothing."""
        return self._callback_id

    @property
    def callback_result(self) -> JSON:
        """The result of the callback that last resumed this job (a wait with
        ``WaitForCallback(..., resume=True)``), as the external system sent it; None when no
        callback resumed it. Kept with the job (its metadata, ``"awa:callback"``) until the next
        resumption replaces it, so a retry of the resumed step sees it too. Reads nothing."""
        entry = self.metadata.get(_RESUMED_KEY)
        return entry.get("result") if isinstance(entry, dict) else None

    @property
    def resumed_callback_id(self) -> uuid.UUID | None:
        """The id of the callback that last resumed this job (see ``callback_result``), or
        None."""
        entry = self.metadata.get(_RESUMED_KEY)
        raw = entry.get("id") if isinstance(entry, dict) else None
        try:
            return uuid.UUID(raw) if isinstance(raw, str) else None
        except ValueError:
            return None

    # -- workflows ---------------------------------------------------------------------------

    @property
    def workflow(self) -> WorkflowStep | None:
        """The workflow (or batch) this job is a step of, or None: its id, this step's name and
        how its dependencies ended (``counts``: completed, failed, cancelled, skipped; what a
        batch callback reads). Reads nothing."""
        entry = self.metadata.get(_WORKFLOW_KEY)
        workflow_id = entry.get("id") if isinstance(entry, dict) else None
        if not isinstance(entry, dict) or not isinstance(workflow_id, int):
            return None
        raw = entry.get("deps")
        counts: dict[str, int] = {}
        for key in ("completed", "failed", "cancelled", "skipped"):
            value = raw.get(key) if isinstance(raw, dict) else None
            counts[key] = value if isinstance(value, int) else 0
        return WorkflowStep(workflow_id, str(entry.get("step", "")), counts)

    @property
    def upstream(self) -> dict[str, JSON]:
        """The results of this step's dependencies that completed, by step name (empty for a
        job outside a workflow). Read once from the database (a sync handler; an async one
        awaits ``aupstream()``). Results that together take more than 64 MiB are refused
        (``LimitExceededError``): read them one at a time with ``upstream_result(step)``."""
        rows = self._upstream_rows(results=True)
        return {step: result for step, (state, result) in rows.items() if state == "completed"}

    @property
    def upstream_states(self) -> dict[str, str]:
        """How each dependency ended, by step name: completed, failed, cancelled or skipped
        (what a step with ``on_failure="run"`` looks at). Reads no result."""
        return {step: state for step, (state, _) in self._upstream_rows(results=False).items()}

    def upstream_result(self, step: str) -> JSON:
        """The result of the dependency ``step`` (``KeyError`` when it is not one that
        completed): one result read, however many dependencies there are."""
        states = self._upstream_rows(results=False)
        if states.get(step, ("", None))[0] != "completed":
            raise KeyError(step)
        with connections[awa_settings.DATABASE_ALIAS].cursor() as cursor:
            cursor.execute(query("workflow_upstream_result"), [self.id, step])
            row = cursor.fetchone()
        if row is None:
            raise KeyError(step)
        value: JSON = serialization.loads(row[0]) if isinstance(row[0], str) else row[0]
        return value

    async def aupstream(self) -> dict[str, JSON]:
        """Async ``upstream``."""
        from asgiref.sync import sync_to_async

        return await sync_to_async(lambda: self.upstream, thread_sensitive=True)()

    async def aupstream_states(self) -> dict[str, str]:
        """Async ``upstream_states``."""
        from asgiref.sync import sync_to_async

        return await sync_to_async(lambda: self.upstream_states, thread_sensitive=True)()

    def _upstream_rows(self, *, results: bool) -> dict[str, tuple[str, JSON]]:
        if self._upstream is None or (results and not self._upstream_results):
            rows: dict[str, tuple[str, JSON]] = {}
            if self.workflow is not None:
                with connections[awa_settings.DATABASE_ALIAS].cursor() as cursor:
                    try:
                        cursor.execute(
                            query("workflow_upstream"), [self.id, results, _UPSTREAM_MAX_BYTES]
                        )
                    except OperationalError as exc:
                        if getattr(exc.__cause__, "sqlstate", None) != "54000":
                            raise
                        raise LimitExceededError("upstream", str(exc.__cause__)) from None
                    for step, _job, state, value in cursor.fetchall():
                        loaded = serialization.loads(value) if isinstance(value, str) else value
                        rows[step] = (state, loaded)
            self._upstream = rows
            self._upstream_results = results
        return self._upstream

    # -- cancellation ------------------------------------------------------------------------

    def is_cancelled(self) -> bool:
        """True once this attempt should stop (cancelled, rescued, past its deadline)."""
        return self._cancelled

    def cancel(self) -> None:
        """Mark the attempt cancelled (used by the runtime; handlers only read the flag)."""
        self._cancelled = True

    # -- progress ----------------------------------------------------------------------------

    @property
    def progress(self) -> JSON:
        """The latest progress snapshot (``None`` when none was ever set)."""
        return self._progress

    def set_progress(
        self, percent: float | None, message: str | None = None, **metadata: object
    ) -> None:
        """Record progress: ``percent`` (0 to 100, or None), an optional ``message`` (text) and
        JSON ``metadata`` (at most 64 KiB, 32 levels), merged into the metadata recorded so far
        (by this attempt or, as a checkpoint, by an earlier one): a key given again is replaced,
        the others are kept.

        Checked at once: a value that cannot be stored raises ``InvalidArgumentsError`` or
        ``InvalidOptionError`` (both ``ValueError``) here, in the handler, and nothing changes.
        Cheap: nothing is written until the next heartbeat or ``flush_progress()``.
        """
        if percent is not None and (
            type(percent) not in (int, float)
            or not (math.isfinite(percent) and 0 <= percent <= 100)
        ):
            raise InvalidOptionError("percent", f"{percent!r} is not a number from 0 to 100")
        snapshot: dict[str, object] = {"percent": percent}
        if message is not None:
            snapshot["message"] = check_text("message", message)
        previous = self._progress.get("metadata") if isinstance(self._progress, dict) else None
        merged = {**previous, **metadata} if isinstance(previous, dict) else metadata
        if merged:
            snapshot["metadata"] = merged
        # envelope=1: the snapshot around the metadata is not the handler's nesting, so the
        # metadata has the same 32 levels as a job's metadata.
        text = serialization.dumps(
            snapshot,
            "progress",
            max_bytes=_PROGRESS_MAX_BYTES,
            max_depth=_PROGRESS_MAX_DEPTH,
            envelope=1,
        )
        self._progress = cast(JSON, snapshot)  # dumps has checked that it is JSON
        self._progress_json = text
        self._progress_dirty = True
        self._progress_set = True

    def flush_progress(self) -> None:
        """Ask the runtime to write the progress now (with the next heartbeat batch, at once)."""
        if self._runtime is not None:
            self._runtime.request_flush()

    @property
    def progress_set(self) -> bool:
        """Whether this attempt set progress (else the previous attempts' progress is kept)."""
        return self._progress_set

    @property
    def progress_json(self) -> str | None:
        """The progress this attempt set, as checked JSON text (None when it set none)."""
        return self._progress_json

    def take_dirty_progress(self) -> tuple[bool, str | None]:
        """(was progress set since the last call, its JSON text); for the heartbeat loop."""
        dirty, self._progress_dirty = self._progress_dirty, False
        return dirty, self._progress_json
