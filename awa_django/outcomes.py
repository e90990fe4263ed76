"""Values a handler may return to steer what happens to its job (see docs/jobs.md)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

__all__ = ["Cancel", "RetryAfter", "Snooze", "WaitForCallback"]


@dataclass(frozen=True, slots=True)
class RetryAfter:
    """Retry after ``seconds``. Counts an attempt; once ``max_attempts`` is reached the job
    fails (or goes to the DLQ) like any other exhausted retry."""

    seconds: float


@dataclass(frozen=True, slots=True)
class Snooze:
    """Run again after ``seconds`` without counting an attempt (the job is ``scheduled``)."""

    seconds: float


@dataclass(frozen=True, slots=True)
class Cancel:
    """Stop the job for good: it is ``cancelled`` with ``reason`` recorded in its errors."""

    reason: str = "cancelled by handler"


@dataclass(frozen=True, slots=True)
class WaitForCallback:
    """Park the attempt (``waiting_external``) until ``awa_django.resolve_callback(callback_id,
    ...)`` resolves it, or ``timeout`` seconds pass (then it is rescued as "callback timed out"
    and retried like a failure). ``callback_id`` must be the handler's ``ctx.callback_id``: hand
    it to the external system before returning. The execution slot is freed at once."""

    callback_id: uuid.UUID
    timeout: float = 3600.0
