"""The context a handler receives as its ``ctx`` first parameter."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

__all__ = ["JobContext"]


class JobContext:
    """One attempt of one job, as seen by its handler.

    ``is_cancelled()`` turns true when the attempt is cancelled (admin or API), rescued, or past
    its hard deadline, and when the worker shuts down hard; a handler should then stop. Progress
    set with ``set_progress`` is written with the next heartbeat (or ``flush_progress``), kept
    across retries and cleared on success.
    """

    __slots__ = (
        "_callback_id",
        "_cancelled",
        "_progress",
        "_progress_dirty",
        "_progress_set",
        "_runtime",
        "attempt",
        "deadline_at",
        "id",
        "kind",
        "max_attempts",
        "queue",
        "run_lease",
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
        progress: Any,
        runtime: Any = None,
    ) -> None:
        self.id = job_id
        self.run_lease = run_lease
        self.attempt = attempt
        self.max_attempts = max_attempts
        self.queue = queue
        self.kind = kind
        self.deadline_at = deadline_at
        # A plain flag, not a threading.Event: set from the event loop, read from any thread
        # (attribute reads and writes are atomic), and an Event per job cost ~15 % of a no-op
        # job's CPU in the profile (docs/performance.md).
        self._cancelled = False
        self._progress: Any = progress
        self._progress_dirty = False
        self._progress_set = False
        self._callback_id: uuid.UUID | None = None
        self._runtime = runtime

    @classmethod
    def for_job(cls, job: Any, runtime: Any = None) -> JobContext:
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
        )

    def __repr__(self) -> str:
        return f"<JobContext id={self.id} attempt={self.attempt} lease={self.run_lease}>"

    @property
    def callback_id(self) -> uuid.UUID:
        """This attempt's callback id (for ``WaitForCallback``), created on first use."""
        if self._callback_id is None:
            self._callback_id = uuid.uuid4()
        return self._callback_id

    def is_cancelled(self) -> bool:
        """True once this attempt should stop (cancelled, rescued, past its deadline)."""
        return self._cancelled

    def cancel(self) -> None:
        """Mark the attempt cancelled (used by the runtime; handlers only read the flag)."""
        self._cancelled = True

    @property
    def progress(self) -> Any:
        """The latest progress snapshot (``None`` when none was ever set)."""
        return self._progress

    def set_progress(
        self, percent: float | None, message: str | None = None, **metadata: Any
    ) -> None:
        """Record progress: ``percent`` (0 to 100), an optional ``message`` and JSON ``metadata``.

        Cheap: nothing is written until the next heartbeat or ``flush_progress()``.
        """
        snapshot: dict[str, Any] = {"percent": percent}
        if message is not None:
            snapshot["message"] = message
        if metadata:
            snapshot["metadata"] = metadata
        self._progress = snapshot
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

    def take_dirty_progress(self) -> tuple[bool, Any]:
        """(was progress set since the last call, the snapshot); for the heartbeat loop."""
        dirty, self._progress_dirty = self._progress_dirty, False
        return dirty, self._progress
