"""The public surface of awa_django is exactly what __all__ says, and nothing leaks."""

from __future__ import annotations

import awa_django

EXPECTED = {
    "AwaError",
    "Batch",
    "Cancel",
    "DuplicateJobError",
    "EnqueuedJob",
    "InvalidArgumentsError",
    "InvalidOptionError",
    "IsolationLevelError",
    "Job",
    "JobCall",
    "JobContext",
    "JobFailedError",
    "JobOptions",
    "JobRequest",
    "LimitExceededError",
    "RetryAfter",
    "RetryPolicy",
    "Snooze",
    "Step",
    "TerminalError",
    "UnknownKindError",
    "JobValidationError",
    "WaitForCallback",
    "Workflow",
    "WorkflowRun",
    "aenqueue",
    "aenqueue_many",
    "batch",
    "cancel",
    "chain",
    "chord",
    "dlq_purge",
    "dlq_retry",
    "enqueue",
    "enqueue_many",
    "extend_callback",
    "get_job",
    "get_workflow",
    "group",
    "job",
    "resolve_callback",
    "workflow",
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


def test_the_operator_api_is_its_reads_and_its_actions() -> None:
    from awa_django import operator
    from awa_django.operator import actions, reads

    assert set(operator.__all__) == set(reads.__all__) | set(actions.__all__)
    assert not set(reads.__all__) & set(actions.__all__)
    for name in operator.__all__:
        assert getattr(operator, name) is getattr(reads if name in reads.__all__ else actions, name)
    for name in ("cancel", "dlq_retry", "dlq_purge", "resolve_callback", "extend_callback"):
        assert getattr(awa_django, name) is getattr(actions, name)


def test_the_callbacks_package_exports_its_signing_helpers() -> None:
    from awa_django import callbacks

    assert set(callbacks.__all__) == {
        "SIGNATURE_HEADER",
        "TIMESTAMP_HEADER",
        "callback_path",
        "sign_request",
    }
    for name in ("callback_path", "sign_request"):
        assert getattr(callbacks, name).__doc__
