"""The log line of each job outcome, in the words an operator reads: ``completed in 18.9 ms``,
``failed (attempt 2 of 5, ran 3.1 ms), retrying in 4.2 s``, ``moved to the DLQ after 5
attempts``, ``waiting for callback 6f1c… (timeout 1 h)``.

The worker logs a completion, a snooze, a wait and a handler's cancel when the handler ends
(:func:`log_ended`), and a failure once its finalize batch is written (:func:`log_failures`):
the database decides where a failure goes (max attempts, a retry policy's ``max_age``, the
queue's DLQ setting) and, for a retry, when it runs again, so the line says what it decided.
Every record carries the job's fields (``extra``: job id, kind, queue, attempt, lease).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from awa_django.db.storage import ClaimedJob, Finalization
from awa_django.telemetry.logs import job_log_fields, one_line
from awa_django.timetext import duration

__all__ = ["Fate", "log_ended", "log_failures"]

log = logging.getLogger("awa_django.worker")

#: Where the database sent a failed attempt: ``retryable`` (with the seconds until it runs
#: again), ``dead_lettered`` or ``failed`` (with None).
Fate = tuple[str, float | None]


def _error(outcome: Finalization) -> str:
    error = outcome.error or {}
    kind = one_line(str(error.get("type") or "error"))
    message = one_line(str(error.get("message") or ""))
    return f"{kind}: {message}" if message else kind


def log_ended(job: ClaimedJob, outcome: Finalization, ran: float, *, debug: bool) -> None:
    """Log what a handler's end decided, but a failure (see :func:`log_failures`): a
    completion at DEBUG (``debug``: whether DEBUG is on), a snooze and a wait at INFO, a
    handler's cancel at WARNING. ``ran``: the handler's run time, seconds."""
    what = outcome.outcome
    fields = job_log_fields(job)
    name = one_line(job.kind)
    if what == "completed":
        if debug:
            log.debug(
                "job %s %s completed in %s (attempt %s)",
                job.job_id,
                name,
                duration(ran),
                job.attempt,
                extra=fields,
            )
    elif what == "snooze":
        log.info(
            "job %s %s snoozed for %s after %s (attempt %s)",
            job.job_id,
            name,
            duration(outcome.delay or 0.0),
            duration(ran),
            job.attempt,
            extra=fields,
        )
    elif what == "wait":
        timeout = "" if outcome.timeout is None else f" (timeout {duration(outcome.timeout)})"
        log.info(
            "job %s %s waiting for callback %s%s after %s (attempt %s)",
            job.job_id,
            name,
            outcome.callback_id,
            timeout,
            duration(ran),
            job.attempt,
            extra=fields,
        )
    elif what == "cancel":
        log.warning(
            "job %s %s cancelled by its handler after %s (attempt %s): %s",
            job.job_id,
            name,
            duration(ran),
            job.attempt,
            _error(outcome),
            extra=fields,
        )


def log_failures(
    failed: list[tuple[Finalization, ClaimedJob]],
    fates: Mapping[int, Fate] | None,
    ran: Mapping[tuple[int, int], float],
) -> None:
    """Log each written ``retry`` or ``fail`` outcome by its fate (``fates`` by job id, as read
    right after the write; None when that read failed: then told by attempt number). A retry
    at INFO with when it runs again; a failure for good at WARNING, saying whether it went to
    the DLQ. ``ran``: the handlers' run times by ``(job_id, run_lease)``."""
    for outcome, job in failed:
        name = one_line(job.kind)
        fields = job_log_fields(job)
        took = ran.get((job.job_id, job.run_lease))
        fate = None if fates is None else fates.get(job.job_id)
        attempts = f"{job.attempt} attempt{'' if job.attempt == 1 else 's'}"
        last = ""
        if took is not None:
            last = f" ({'the last' if job.attempt > 1 else 'it'} ran {duration(took)})"
        if fate is not None and fate[0] == "dead_lettered":
            message, level = f"moved to the DLQ after {attempts}{last}", logging.WARNING
        elif fate is not None and fate[0] == "failed":
            message, level = f"failed for good after {attempts}{last}", logging.WARNING
        elif outcome.outcome == "fail" or (fates is None and job.attempt >= job.max_attempts):
            # Where it went was not read: the DLQ, unless the queue's DLQ is off.
            message, level = f"failed for good after {attempts}{last}", logging.WARNING
        else:
            after = "" if took is None else f", ran {duration(took)}"
            if fate is not None and fate[1] is not None and fate[1] > 0:
                when = f"retrying in {duration(fate[1])}"
            elif fates is None:
                when = "retrying"
            else:
                when = "retrying now"
            if outcome.delay is not None:
                when += " (as the handler asked)"
            message = f"failed (attempt {job.attempt} of {job.max_attempts}{after}), {when}"
            level = logging.INFO
        log.log(level, "job %s %s %s: %s", job.job_id, name, message, _error(outcome), extra=fields)
