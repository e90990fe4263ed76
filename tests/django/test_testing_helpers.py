"""awa_django.testing.drain: run jobs in-process inside a test's transaction (no commit)."""

from __future__ import annotations

import pytest
from django.db import connection

from awa_django.testing import drain
from tests.jobs import common as testjobs

pytestmark = pytest.mark.django_db  # a TestCase-style transaction, never committed


def state_of(job_id: int) -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT state FROM awa.jobs WHERE id = %s", [job_id])
        row = cursor.fetchone()
    assert row is not None
    return str(row[0])


def test_drain_runs_uncommitted_jobs_in_process() -> None:
    sent = testjobs.send_email.enqueue("a@example.com", subject="hi")
    echoed = testjobs.async_echo.enqueue({"x": [1, 2]})
    runs = {run.id: run for run in drain()}
    assert runs[sent.id].outcome == "completed"
    assert runs[sent.id].result == "sent hi to a@example.com"
    assert runs[echoed.id].result == {"x": [1, 2]}
    assert state_of(sent.id) == "completed"
    assert drain() == []


def test_drain_reports_failures_and_leaves_retries_deferred() -> None:
    flaky = testjobs.renamed.using(queue="work", max_attempts=2).enqueue(1)
    from awa_django import enqueue

    failing = enqueue("tests.jobs.common.flaky", args=[5])
    runs = {run.id: run for run in drain("work")}
    assert runs[flaky.id].outcome == "completed"
    assert runs[failing.id].outcome == "retry"
    assert runs[failing.id].error is not None and runs[failing.id].error["type"] == "ValueError"
    assert state_of(failing.id) == "retryable"


def test_drain_respects_max_jobs_and_queue_filter() -> None:
    for i in range(3):
        testjobs.renamed.enqueue(i)
    testjobs.noop.enqueue()
    assert [r.queue for r in drain("other", max_jobs=2)] == ["other", "other"]
    assert [r.queue for r in drain(["other"])] == ["other"]
    assert [r.kind for r in drain()] == ["tests.jobs.common.noop"]
