"""Job middleware (AWA["JOB_MIDDLEWARE"]): order, results, errors, sync and async handlers,
bad entries, in-process through drain() (the worker runs the same chain:
tests/worker/test_job_middleware_workers.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test import override_settings

from awa_django.testing import drain, enqueued_jobs
from tests.jobs import common as testjobs
from tests.jobs import middleware

pytestmark = pytest.mark.django_db

M = "tests.jobs.middleware."


@pytest.fixture(autouse=True)
def _fresh_calls() -> Iterator[None]:
    middleware.CALLS.clear()
    middleware.BUILT.clear()
    yield


def chain(*names: str) -> Any:
    return override_settings(AWA={**settings.AWA, "JOB_MIDDLEWARE": [M + n for n in names]})


def test_the_first_entry_is_outermost_for_sync_and_async_handlers() -> None:
    with chain("outer", "inner"):
        testjobs.renamed.enqueue(1)
        testjobs.async_echo.enqueue(2)
        results = {run.kind: run.result for run in drain()}
        testjobs.renamed.enqueue(3)
        drain()
    assert results == {
        "tests.renamed": {"outer": {"inner": 1}},
        "tests.jobs.common.async_echo": {"outer": {"inner": 2}},
    }
    start = middleware.CALLS.index("outer>tests.renamed")
    assert middleware.CALLS[start : start + 4] == [
        "outer>tests.renamed",
        "inner>tests.renamed",
        "<inner",
        "<outer",
    ]
    # Built once per handler (and per setting), not per job.
    assert middleware.BUILT == {"outer": 2, "inner": 2}
    testjobs.renamed.enqueue(4)
    assert [run.result for run in drain()] == [4]  # the setting is gone: no middleware


def test_a_function_marked_as_a_coroutine_one_wraps_an_async_handler() -> None:
    with chain("marked"):
        testjobs.async_echo.enqueue(3)
        [run] = drain()
    assert (run.outcome, run.result) == ("completed", 3)


def test_what_middleware_raises_or_returns_is_the_handler_s() -> None:
    with chain("gate", "outer"):
        for rule in ("refuse", "snooze", "boom", "double"):
            testjobs.renamed.using(metadata={"gate": rule}).enqueue(21)
        testjobs.with_ctx.using(metadata={"gate": "double"}).enqueue(5)  # takes the context
        runs = {(run.kind, run.outcome): run for run in drain()}
    assert runs["tests.renamed", "fail"].error["message"] == "refused by the gate"
    assert runs["tests.renamed", "retry"].error["type"] == "LookupError"
    assert ("tests.renamed", "snooze") in runs
    assert runs["tests.renamed", "completed"].result == {"outer": 42}
    assert runs["tests.jobs.common.with_ctx", "completed"].result == {"outer": 10}
    assert "outer>tests.renamed" in middleware.CALLS  # reached only by the doubled one
    assert middleware.CALLS.count("outer>tests.renamed") == 1


@pytest.mark.parametrize(
    ("names", "message"),
    [
        (["sync_only"], "returned a sync callable for an async handler"),
        (["broken"], "RuntimeError: the factory broke"),
        (["NOT_CALLABLE"], "entry 'tests.jobs.middleware.NOT_CALLABLE' is not callable"),
        (["missing"], "entry 'tests.jobs.middleware.missing' cannot be imported"),
    ],
)
def test_a_bad_entry_fails_each_job_it_wraps_with_a_clear_error(
    names: list[str], message: str
) -> None:
    with chain(*names):
        testjobs.async_echo.enqueue(1)
        testjobs.async_echo.enqueue(2)
        runs = drain()
    assert [run.outcome for run in runs] == ["retry", "retry"]
    assert all(message in run.error["message"] for run in runs)
    assert len(enqueued_jobs()) == 2  # retryable, nothing lost


def test_manage_py_check_reports_entries_that_do_not_import() -> None:
    with chain("outer", "missing", "NOT_CALLABLE"), pytest.raises(SystemCheckError) as failed:
        call_command("check")
    text = str(failed.value)
    assert text.count("awa.E009") == 2
    assert "'tests.jobs.middleware.missing' cannot be imported" in text
    with chain("outer", "sync_only"):
        call_command("check")  # importable and callable: what it returns shows per handler


def test_a_django_task_runs_through_the_chain() -> None:
    from tests.jobs.tasks import add

    with chain("outer"):
        result = add.enqueue(2, 3)
        [run] = drain()
    # The chain is around the task function: it sees and shapes the task's return value.
    assert (run.outcome, run.result) == ("completed", {"outer": 5})
    assert middleware.CALLS[0] == f"outer>{run.kind}"
    result.refresh()
    assert result.return_value == {"outer": 5}
