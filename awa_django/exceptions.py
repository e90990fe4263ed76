"""Exceptions raised by awa_django's public API, and the failure kinds it records.

The classes after ``IsolationLevelError`` name failures that awa_django records in a job's
errors rather than raises (a rescued attempt, a refused task, an operator's cancel...). They
exist so that every recorded failure names an importable exception class: the django.tasks
backend reports them as ``TaskError.exception_class_path`` (docs/tasks.md, "Errors").
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "AttemptRescued",
    "AwaError",
    "CallbackError",
    "CallbackTimedOut",
    "DeadlineExceeded",
    "DuplicateJobError",
    "HeartbeatStale",
    "InvalidArgumentsError",
    "InvalidCallbackError",
    "InvalidJobError",
    "InvalidOptionError",
    "InvalidOutcomeError",
    "InvalidResultError",
    "IsolationLevelError",
    "JobCancelled",
    "JobFailedError",
    "JobValidationError",
    "LimitExceededError",
    "RecordedError",
    "SuspiciousTask",
    "TerminalError",
    "TransactionLeftOpen",
    "UnknownKindError",
]


class AwaError(Exception):
    """Base class of every awa_django error."""


class JobValidationError(AwaError, ValueError):
    """A job request was rejected before anything was written.

    ``field`` names the offending field (``args``, ``queue``, ``priority`` …) and the message
    starts with it. The caller's transaction is untouched and still usable.
    """

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(f"{field}: {message}")


class UnknownKindError(JobValidationError):
    """The job kind is not registered with ``@job`` in this process."""

    def __init__(self, kind: str) -> None:
        super().__init__(
            "kind",
            f"{kind!r} is not a registered job kind; decorate it with @awa_django.job and make "
            "sure its module is imported (an installed app's jobs.py, or AWA['JOB_MODULES'])",
        )


class InvalidArgumentsError(JobValidationError):
    """Arguments, metadata or a result are not plain JSON (sets, bytes, objects, NaN, NUL …)."""


class LimitExceededError(JobValidationError):
    """A size, depth or count limit was exceeded (see docs/configuration.md for the limits)."""


class InvalidOptionError(JobValidationError):
    """A job option is out of range: queue name, priority, max_attempts, run_after, deadline."""


class DuplicateJobError(AwaError):
    """A unique job was enqueued with ``on_conflict="raise"`` while another job holds its key.

    Nothing was written and the caller's transaction is still usable; ``existing`` is the
    handle (an ``EnqueuedJob`` with ``duplicate=True``) of the job that holds the key. With
    ``in_batch`` the holder was an earlier request of the same ``enqueue_many`` batch, which
    was not written either (its id was never used).
    """

    def __init__(self, existing: Any, *, in_batch: bool = False) -> None:
        self.existing = existing
        self.in_batch = in_batch
        if in_batch:
            message = (
                f"a {existing.kind} request duplicates the unique key of an earlier request of "
                "the same batch; nothing of the batch was written"
            )
        else:
            message = (
                f"a {existing.kind} job with the same unique key exists: job {existing.id} "
                f"({existing.state})"
            )
        super().__init__(message)


class TerminalError(AwaError):
    """Raise from a handler to fail the job at once, without further retries.

    The job goes to the dead letter queue when its queue has the DLQ on (the default), else to
    terminal history as ``failed``.
    """


class TransactionLeftOpen(AwaError):
    """A sync handler returned with a transaction still open on one of its thread's Django
    connections (an ``atomic()`` block entered and never exited, autocommit left off).

    The worker rolls it back and reconnects, so the next job on that thread starts clean, and
    records this error for the job (it is retried like any failure): the handler's uncommitted
    writes never happened.
    """


class IsolationLevelError(AwaError):
    """An operation that needs READ COMMITTED was called inside a transaction at another
    isolation level (REPEATABLE READ, SERIALIZABLE). Nothing was sent: the transaction is
    untouched and still usable. Call it outside the transaction (awa_django then opens one of
    its own at READ COMMITTED) or at READ COMMITTED."""


# Failure kinds awa_django records (see the module docstring) --------------------------------------


class InvalidResultError(TerminalError):
    """A django.tasks task returned a value that cannot be stored: not JSON once normalised as
    Django normalises return values, or larger than ``RESULT_MAX_BYTES`` (or nested deeper
    than ``JSON_MAX_DEPTH``). Raised by the worker right after the task returns, so it is
    recorded with a traceback; the task fails at once, without retries."""


class SuspiciousTask(AwaError):
    """A job stored as a django.tasks task whose path is not a ``Task`` the worker may run (not
    in an installed app or ``AWA["JOB_MODULES"]``, a plain function, or a backend alias that
    is not an ``AwaTaskBackend``). It was refused without being called. Recorded, never
    raised; stored as ``awa_django.SuspiciousTask``."""


class InvalidJobError(AwaError):
    """A claimed job could not be prepared to run. Recorded, never raised; stored as
    ``awa_django.InvalidJob``."""


class InvalidOutcomeError(AwaError):
    """What a handler returned or raised could not be recorded as given (its checks or its
    ``__str__`` misbehaved). Recorded, never raised; stored as ``awa_django.InvalidOutcome``."""


class InvalidCallbackError(AwaError):
    """A handler returned ``WaitForCallback`` without its attempt's own ``ctx.callback_id``.
    Recorded, never raised; stored as ``awa_django.InvalidCallback``."""


class CallbackError(AwaError):
    """The external system resolved an attempt's callback with an error
    (``resolve_callback(callback_id, error=...)``). Recorded, never raised; stored as
    ``awa_django.CallbackError``."""


class AttemptRescued(AwaError):
    """Maintenance closed an attempt that its worker did not finish, and retried or failed the
    job (stored as ``awa_django.Rescued``; the subclasses say why). Recorded, never raised."""


class HeartbeatStale(AttemptRescued):
    """The attempt's worker stopped heartbeating (it died, froze or lost its database
    connection): rescued as ``heartbeat stale: worker presumed dead``."""


class DeadlineExceeded(AttemptRescued):
    """The attempt ran past its hard deadline: rescued as ``hard deadline exceeded``."""


class CallbackTimedOut(AttemptRescued):
    """The attempt waited for its callback longer than its timeout: rescued as ``callback
    timed out``."""


class JobCancelled(AwaError):
    """An operator cancelled the job (the admin, ``awa_django.cancel``, ``awa_queue drain``).
    Recorded, never raised; stored as ``Cancelled``."""


class RecordedError(AwaError):
    """A failure recorded under a type name that names no exception class (one written by a
    raw-SQL finalizer, say). The recorded type and message are kept in the traceback text."""


class JobFailedError(AwaError):
    """A job or workflow whose result was asked for ended without completing (failed,
    cancelled, dead-lettered). ``outcome`` is its ``JobOutcome`` or ``WorkflowStatus``."""

    def __init__(self, message: str, outcome: object) -> None:
        super().__init__(message)
        self.outcome = outcome
