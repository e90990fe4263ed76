"""The public surface of awa_django is exactly what __all__ says, and nothing leaks."""

from __future__ import annotations

import awa_django

EXPECTED = {
    "AwaError",
    "Cancel",
    "EnqueuedJob",
    "InvalidArgumentsError",
    "InvalidOptionError",
    "IsolationLevelError",
    "Job",
    "JobContext",
    "JobOptions",
    "JobRequest",
    "LimitExceededError",
    "RetryAfter",
    "Snooze",
    "TerminalError",
    "UnknownKindError",
    "JobValidationError",
    "WaitForCallback",
    "aenqueue",
    "aenqueue_many",
    "cancel",
    "dlq_purge",
    "dlq_retry",
    "enqueue",
    "enqueue_many",
    "get_job",
    "job",
    "resolve_callback",
}


def test_all_is_pinned() -> None:
    assert set(awa_django.__all__) == EXPECTED
    assert sorted(awa_django.__all__) == awa_django.__all__


def test_every_exported_name_exists_and_is_documented() -> None:
    for name in awa_django.__all__:
        obj = getattr(awa_django, name)
        assert obj.__doc__, f"{name} has no docstring"


def test_validation_errors_share_a_base() -> None:
    for name in (
        "UnknownKindError",
        "InvalidArgumentsError",
        "InvalidOptionError",
        "LimitExceededError",
    ):
        assert issubclass(getattr(awa_django, name), awa_django.JobValidationError)
    assert issubclass(awa_django.JobValidationError, awa_django.AwaError)
    assert issubclass(awa_django.JobValidationError, ValueError)
