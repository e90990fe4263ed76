"""Retry policies end to end, with real `awa_worker` subprocesses: which exceptions retry, and
the wait of every retry path (a handler's error, a callback's error, rescue of a killed
worker) as the job's policy sets it, on the database clock.

Every test waits on database state with a timeout (tests.support.polling.wait_for), never on a bare
sleep. Job kinds live in tests/jobs/common.py and tests/jobs/tasks.py.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from typing import Any

import pytest

import awa_django
from awa_django import RetryPolicy
from tests.jobs import common as testjobs
from tests.jobs import tasks as tasks_for_tests
from tests.support.awa_schema import job_state
from tests.support.database import pg
from tests.support.polling import wait_for
from tests.support.processes import ManagedProcess
from tests.testapp.models import Ledger

pytestmark = [pytest.mark.worker, pytest.mark.usefixtures("clean_awa")]

Start = Callable[..., ManagedProcess]


def state_of(job_id: int) -> dict[str, Any]:
    with pg() as conn:
        state = job_state(conn, job_id)
    assert state is not None
    return state


def wait_state(job_id: int, wanted: str, proc: ManagedProcess) -> dict[str, Any]:
    wait_for(
        lambda: state_of(job_id)["state"] == wanted,
        timeout=30,
        message=lambda: (
            f"job {job_id} to be {wanted} ({state_of(job_id)}); output:\n{proc.output()}"
        ),
    )
    return state_of(job_id)


def wait_of(job_id: int) -> float:
    """The retryable job's wait: run_at minus the time its last failure was recorded (the
    finalizing transaction's now()), both on the database clock."""
    with pg() as conn:
        row = conn.execute(
            "SELECT extract(epoch FROM run_at - (errors -> -1 ->> 'at')::timestamptz) "
            "FROM awa.deferred_jobs WHERE job_id = %s AND state = 'retryable'",
            [job_id],
        ).fetchone()
    assert row is not None
    return float(row[0])


def count(sql: str) -> int:
    with pg() as conn:
        row = conn.execute(sql).fetchone()
    assert row is not None
    return int(row[0])


def runs(job_id: int) -> int:
    return Ledger.objects.filter(job_id=job_id).count()


def stop(proc: ManagedProcess) -> None:
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0, proc.output()


def test_retry_on_and_fail_on_decide_which_exceptions_retry(manage_py: Start) -> None:
    outside = testjobs.picky.enqueue("value", 5).id  # ValueError: not in retry_on
    inside = testjobs.picky.enqueue("transient", 2).id  # in retry_on: retried, then completes
    subclass = testjobs.picky.enqueue("key", 1).id  # KeyError: a LookupError of retry_on
    failed_on = testjobs.picky.enqueue("permanent", 5).id  # a Transient, but in fail_on
    proc = manage_py("awa_worker", "--queue", "retry")
    for job_id in (inside, subclass):
        done = wait_state(job_id, "completed", proc)
        assert done["attempt"] == runs(job_id)
    assert runs(inside) == 3 and runs(subclass) == 2
    for job_id, error in (
        (outside, "ValueError"),
        (failed_on, "tests.jobs.common.Permanent"),
    ):
        state = wait_state(job_id, "failed", proc)
        assert (state["attempt"], state["in_dlq"], runs(job_id)) == (1, True, 1)
        assert state["dlq_reason"] == "terminal error: attempt 1"
        assert [e["type"] for e in state["errors"]] == [error]
    stop(proc)


def test_a_handler_error_waits_the_policy_s_backoff(manage_py: Start) -> None:
    linear = (
        testjobs.always_fails.using(retry=RetryPolicy("linear", base=300, jitter=0)).enqueue().id
    )
    proc = manage_py("awa_worker", "--queue", "retry")
    wait_state(linear, "retryable", proc)
    assert wait_of(linear) == pytest.approx(300, abs=1e-6)
    # (Without a policy, RETRY_BACKOFF_BASE x 2^attempt: tests/storage/test_retry_backoff.py.)
    stop(proc)


