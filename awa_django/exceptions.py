"""Exceptions raised by awa_django's public API."""

from __future__ import annotations

__all__ = [
    "AwaError",
    "InvalidArgumentsError",
    "InvalidOptionError",
    "IsolationLevelError",
    "LimitExceededError",
    "TerminalError",
    "TransactionLeftOpen",
    "UnknownKindError",
    "ValidationError",
]


class AwaError(Exception):
    """Base class of every awa_django error."""


class ValidationError(AwaError, ValueError):
    """A job request was rejected before anything was written.

    ``field`` names the offending field (``args``, ``queue``, ``priority`` …) and the message
    starts with it. The caller's transaction is untouched and still usable.
    """

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(f"{field}: {message}")


class UnknownKindError(ValidationError):
    """The job kind is not registered with ``@job`` in this process."""

    def __init__(self, kind: str) -> None:
        super().__init__(
            "kind",
            f"{kind!r} is not a registered job kind; decorate it with @awa_django.job and make "
            "sure its module is imported (an installed app's jobs.py, or AWA['JOB_MODULES'])",
        )


class InvalidArgumentsError(ValidationError):
    """Arguments, metadata or a result are not plain JSON (sets, bytes, objects, NaN, NUL …)."""


class LimitExceededError(ValidationError):
    """A size, depth or count limit was exceeded (see docs/configuration.md for the limits)."""


class InvalidOptionError(ValidationError):
    """A job option is out of range: queue name, priority, max_attempts, run_after, deadline."""


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
