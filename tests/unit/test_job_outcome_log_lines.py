"""The log line of each job outcome (awa_django/worker/outcome_log.py): what the database did
with a failure and when a retry runs, a wait's callback and timeout, durations people read."""

from __future__ import annotations

import logging
import uuid

import pytest

from awa_django.db.storage import ClaimedJob, Finalization
from awa_django.timetext import ago, duration
from awa_django.worker.outcome_log import log_ended, log_failures

ERROR = {"type": "ValueError", "message": "boom\nsecond line", "traceback": ""}


def attempt(attempt: int = 2, max_attempts: int = 5) -> ClaimedJob:
    return ClaimedJob(
        job_id=41,
        run_lease=7,
        attempt=attempt,
        max_attempts=max_attempts,
        claim_slot=0,
        kind="shop.send",
        args_json="{}",
        queue="emails",
        priority=0,
        deadline_at=None,
        timeout_secs=None,
        progress=None,
    )


def outcome(what: str, **fields: object) -> Finalization:
    return Finalization(41, 7, 0, what, **fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.0189, "18.9 ms"),
        (-1.0, "0.0 ms"),
        (4.21, "4.2 s"),
        (185, "3 min 5 s"),
        (180, "3 min"),
        (7800, "2 h 10 min"),
        (3600, "1 h"),
        (302_400, "3.5 days"),
    ],
)
def test_durations_read_as_people_say_them(seconds: float, text: str) -> None:
    assert duration(seconds) == text


def test_times_ago_and_from_now_are_coarse() -> None:
    assert [ago(s) for s in (0.4, 12.9, -185, 7500, -3600, 400_000)] == [
        "just now",
        "12 s ago",
        "in 3 min",
        "2 h 5 min ago",
        "in 1 h",
        "4 days ago",
    ]


FAILURES = [
    # (fates, attempt, outcome fields, level, message)
    (
        {41: ("retryable", 4.2)},
        2,
        {},
        "INFO",
        "job 41 shop.send failed (attempt 2 of 5, ran 18.9 ms), retrying in 4.2 s: "
        "ValueError: boom\\x0asecond line",
    ),
    ({}, 2, {}, "INFO", "failed (attempt 2 of 5, ran 18.9 ms), retrying now: "),
    (
        {41: ("retryable", 30.0)},
        2,
        {"delay": 30.0},
        "INFO",
        "retrying in 30.0 s (as the handler asked): ",
    ),
    (
        {41: ("dead_lettered", None)},
        5,
        {},
        "WARNING",
        "job 41 shop.send moved to the DLQ after 5 attempts (the last ran 18.9 ms): ValueError",
    ),
    ({41: ("failed", None)}, 1, {}, "WARNING", "failed for good after 1 attempt (it ran 18.9 ms)"),
    (None, 5, {}, "WARNING", "failed for good after 5 attempts (the last ran 18.9 ms)"),
    (None, 2, {}, "INFO", "failed (attempt 2 of 5, ran 18.9 ms), retrying: "),
]


@pytest.mark.parametrize(("fates", "n", "fields", "level", "message"), FAILURES)
def test_a_failure_says_where_the_database_sent_it(
    caplog: pytest.LogCaptureFixture,
    fates: dict[int, tuple[str, float | None]] | None,
    n: int,
    fields: dict[str, object],
    level: str,
    message: str,
) -> None:
    job = attempt(n)
    with caplog.at_level(logging.DEBUG, "awa_django.worker"):
        log_failures([(outcome("retry", error=ERROR, **fields), job)], fates, {(41, 7): 0.0189})
    [record] = caplog.records
    assert record.levelname == level and message in record.getMessage(), record.getMessage()
    assert (record.job_id, record.queue, record.attempt) == (41, "emails", n)  # type: ignore[attr-defined]


def test_a_fail_outcome_is_failed_for_good_whatever_the_attempt(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.DEBUG, "awa_django.worker"):
        log_failures([(outcome("fail", error=ERROR), attempt(1))], {}, {})
    assert caplog.records[0].getMessage().startswith("job 41 shop.send failed for good after 1")


def test_a_wait_a_snooze_a_cancel_and_a_completion_say_what_happened(
    caplog: pytest.LogCaptureFixture,
) -> None:
    callback = uuid.UUID(int=1)
    job = attempt(1)
    with caplog.at_level(logging.DEBUG, "awa_django.worker"):
        log_ended(job, outcome("wait", callback_id=callback, timeout=3600.0), 0.0873, debug=True)
        log_ended(job, outcome("snooze", delay=30.0), 0.002, debug=True)
        log_ended(job, outcome("cancel", error={"type": "Cancel", "message": "no"}), 1, debug=True)
        log_ended(job, outcome("completed"), 0.0189, debug=False)  # DEBUG off: not even built
        log_ended(job, outcome("completed"), 0.0189, debug=True)
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        (
            "INFO",
            f"job 41 shop.send waiting for callback {callback} (timeout 1 h) after 87.3 ms "
            "(attempt 1)",
        ),
        ("INFO", "job 41 shop.send snoozed for 30.0 s after 2.0 ms (attempt 1)"),
        (
            "WARNING",
            "job 41 shop.send cancelled by its handler after 1.0 s (attempt 1): Cancel: no",
        ),
        ("DEBUG", "job 41 shop.send completed in 18.9 ms (attempt 1)"),
    ]


def test_a_kind_or_message_cannot_break_or_reorder_a_line(caplog: pytest.LogCaptureFixture) -> None:
    job = attempt(1)._replace(kind="evil\u202ekind\nINFO fake")
    hostile = {"type": "E\u2066", "message": "a\rb\u2028c"}
    with caplog.at_level(logging.DEBUG, "awa_django.worker"):
        log_failures([(outcome("retry", error=hostile), job)], {}, {})
    text = caplog.records[0].getMessage()
    assert "evil\\u202ekind\\x0aINFO fake" in text and "E\\u2066: a\\x0db\\u2028c" in text
    assert not any(ch in text for ch in "\u202e\u2066\n\r\u2028")
