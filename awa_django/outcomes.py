"""Values a handler may return to steer what happens to its job (see docs/jobs.md).

Each checks its values when it is created and raises ``InvalidOptionError`` (a ``ValueError``)
for one the database could not store: a duration must be a finite number of seconds (or a
``timedelta``) of at most 100 years, a reason valid UTF-8 text without NUL. A handler that builds
a bad one therefore raises, and its job is retried or failed like any other error, with that
message.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import timedelta

from awa_django.exceptions import InvalidOptionError
from awa_django.limits import MAX_TEXT, check_seconds, check_text, check_uuid, show

__all__ = ["Cancel", "RetryAfter", "Snooze", "WaitForCallback"]


@dataclass(frozen=True, slots=True)
class RetryAfter:
    """Retry after ``seconds`` (0 to 100 years, or a ``timedelta``). Counts an attempt; once
    ``max_attempts`` is reached the job fails (or goes to the DLQ) like any other exhausted
    retry."""

    seconds: float | timedelta

    def __post_init__(self) -> None:
        object.__setattr__(self, "seconds", check_seconds("seconds", self.seconds, allow_zero=True))


@dataclass(frozen=True, slots=True)
class Snooze:
    """Run again after ``seconds`` (0 to 100 years, or a ``timedelta``) without counting an
    attempt (the job is ``scheduled``)."""

    seconds: float | timedelta

    def __post_init__(self) -> None:
        object.__setattr__(self, "seconds", check_seconds("seconds", self.seconds, allow_zero=True))


@dataclass(frozen=True, slots=True)
class Cancel:
    """Stop the job for good: it is ``cancelled`` with ``reason`` recorded in its errors.
    ``reason`` is text of at most 10,000 characters."""

    reason: str = "cancelled by handler"

    def __post_init__(self) -> None:
        check_text("reason", self.reason, max_length=MAX_TEXT)


@dataclass(frozen=True, slots=True)
class WaitForCallback:
    """Park the attempt (``waiting_external``) until ``awa_django.resolve_callback(callback_id,
    ...)`` resolves it, or ``timeout`` seconds pass (then it is rescued as "callback timed out"
    and retried like a failure). The execution slot is freed at once.

    ``callback_id`` must be the handler's own ``ctx.callback_id`` (``await
    ctx.aregister_callback()`` in an async handler). Reading it registers the callback in the
    database before the handler can hand it to the external system, so a resolution that
    arrives before the handler returns is kept and applied when the attempt parks. ``timeout``
    is more than 0 and at most 100 years (seconds or a ``timedelta``); an external system (or
    ``awa_django.extend_callback``) may extend it.

    ``resume=True`` makes this one step of a sequence: a result does not complete the job but
    runs it again at once (a new attempt of the same attempt number, like a ``Snooze``), with
    the result as ``ctx.callback_result`` and the progress it set kept; the handler carries on
    from its progress and may wait again. An error resolution retries or fails it as usual.
    """

    callback_id: uuid.UUID
    timeout: float | timedelta = 3600.0
    resume: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "callback_id", check_uuid("callback_id", self.callback_id))
        object.__setattr__(self, "timeout", check_seconds("timeout", self.timeout))
        if type(self.resume) is not bool:
            raise InvalidOptionError("resume", f"must be True or False, got {show(self.resume)}")
