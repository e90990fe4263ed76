"""What an attempt's handler did (its return value, or what it raised), as the ``Finalization``
the completion batcher writes.

Handler outcomes (docs/worker.md, "Outcomes"):

| handler does                  | outcome                                                      |
| ----------------------------- | ------------------------------------------------------------ |
| returns a value               | ``completed``, the value stored as the result (JSON, capped) |
| raises an exception           | ``retry`` with backoff; failed or DLQ at ``max_attempts``      |
| raises ``TerminalError``, or  | ``fail`` (DLQ when the queue has it on)                       |
| an exception the job's retry  |                                                              |
| policy fails at once          |                                                              |
| returns ``RetryAfter(s)``     | ``retry`` after ``s`` seconds; counts an attempt              |
| returns ``Snooze(s)``         | ``snooze``: scheduled again without counting an attempt       |
| returns ``Cancel(reason)``    | ``cancel``                                                   |
| returns ``WaitForCallback``   | ``wait``: parked until its callback is resolved or times out |
|                               | (``resume=True``: a result runs the job again, not completes)|
| unknown kind, bad arguments,  | ``fail`` at once with a clear error; the worker goes on      |
| a result that is not JSON     |                                                              |

Any ``BaseException`` a handler raises (``SystemExit``, ``KeyboardInterrupt``,
``asyncio.CancelledError``, custom ones) is an exception like the others: the job is retried or
failed, the worker goes on. ``outcome_of`` never raises: whatever it is given, it returns a
finalization the database accepts, with storable error texts.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from typing import Any

from awa_django import serialization
from awa_django.db.storage import Finalization
from awa_django.exceptions import AwaError, InvalidOptionError, JobValidationError
from awa_django.limits import MAX_TEXT, check_seconds, check_text, clean_text
from awa_django.outcomes import Cancel, RetryAfter, Snooze, WaitForCallback
from awa_django.retry import fails_at_once
from awa_django.worker.prepared import PreparedAttempt

__all__ = ["error_info", "outcome_of", "refused", "safe_str"]

_TRACEBACK_TAIL = 4000
_MESSAGE_MAX = 2000


def error_info(exc: BaseException) -> dict[str, Any]:
    """The error record of a failed attempt: exception type, message and traceback tail.

    Never raises, and every text is storable: NUL and lone surrogates become visible escapes.
    """
    kind = type(exc)
    try:
        qualname = str(getattr(kind, "__qualname__", None) or kind.__name__)
        module = getattr(kind, "__module__", None)
        name = qualname if module in (None, "builtins") else f"{module}.{qualname}"
    except BaseException:  # a metaclass that refuses to answer
        name = "<unnamed exception>"
    try:
        message = str(exc)
    except BaseException as err:  # a __str__ that raises
        message = f"<message unavailable: {type(err).__name__}>"
    try:
        text = "".join(traceback.format_exception(kind, exc, exc.__traceback__))
    except BaseException:  # pragma: no cover - traceback formatting failed
        text = ""
    return {
        "type": clean_text(name, 500),
        "message": clean_text(message[:_MESSAGE_MAX]),
        "traceback": clean_text(text, _TRACEBACK_TAIL),
    }


def refused(kind: str, message: str) -> dict[str, Any]:
    """The error record of an outcome awa_django refused (storable text)."""
    return {"type": kind, "message": clean_text(message[:_MESSAGE_MAX])}


def safe_str(value: object) -> str:
    """``str(value)``, or a placeholder when its ``__str__`` raises."""
    try:
        return str(value)
    except BaseException as err:
        return f"<{type(value).__name__}: str() raised {type(err).__name__}>"


def outcome_of(
    attempt: PreparedAttempt,
    *,
    value: Any = None,
    exc: BaseException | None = None,
    result_max_bytes: int,
    max_depth: int,
    has_state: bool,
    progress_json: str | None,
    backoff_base: float = 1.0,
) -> Finalization:
    """Map a handler's return value or exception to the finalization the batcher writes.

    Never raises: anything unexpected becomes a ``fail`` with a readable error.
    """
    job = attempt.job
    if value is None and exc is None and attempt.failure is None:
        # The common case, without the general path's closure and keyword arguments.
        return Finalization(
            job.job_id,
            job.run_lease,
            job.claim_slot,
            "completed",
            "null",
            None,
            None,
            progress_json,
            has_state,
        )

    def make(outcome: str, **fields: Any) -> Finalization:
        fields.setdefault("has_state", has_state)
        return Finalization(
            job.job_id,
            job.run_lease,
            job.claim_slot,
            outcome,
            progress_json=progress_json,
            **fields,
        )

    try:
        return _outcome(attempt, value, exc, make, result_max_bytes, max_depth, backoff_base)
    except BaseException as err:  # a value whose checks or __eq__ misbehave, say
        return make(
            "fail",
            error=refused(
                "awa_django.InvalidOutcome",
                f"the handler's outcome could not be recorded: {type(err).__name__}: "
                f"{safe_str(err)}",
            ),
        )


def _outcome(
    attempt: PreparedAttempt,
    value: Any,
    exc: BaseException | None,
    make: Callable[..., Finalization],
    result_max_bytes: int,
    max_depth: int,
    backoff_base: float,
) -> Finalization:
    job = attempt.job
    if attempt.failure is not None:
        return make("fail", error=attempt.failure)
    if exc is not None:
        if fails_at_once(job.metadata, exc):  # TerminalError, or the job's retry policy says so
            return make("fail", error=error_info(exc))
        # The wait is the database's: awa._backoff_v2 with the job's stored retry policy.
        return make("retry", error=error_info(exc), backoff_base=backoff_base)
    if value is None:
        return make("completed", result_json="null")
    # The outcome types check their values when built; they are checked again here in case one
    # was built around those checks (object.__new__, a subclass).
    try:
        if isinstance(value, RetryAfter):
            seconds = check_seconds("seconds", value.seconds, allow_zero=True)
            return make(
                "retry",
                delay=seconds,
                error={
                    "type": "awa_django.RetryAfter",
                    "message": f"retry after {seconds:g} s requested by the handler",
                },
            )
        if isinstance(value, Snooze):
            seconds = check_seconds("seconds", value.seconds, allow_zero=True)
            return make("snooze", delay=seconds)
        if isinstance(value, WaitForCallback):
            timeout = check_seconds("timeout", value.timeout)
            made = attempt.ctx_made
            own = None if made is None else made.registered_callback_id
            if own is None or value.callback_id != own:
                return make(
                    "fail",
                    error=refused(
                        "awa_django.InvalidCallback",
                        "WaitForCallback needs the attempt's own ctx.callback_id",
                    ),
                )
            resume = value.resume
            if type(resume) is not bool:
                raise InvalidOptionError("resume", f"must be True or False, got {resume!r}")
            return make("wait", callback_id=own, timeout=timeout, has_state=True, resume=resume)
        if isinstance(value, Cancel):
            reason = check_text("reason", value.reason, max_length=MAX_TEXT)
            return make("cancel", error={"type": "awa_django.Cancel", "message": reason})
    except JobValidationError as err:
        return make(
            "fail",
            error=refused(
                type(err).__qualname__, f"the handler's outcome was refused: {safe_str(err)}"
            ),
        )
    try:
        result = serialization.dumps(
            value, "result", max_bytes=result_max_bytes, max_depth=max_depth
        )
    except (JobValidationError, AwaError) as err:
        return make(
            "fail",
            error=refused(
                type(err).__qualname__, f"the handler's return value was refused: {safe_str(err)}"
            ),
        )
    return make("completed", result_json=result)
