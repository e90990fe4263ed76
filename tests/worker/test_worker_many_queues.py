"""A worker serving many queues: every committed job runs, queues take turns, idle queues cost
a sweep, not a claim each (awa_django/worker/dispatch.py; docs/worker.md, "Many queues").

Real ``awa_worker`` subprocesses against real PostgreSQL; waits on database state.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.db import transaction

import awa_django
from tests.jobs import common as testjobs
from tests.jobs import worker_env
from tests.support.database import pg
from tests.support.polling import wait_for
from tests.support.processes import ManagedProcess
from tests.testapp.models import Ledger

pytestmark = [pytest.mark.worker, pytest.mark.usefixtures("clean_awa")]

Start = Callable[..., ManagedProcess]


def worker(start: Start, *args: str, overrides: dict[str, Any] | None = None) -> ManagedProcess:
    env = worker_env(**(overrides or {}))
    return start("awa_worker", *args, extra_env=env)


def completed(ids: list[int]) -> int:
    with pg() as conn:
        row = conn.execute(
            "SELECT count(*) FROM awa.terminal_jobs WHERE id = ANY(%s) AND state = 'completed'",
            [ids],
        ).fetchone()
    assert row is not None
    return int(row[0])


def one_job_per_queue(names: list[str]) -> list[int]:
    with transaction.atomic():
        handles = awa_django.enqueue_many(
            [testjobs.ledger_async.using(queue=name).prepare(i) for i, name in enumerate(names)]
        )
    return [h.id for h in handles]


def test_a_worker_without_queue_runs_a_job_in_each_of_hundreds_of_queues(
    manage_py: Start, settings: Any
) -> None:
    # One worker used to stall at about 256 queues: every queue's own dispatcher reserved all
    # of the process's free slots for its claim, and the others waited for them, woken in an
    # order that left some queues out for good.
    settings.AWA = {**settings.AWA, "ENQUEUE_SHARDS": 1}
    ids = one_job_per_queue([f"tenant-{i}" for i in range(400)])
    proc = worker(manage_py, "--concurrency", "8")
    wait_for(
        lambda: completed(ids) == len(ids),
        timeout=90,
        message=lambda: f"all 400 jobs to complete ({completed(ids)} did)\n{proc.output()}",
    )
    assert Ledger.objects.filter(job_id__in=ids).count() == len(ids)  # each ran once


def test_a_busy_queue_does_not_hold_back_jobs_of_other_queues(
    manage_py: Start, settings: Any
) -> None:
    settings.AWA = {**settings.AWA, "ENQUEUE_SHARDS": 1}
    with transaction.atomic():
        busy = awa_django.enqueue_many(
            [testjobs.slow_async.using(queue="busy").prepare(0.02) for _ in range(1500)]
        )
    proc = worker(manage_py, "--concurrency", "4")
    busy_ids = [h.id for h in busy]
    wait_for(lambda: completed(busy_ids) >= 20, timeout=30, message="the busy queue to run")
    ids = one_job_per_queue([f"tenant-{i}" for i in range(60)])
    wait_for(
        lambda: completed(ids) == len(ids),
        timeout=60,
        message=lambda: f"the 60 other queues' jobs ({completed(ids)} done)\n{proc.output()}",
    )
    # 1,500 jobs of 20 ms on 4 slots take 7.5 s at best: the other queues did not wait for them.
    assert completed(busy_ids) < len(busy_ids) * 0.8


def test_without_notify_the_sweep_finds_jobs_in_idle_queues(
    manage_py: Start, settings: Any
) -> None:
    settings.AWA = {**settings.AWA, "ENQUEUE_SHARDS": 1}
    first = one_job_per_queue([f"tenant-{i}" for i in range(100)])
    proc = worker(manage_py, overrides={"NOTIFY": False})
    wait_for(lambda: completed(first) == len(first), timeout=60, message=proc.output)
    # Every queue is idle now: a job in any of them is found by the sweep alone.
    later = one_job_per_queue([f"tenant-{i}" for i in range(0, 100, 7)])
    wait_for(lambda: completed(later) == len(later), timeout=30, message=proc.output)


def test_a_sweep_that_fails_claims_from_every_idle_queue_instead(
    manage_py: Start, settings: Any
) -> None:
    settings.AWA = {**settings.AWA, "ENQUEUE_SHARDS": 1}
    first = one_job_per_queue([f"tenant-{i}" for i in range(5)])
    proc = worker(manage_py, overrides={"NOTIFY": False})
    wait_for(lambda: completed(first) == len(first), timeout=60, message=proc.output)
    with pg() as conn:
        conn.execute("ALTER FUNCTION awa.queues_ready_v1(text[]) RENAME TO queues_ready_gone")
    try:
        later = one_job_per_queue(["tenant-3"])
        wait_for(lambda: completed(later) == 1, timeout=30, message=proc.output)
        wait_for(
            lambda: "could not ask which of" in proc.output(),
            timeout=10,
            message="the failed sweep to be logged",
        )
    finally:
        with pg() as conn:
            conn.execute("ALTER FUNCTION awa.queues_ready_gone(text[]) RENAME TO queues_ready_v1")
