"""Values a handler may return to steer what happens to its job (see docs/jobs.md)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Cancel", "RetryAfter", "Snooze"]


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