def test_max_age_stops_the_retries_of_a_worker_s_job(manage_py: Start) -> None:
    proc = manage_py("awa_worker", "--queue", "retry")
    wait_for(
        lambda: count("SELECT count(*) FROM awa.runtime_instances") == 1,
        timeout=30,
        message=lambda: f"the worker to start; output:\n{proc.output()}",
    )
    # Attempts about 1 s apart; the one whose retry would run 3 s after the enqueue is the
    # last (the third, given the promotion and claim latency), well before max_attempts (5).
    policy = RetryPolicy("constant", base=1, jitter=0, max_age=3)
    job = testjobs.always_fails.using(retry=policy).enqueue().id
    state = wait_state(job, "failed", proc)
    assert state["in_dlq"] and state["dlq_reason"].startswith("max_age exceeded: attempt ")
    assert 2 <= state["attempt"] <= 4 and state["attempt"] == runs(job)
    with pg() as conn:
        row = conn.execute(
            "SELECT extract(epoch FROM (errors -> -1 ->> 'at')::timestamptz - created_at) "
            "FROM awa.jobs WHERE id = %s",
            [job],
        ).fetchone()
    assert row is not None and 2 < float(row[0]) <= 3  # its last failure: 1 s short of max_age
    stop(proc)


def test_a_callback_error_waits_the_policy_s_backoff(manage_py: Start) -> None:
    job = (
        testjobs.await_callback.using(retry=RetryPolicy("constant", base=800, jitter=0))
        .enqueue(60)
        .id
    )
    proc = manage_py("awa_worker", "--queue", "cb")
    wait_state(job, "waiting_external", proc)
    callback = Ledger.objects.filter(job_id=job).values_list("note", flat=True).get()
    assert awa_django.resolve_callback(callback, error="declined") == "resolved"
    assert state_of(job)["state"] == "retryable"
    assert wait_of(job) == pytest.approx(800, abs=1e-6)
    stop(proc)


def test_a_killed_worker_s_job_is_rescued_with_the_policy_s_backoff(manage_py: Start) -> None:
    job = testjobs.hang_first.using(retry=RetryPolicy("constant", base=700, jitter=0)).enqueue().id
    victim = manage_py("awa_worker", "--queue", "hang", "--no-maintenance")
    wait_state(job, "running", victim)
    victim.proc.send_signal(signal.SIGKILL)
    victim.proc.wait(10)
    leader = manage_py("awa_worker", "--queue", "other")  # the leader rescues it
    state = wait_state(job, "retryable", leader)
    assert state["errors"][-1]["message"] == "heartbeat stale: worker presumed dead"
    assert wait_of(job) == pytest.approx(700, abs=1e-6)
    stop(leader)


def test_the_tasks_backend_s_retry_option(manage_py: Start) -> None:
    from awa_django.backends.compat import TaskResultStatus

    value = tasks_for_tests.picky_task.enqueue("value")
    key = tasks_for_tests.picky_task.enqueue("key")
    proc = manage_py("awa_worker", "--queue", "default")
    failed = wait_state(int(value.id), "failed", proc)
    assert failed["attempt"] == 1  # ValueError is outside retry_on: FAILED at once
    wait_state(int(key.id), "retryable", proc)
    assert wait_of(int(key.id)) == pytest.approx(900, abs=1e-6)
    stop(proc)
    value.refresh()
    key.refresh()
    assert (value.status, key.status) == (TaskResultStatus.FAILED, TaskResultStatus.READY)

    # task_finished told the same (the worker's rule, not only the attempts left).
    def finished(result: Any) -> list[str]:
        notes = Ledger.objects.filter(job_id=int(result.id)).values_list("note", flat=True)
        return [n for n in notes if n.startswith("finished:")]

    assert finished(value) == ["finished:FAILED:ValueError"]
    assert finished(key) == ["finished:READY:KeyError"]
