"""The handler context is explicit: ``@job(takes_context=True)`` as in django.tasks, with the
job's metadata, tags and previous attempts' errors, and progress metadata that merges."""

from __future__ import annotations

import json

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import connection

from awa_django import JobContext, job
from awa_django.testing import drain
from awa_django.types import JSON
from tests.jobs import common as testjobs

pytestmark = pytest.mark.django_db  # a TestCase-style transaction, never committed


def promote_now() -> None:
    with connection.cursor() as cursor:
        cursor.execute("UPDATE awa.deferred_jobs SET run_at = now() - interval '1 second'")
        cursor.execute("SELECT awa.promote_v1(100)")


def bare_context(progress: JSON) -> JobContext:
    """The context of attempt 2 of 3 of job 1, outside any worker."""
    return JobContext(
        job_id=1,
        run_lease=1,
        attempt=2,
        max_attempts=3,
        queue="q",
        kind="k",
        deadline_at=None,
        progress=progress,
    )


def test_a_context_handler_sees_metadata_tags_and_previous_errors() -> None:
    testjobs.CONTEXT_SEEN.clear()
    handle = testjobs.context_probe.enqueue(True)  # the context is not an argument to enqueue
    [first] = drain("context")
    assert first.outcome == "retry"
    promote_now()
    [second] = drain("context")
    assert (second.id, second.outcome, second.result) == (handle.id, "completed", "ok")
    assert testjobs.CONTEXT_SEEN == [
        {
            "type": "JobContext",
            "attempt": 1,
            "metadata": {"tenant": "acme"},
            "tags": ("probe",),
            "errors": [],
        },
        {
            "type": "JobContext",
            "attempt": 2,
            "metadata": {"tenant": "acme"},
            "tags": ("probe",),
            "errors": ["first attempt fails"],
        },
    ]


def test_progress_metadata_merges_instead_of_replacing() -> None:
    # An earlier attempt's progress:
    context = bare_context(progress={"percent": 30, "metadata": {"cursor": 7, "kept": True}})
    context.set_progress(40, "more", cursor=9)
    assert context.progress == {
        "percent": 40,
        "message": "more",
        "metadata": {"cursor": 9, "kept": True},
    }
    assert json.loads(context.progress_json or "null") == context.progress
    with pytest.raises(ValueError):
        context.set_progress(50, bad=object())  # refused, and nothing changes
    assert context.progress["metadata"] == {"cursor": 9, "kept": True}


def test_a_first_parameter_named_ctx_is_an_ordinary_argument() -> None:
    testjobs.ctx_is_just_a_name.enqueue(21)
    [run] = drain("context")
    assert (run.outcome, run.result) == ("completed", 42)
    assert testjobs.ctx_is_just_a_name.call(4) == 8


def test_call_runs_inline_with_no_context() -> None:
    echo = job(takes_context=True, name="tests.context_echo")(lambda context, x: (context, x))
    assert echo.call(5) == (None, 5)


def test_takes_context_needs_a_first_positional_parameter() -> None:
    with pytest.raises(ImproperlyConfigured, match="takes_context=True"):
        job(takes_context=True, name="tests.no_context_param")(lambda: None)
    with pytest.raises(ImproperlyConfigured, match="takes_context=True"):

        def keyword_only(*, context: object) -> None: ...

        job(takes_context=True, name="tests.keyword_only")(keyword_only)


def test_progress_metadata_nests_as_deep_as_job_metadata() -> None:
    from awa_django.exceptions import LimitExceededError

    def deep(levels: int) -> object:
        value: object = 1
        for _ in range(levels):
            value = [value]
        return value

    context = bare_context(progress=None)
    # Job metadata {"v": deep(31)} is 32 levels, the limit; progress metadata the same.
    testjobs.noop.using(metadata={"v": deep(31)}).prepare()
    context.set_progress(None, v=deep(31))
    with pytest.raises(LimitExceededError, match="nesting deeper than 32"):
        testjobs.noop.using(metadata={"v": deep(32)}).prepare()
    with pytest.raises(LimitExceededError, match="nesting deeper than 32"):
        context.set_progress(None, v=deep(32))
