"""The worker runtime, as real `manage.py awa_worker` subprocesses against real Postgres.

Every test waits on database state with a timeout (tests.support.polling.wait_for), never on a bare
sleep. Job kinds live in tests/jobs/common.py; each execution writes a Ledger row.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Callable
from typing import Any

import pytest

import awa_django
from tests.jobs import common as testjobs
from tests.jobs import worker_env
from tests.support.awa_schema import job_state
from tests.support.database import pg
from tests.support.factories import enqueue_sql
from tests.support.polling import wait_for
from tests.support.processes import ManagedProcess
from tests.testapp.models import Ledger

pytestmark = [pytest.mark.worker, pytest.mark.usefixtures("clean_awa")]

Start = Callable[..., ManagedProcess]


def states(*ids: int) -> list[str]:
    with pg() as conn:
        rows = dict(
            conn.execute(
                "SELECT id, state FROM awa.jobs WHERE id = ANY(%s)", [list(ids)]
            ).fetchall()
        )
    return [rows.get(i, "missing") for i in ids]


def count(sql: str, *params: Any) -> int:
    with pg() as conn:
        row = conn.execute(sql, list(params)).fetchone()
    assert row is not None
    return int(row[0])


def worker(start: Start, *args: str, overrides: dict[str, Any] | None = None) -> ManagedProcess:
    env = worker_env(**(overrides or {}))
    return start("awa_worker", *args, extra_env=env)


def exited(proc: ManagedProcess, timeout: float) -> int:
    wait_for(
        lambda: proc.proc.poll() is not None,
        timeout=timeout,
        message=lambda: f"the worker to exit; output:\n{proc.output()}",
    )
    code = proc.proc.returncode
    assert code is not None
    return code


# Enough for both processes to claim full batches of sync and async jobs side by side for
# seconds; exactly-once needs no more (the chaos lane and its soak run far more under faults).
MIXED_JOBS = 3_000


@pytest.mark.slow
def test_thousands_of_mixed_jobs_complete_exactly_once_on_two_processes(manage_py: Start) -> None:
    requests = []
    for i in range(MIXED_JOBS):
        handle = testjobs.ledger_sync if i % 2 else testjobs.ledger_async
        requests.append(handle.using(priority=(i % 3) * 10 - 10).prepare(i))
    handles = awa_django.enqueue_many(requests)
    proc = worker(
        manage_py, "--burst", "--processes", "2", "--queue", "work=32", "--queue", "work-async=64"
    )
    assert exited(proc, timeout=240) == 0, proc.output()
    assert Ledger.objects.count() == MIXED_JOBS
    assert Ledger.objects.values("job_id").distinct().count() == MIXED_JOBS
    assert count("SELECT count(*) FROM awa.jobs WHERE state = 'completed'") == MIXED_JOBS
    assert count("SELECT count(*) FROM awa.jobs WHERE state <> 'completed'") == 0
    with pg() as conn:
        results = dict(
            conn.execute(
                "SELECT id, result FROM awa.terminal_jobs WHERE id = ANY(%s)",
                [[h.id for h in handles[:10]]],
            ).fetchall()
        )
    assert [results[h.id] for h in handles[:10]] == list(range(10))
    assert "stale finalization" not in proc.output()


def test_handler_outcomes(manage_py: Start) -> None:
    flaky = testjobs.flaky.enqueue(2)
    later = testjobs.retry_later.enqueue(0.05)
    snoozer = testjobs.snoozer.enqueue(3)
    gave_up = testjobs.give_up.enqueue()
    terminal = testjobs.terminal.enqueue()
    progress = testjobs.progress_then_retry.enqueue()
    value = testjobs.ledger_sync.enqueue(41)
    ids = [flaky.id, later.id, snoozer.id, gave_up.id, terminal.id, progress.id, value.id]
    proc = worker(manage_py, "--queue", "work")
    wait_for(
        lambda: (
            "available" not in (s := states(*ids))
            and "running" not in s
            and "retryable" not in s
            and "scheduled" not in s
        ),
        timeout=30,
        message=lambda: f"final states, got {states(*ids)}\n{proc.output()}",
    )
    with pg() as conn:
        jobs = {i: job_state(conn, i) for i in ids}
    assert jobs[flaky.id]["state"] == "completed"  # type: ignore[index]
    assert jobs[flaky.id]["attempt"] == 3  # type: ignore[index]
    assert [e["type"] for e in jobs[flaky.id]["errors"]] == ["ValueError", "ValueError"]  # type: ignore[index]
    assert "fails on purpose" in jobs[flaky.id]["errors"][0]["traceback"]  # type: ignore[index]
    # RetryAfter counts attempts: max_attempts=3, then the DLQ.
    assert (jobs[later.id]["state"], jobs[later.id]["in_dlq"]) == ("failed", True)  # type: ignore[index]
    assert jobs[later.id]["attempt"] == 3  # type: ignore[index]
    # Snooze does not: max_attempts=1 and three snoozes still complete.
    assert (jobs[snoozer.id]["state"], jobs[snoozer.id]["attempt"]) == ("completed", 1)  # type: ignore[index]
    assert jobs[snoozer.id]["result"] == "awake"  # type: ignore[index]
    assert jobs[gave_up.id]["state"] == "cancelled"  # type: ignore[index]
    assert (jobs[terminal.id]["state"], jobs[terminal.id]["in_dlq"]) == ("failed", True)  # type: ignore[index]
    assert jobs[terminal.id]["attempt"] == 1  # type: ignore[index]
    assert jobs[progress.id]["result"] == {
        "percent": 40,
        "message": "halfway",  # type: ignore[index]
        "metadata": {"step": 2},
    }
    assert jobs[value.id]["result"] == 41  # type: ignore[index]
    assert Ledger.objects.filter(job_id=snoozer.id).count() == 4
    proc.send_signal(signal.SIGTERM)
    assert exited(proc, timeout=20) == 0


def test_unknown_kind_and_undecodable_arguments_fail_and_the_worker_goes_on(
    manage_py: Start,
) -> None:
    with pg() as conn:
        [(evil, _)] = enqueue_sql(
            conn,
            json.dumps(
                [{"kind": "os.system", "queue": "work", "args": {"args": ["true"], "kwargs": {}}}]
            ),
        )
        [(garbled, _)] = enqueue_sql(
            conn, json.dumps([{"kind": "tests.jobs.common.ledger_sync", "queue": "work"}])
        )
        # The SQL producers refuse such arguments; a row written some other way still has to
        # fail cleanly in the worker.
        conn.execute(
            """UPDATE awa.ready_entries SET args = '{"bogus": 1}' WHERE job_id = %s""", [garbled]
        )
    fine = testjobs.ledger_sync.enqueue(7)
    proc = worker(manage_py, "--burst", "--queue", "work")
    assert exited(proc, timeout=30) == 0, proc.output()
    with pg() as conn:
        bad = job_state(conn, evil)
        odd = job_state(conn, garbled)
    assert bad is not None and odd is not None
    assert (bad["state"], bad["attempt"]) == ("failed", 1)
    assert "'os.system' is not registered" in bad["errors"][-1]["message"]
    assert "cannot be decoded" in odd["errors"][-1]["message"]
    assert states(fine.id) == ["completed"]
    assert Ledger.objects.filter(job_id=evil).count() == 0


def test_cooperative_cancel_reaches_sync_and_async_handlers(manage_py: Start) -> None:
    sync_job = testjobs.slow_sync.enqueue(60)
    async_job = testjobs.slow_async.enqueue(60)
    proc = worker(manage_py, "--queue", "slow=4")
    wait_for(
        lambda: states(sync_job.id, async_job.id) == ["running", "running"],
        timeout=20,
        message=lambda: f"both running; output:\n{proc.output()}",
    )
    assert awa_django.cancel(sync_job.id) == "running"
    assert awa_django.cancel(async_job.id) == "running"
    wait_for(
        lambda: Ledger.objects.filter(note="saw-cancel").count() == 2,
        timeout=10,
        message=lambda: f"both handlers to see the cancel; output:\n{proc.output()}",
    )
    assert states(sync_job.id, async_job.id) == ["cancelled", "cancelled"]
    proc.send_signal(signal.SIGTERM)
    assert exited(proc, timeout=20) == 0
    assert "stale finalization" in proc.output()  # their late results lost, as they should


def test_sync_jobs_claimed_with_a_slow_one_do_not_wait_for_it(manage_py: Start) -> None:
    # One lane, FIFO: the slow job and the first quick ones come in one claim, and the pool
    # hands that claim's jobs to one thread first. The quick ones must get threads of their own
    # rather than wait behind the slow one.
    slow, *quick = awa_django.enqueue_many(
        [testjobs.slow_sync.prepare(60)] + [testjobs.overlap_sync.prepare(0) for _ in range(6)]
    )
    proc = worker(manage_py, "--queue", "slow=4")
    wait_for(
        lambda: states(*(h.id for h in quick)) == ["completed"] * 6,
        timeout=20,
        message=lambda: f"the quick jobs to complete; output:\n{proc.output()}",
    )
    assert states(slow.id) == ["running"]
    assert awa_django.cancel(slow.id) == "running"
    wait_for(
        lambda: Ledger.objects.filter(note="saw-cancel").count() == 1,
        timeout=10,
        message=lambda: f"the slow handler to see the cancel; output:\n{proc.output()}",
    )
    proc.send_signal(signal.SIGTERM)
    assert exited(proc, timeout=20) == 0


def test_without_notify_cancellation_reaches_the_handler_through_the_heartbeat(
    manage_py: Start,
) -> None:
    job = testjobs.slow_sync.enqueue(60)
    proc = worker(manage_py, "--queue", "slow", overrides={"NOTIFY": False})
    wait_for(lambda: states(job.id) == ["running"], timeout=20, message=lambda: proc.output())
    with pg() as conn:
        listening = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'awa:worker:%%' "
            "AND query ILIKE 'LISTEN%%'"
        ).fetchone()
    assert listening == (0,)
    assert awa_django.cancel(job.id) == "running"
    # No LISTEN connection: the next heartbeat that includes the attempt (it has run for a
    # HEARTBEAT_INTERVAL, 0.2 s here) reports it closed, and the handler is told.
    wait_for(
        lambda: Ledger.objects.filter(job_id=job.id, note="saw-cancel").exists(),
        timeout=10,
        message=lambda: f"the handler to see the cancel; output:\n{proc.output()}",
    )
    assert "is no longer open (rescued or cancelled); its handler is told to stop" in (
        proc.output()
    )
    proc.send_signal(signal.SIGTERM)
    assert exited(proc, timeout=20) == 0


def test_an_attempt_closed_elsewhere_is_reported_once_while_its_handler_goes_on(
    manage_py: Start,
) -> None:
    """A handler that ignores the stop it was told goes on for a while: its closed attempt is
    logged once, not at every heartbeat after."""
    job = testjobs.overlap_sync.enqueue(1.5)
    proc = worker(manage_py, "--queue", "slow", overrides={"NOTIFY": False})
    wait_for(lambda: states(job.id) == ["running"], timeout=20, message=lambda: proc.output())
    assert awa_django.cancel(job.id) == "running"
    wait_for(
        lambda: Ledger.objects.filter(job_id=job.id, note="end").exists(),
        timeout=20,
        message=lambda: f"the handler to end; output:\n{proc.output()}",
    )
    proc.send_signal(signal.SIGTERM)
    assert exited(proc, timeout=20) == 0
    assert proc.output().count("is no longer open (rescued or cancelled)") == 1


def test_sigterm_drains_in_flight_jobs_and_claims_nothing_new(manage_py: Start) -> None:
    running = [testjobs.slow_sync.enqueue(1.5).id for _ in range(2)]
    proc = worker(manage_py, "--queue", "slow=2", overrides={"HEARTBEAT_INTERVAL": 0.1})
    wait_for(
        lambda: states(*running) == ["running", "running"],
        timeout=20,
        message=lambda: f"two running jobs; output:\n{proc.output()}",
    )
    waiting = testjobs.slow_sync.enqueue(0.1).id
    wait_for(
        lambda: count("SELECT count(*) FROM awa.attempt_state") == 2,
        timeout=10,
        message="heartbeats of the running jobs",
    )
    with pg() as conn:
        first = conn.execute("SELECT max(heartbeat_at) FROM awa.attempt_state").fetchone()
    proc.send_signal(signal.SIGTERM)
    # Heartbeats go on while the handlers finish.
    wait_for(
        lambda: (
            count(
                "SELECT count(*) FROM awa.attempt_state WHERE heartbeat_at > %s",
                first[0] if first else None,
            )
            > 0
            or states(*running)[0] == "completed"
        ),
        timeout=10,
        message="a heartbeat during the drain",
    )
    assert exited(proc, timeout=20) == 0, proc.output()
    assert states(*running) == ["completed", "completed"]
    assert states(waiting) == ["available"]  # not claimed after the signal
    assert Ledger.objects.filter(note="finished").count() == 2


def test_second_sigterm_exits_at_once(manage_py: Start) -> None:
    job = testjobs.slow_sync.enqueue(60).id
    proc = worker(manage_py, "--queue", "slow")
    wait_for(lambda: states(job) == ["running"], timeout=20, message="a running job")
    proc.send_signal(signal.SIGTERM)
    wait_for(lambda: "draining" in proc.output(), timeout=10, message="the drain to begin")
    proc.send_signal(signal.SIGTERM)
    assert exited(proc, timeout=10) != 0
    assert states(job) == ["running"]  # left open, to be rescued


def test_worker_survives_terminated_connections(manage_py: Start) -> None:
    proc = worker(manage_py, "--queue", "work=8")
    first = [testjobs.ledger_sync.enqueue(i).id for i in range(50)]
    wait_for(
        lambda: states(*first).count("completed") == 50,
        timeout=30,
        message=lambda: f"the first batch; output:\n{proc.output()}",
    )
    for round_ in range(2):
        with pg() as conn:
            killed = conn.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE application_name LIKE 'awa:worker:%'"
            ).fetchone()
        assert killed is not None and killed[0] >= 2, round_
        more = [testjobs.ledger_sync.enqueue(i).id for i in range(50)]
        wait_for(
            lambda more=more: states(*more).count("completed") == 50,
            timeout=60,
            message=lambda round_=round_: f"jobs after termination {round_}: {proc.output()}",
        )
    assert proc.proc.poll() is None  # no process restart was needed
    assert "stale finalization" not in proc.output()
    assert Ledger.objects.count() == Ledger.objects.values("job_id").distinct().count() == 150
    proc.send_signal(signal.SIGTERM)
    assert exited(proc, timeout=20) == 0


def test_runtime_instance_row_is_registered_and_removed(manage_py: Start) -> None:
    proc = worker(manage_py, "--queue", "work=3", "--no-maintenance")
    wait_for(
        lambda: count("SELECT count(*) FROM awa.runtime_instances") == 1,
        timeout=20,
        message="the runtime row",
    )
    with pg() as conn:
        row = conn.execute("SELECT pid, queues, concurrency FROM awa.runtime_instances").fetchone()
    assert row == (proc.pid, {"work": 3}, 3)
    with pg() as conn:
        names = [
            r[0]
            for r in conn.execute(
                "SELECT DISTINCT application_name FROM pg_stat_activity "
                "WHERE application_name LIKE 'awa:worker:%'"
            ).fetchall()
        ]
    assert len(names) == 1
    proc.send_signal(signal.SIGTERM)
    assert exited(proc, timeout=20) == 0
    assert count("SELECT count(*) FROM awa.runtime_instances") == 0


def test_supervisor_restarts_a_crashed_child_and_stops_cleanly(manage_py: Start) -> None:
    proc = worker(manage_py, "--processes", "2", "--queue", "work", "--no-maintenance")

    def pids() -> set[int]:
        with pg() as conn:
            return {r[0] for r in conn.execute("SELECT pid FROM awa.runtime_instances")}

    def two() -> set[int] | None:
        found = pids()
        return found if len(found) == 2 else None

    first = wait_for(two, timeout=30, message=lambda: f"two children; output:\n{proc.output()}")
    victim = min(first)
    import os

    os.kill(victim, signal.SIGKILL)
    wait_for(
        lambda: len(pids() - first) == 1,
        timeout=30,
        message=lambda: f"a restarted child; output:\n{proc.output()}",
    )
    assert "restarting in" in proc.output()
    proc.send_signal(signal.SIGTERM)
    assert exited(proc, timeout=30) == 0, proc.output()
    assert pids() == {victim}  # the killed child's row stays until retention removes it


def _callback_of(job_id: int) -> str:
    return str(
        Ledger.objects.filter(job_id=job_id).order_by("id").values_list("note", flat=True)[0]
    )


def test_wait_for_callback_is_resolved_through_the_fenced_path(manage_py: Start) -> None:
    job = testjobs.await_callback.enqueue(60).id
    proc = worker(manage_py, "--queue", "cb")
    wait_for(
        lambda: states(job) == ["waiting_external"],
        timeout=20,
        message=lambda: f"the job to park; output:\n{proc.output()}",
    )
    callback = _callback_of(job)
    assert awa_django.resolve_callback(callback, result={"paid": True}) == "resolved"
    with pg() as conn:
        state = job_state(conn, job)
    assert state is not None and (state["state"], state["result"]) == ("completed", {"paid": True})
    assert awa_django.resolve_callback(callback, result=1) == "stale"
    assert awa_django.resolve_callback("00000000-0000-0000-0000-000000000001") == "unknown"
    proc.send_signal(signal.SIGTERM)
    assert exited(proc, timeout=20) == 0


def test_callback_timeout_is_rescued_and_retried(manage_py: Start) -> None:
    job = testjobs.await_callback.enqueue(0.3).id
    proc = worker(manage_py, "--queue", "cb")
    wait_for(
        lambda: states(job) == ["completed"],
        timeout=30,
        message=lambda: f"timeout, rescue and a second attempt; output:\n{proc.output()}",
    )
    with pg() as conn:
        state = job_state(conn, job)
    assert state is not None
    assert (state["result"], state["attempt"]) == ("second attempt", 2)
    assert state["errors"][0]["message"] == "callback timed out"
    assert awa_django.resolve_callback(_callback_of(job), result=1) == "stale"
    proc.send_signal(signal.SIGTERM)
    assert exited(proc, timeout=20) == 0


# Queues: whatever can be enqueued is run ----------------------------------------------------


def served(*names: str) -> bool:
    with pg() as conn:
        rows = conn.execute("SELECT queues FROM awa.runtime_instances").fetchall()
    return any(set(names) <= set(row[0]) for row in rows)


@pytest.mark.parametrize("notify", [True, False], ids=["notify", "polling"])
def test_a_worker_without_queues_runs_jobs_of_queues_nobody_configured(
    manage_py: Start, notify: bool
) -> None:
    from tests.jobs import tasks as tasks_for_tests

    # Enqueued before the worker starts, to queues no setting, kind or backend names.
    before = testjobs.ledger_sync.using(queue="emails").enqueue(1).id
    task = tasks_for_tests.add.using(queue_name="reports").enqueue(2, 3)
    proc = worker(manage_py, overrides={"NOTIFY": notify})
    wait_for(
        lambda: states(before, int(task.id)) == ["completed", "completed"],
        timeout=30,
        message=lambda: f"both jobs; output:\n{proc.output()}",
    )
    # A queue that appears while the worker runs is served too: at once on its wake-up, or
    # at the next runtime refresh without NOTIFY.
    later = testjobs.ledger_sync.using(queue="brand-new").enqueue(2).id
    wait_for(
        lambda: states(later) == ["completed"],
        timeout=30,
        message=lambda: f"the job of a new queue; output:\n{proc.output()}",
    )
    wait_for(lambda: served("emails", "reports", "brand-new"), timeout=10, message="the row")
    assert "now serving queue brand-new" in proc.output()
    proc.send_signal(signal.SIGTERM)
    assert exited(proc, timeout=20) == 0, proc.output()


def test_a_worker_given_queues_serves_only_those(manage_py: Start) -> None:
    elsewhere = testjobs.ledger_sync.using(queue="elsewhere").enqueue(1).id
    mine = testjobs.ledger_sync.enqueue(2).id
    proc = worker(manage_py, "--burst", "--queue", "work")
    assert exited(proc, timeout=30) == 0, proc.output()
    assert states(mine, elsewhere) == ["completed", "available"]


# Concurrency: jobs per process, across its queues -------------------------------------------


def test_concurrency_counts_jobs_per_process_across_queues_and_caps_each_queue(
    manage_py: Start,
) -> None:
    ids = [testjobs.overlap_sync.enqueue(0.6).id for _ in range(4)]
    ids += [testjobs.overlap_sync.using(queue="slow-b").enqueue(0.6).id for _ in range(4)]
    proc = worker(manage_py, "--concurrency", "3", "--queue", "slow=1", "--queue", "slow-b")
    wait_for(
        lambda: states(*ids).count("completed") == len(ids),
        timeout=60,
        message=lambda: proc.output(),
    )
    # Handlers at once, from their own start/end records (a job's state stays "running" until
    # its completion batch is written, after its slot is free again).
    with pg() as conn:
        events = conn.execute(
            "SELECT created_at, note, queue FROM testapp_ledger ORDER BY created_at, note"
        ).fetchall()
    running = {"all": 0, "slow": 0}
    peak = {"all": 0, "slow": 0}
    for _, note, queue in events:  # at equal times "end" sorts first
        step = 1 if note == "start" else -1
        running["all"] += step
        running["slow"] += step if queue == "slow" else 0
        peak = {k: max(peak[k], running[k]) for k in peak}
    assert peak == {"all": 3, "slow": 1}, (events, proc.output())
    with pg() as conn:
        row = conn.execute("SELECT queues, concurrency FROM awa.runtime_instances").fetchone()
    assert row == ({"slow": 1, "slow-b": 3}, 3)
    proc.send_signal(signal.SIGTERM)
    assert exited(proc, timeout=20) == 0, proc.output()
