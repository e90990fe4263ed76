"""The states of a job, and what a handler's attempt can end in: one vocabulary for the models,
the admin's filters, the operator API and the django.tasks backend."""

from __future__ import annotations

from typing import Final, Literal

from django.db import models

__all__ = ["LIVE_STATES", "TERMINAL_STATES", "JobState", "Outcome"]


class JobState(models.TextChoices):
    """Where a job is. Live: available, running, waiting_external, scheduled, retryable.
    Terminal (history): completed, failed, cancelled. A dead-lettered job is failed and in the
    DLQ."""

    AVAILABLE = "available"
    RUNNING = "running"
    WAITING_EXTERNAL = "waiting_external", "waiting external"
    SCHEDULED = "scheduled"
    RETRYABLE = "retryable"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


#: States of jobs not finished yet, in the order the admin offers them.
LIVE_STATES: Final = (
    JobState.AVAILABLE,
    JobState.RUNNING,
    JobState.WAITING_EXTERNAL,
    JobState.SCHEDULED,
    JobState.RETRYABLE,
)
#: Outcomes kept in terminal history.
TERMINAL_STATES: Final = (JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED)

#: What one attempt ends in, as the worker writes it (``awa.finalize_v1`` items).
Outcome = Literal["completed", "retry", "snooze", "cancel", "fail", "wait"]
