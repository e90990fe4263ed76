"""A worker serving many queues: every committed job runs, queues take turns, idle queues cost
a sweep, not a claim each, and the sweep claims only what can run (awa_django/worker/dispatch.py,
awa_django/worker/sweep.py; docs/worker.md, "Many queues").

Real ``awa_worker`` subprocesses against real PostgreSQL; waits on database state. Claims and
sweep statements are counted with PostgreSQL's function statistics (``track_functions``).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from django.db import connection, transaction

import awa_django
from tests.jobs import common as testjobs
from tests.jobs import worker_env
from tests.support.database import pg
from tests.support.polling import wait_for
from tests.support.processes import ManagedProcess
from tests.testapp.models import Ledger

pytestmark = [pytest.mark.worker, pytest.mark.usefixtures("clean_awa")]

Start = Callable[..., ManagedProcess]

#: The sweep's probe, and the name it is hidden under to make it fail.
PROBE_ARGS = "(text[], bigint[], integer[], integer, integer)"
PROBE, GONE = f"awa.queues_ready_v2{PROBE_ARGS}", f"awa.queues_ready_gone{PROBE_ARGS}"


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


def one_job_per_queue(names: list[str], priority: int = 0) -> list[int]:
    with transaction.atomic():
        handles = awa_django.enqueue_many(
            [
                testjobs.ledger_async.using(queue=name, priority=priority).prepare(i)
                for i, name in enumerate(names)
            ]
        )
    return [h.id for h in handles]


def run_all(ids: list[int], proc: ManagedProcess, timeout: float = 60) -> None:
    wait_for(
        lambda: completed(ids) == len(ids),
        timeout=timeout,
        message=lambda: f"{len(ids)} jobs to complete ({completed(ids)} did)\n{proc.output()}",
    )


@pytest.fixture
def calls() -> Iterator[Callable[[str], int]]:
    """How many times each awa function was called by sessions opened from now on (their
    statistics are flushed about every second): ``calls("claim_v3")``."""
    name = connection.settings_dict["NAME"]
    with pg() as conn:
        conn.execute(f"ALTER DATABASE \"{name}\" SET track_functions = 'pl'")

    def count(function: str) -> int:
        with pg() as conn:
            row = conn.execute(
                "SELECT COALESCE(sum(calls), 0) FROM pg_stat_user_functions"
                " WHERE schemaname = 'awa' AND funcname = %s",
                [function],
            ).fetchone()
        assert row is not None
        return int(row[0])

    yield count
    with pg() as conn:
        conn.execute(f'ALTER DATABASE "{name}" RESET track_functions')


def settled_claims(calls: Callable[[str], int]) -> int:
    """The count of claims once it has not moved for 1.5 s: a backend reports its calls up to
    about a second after it made them, so a count read at once may grow later by claims made
    before it was read."""
    seen = [calls("claim_v3"), time.monotonic()]

    def still() -> bool:
        now = calls("claim_v3")
        if now != seen[0]:
            seen[:] = [now, time.monotonic()]
        return time.monotonic() - seen[1] >= 1.5

    wait_for(still, timeout=60, interval=0.1, message="the claims' count to settle")
    return int(seen[0])


def claims_over_sweeps(calls: Callable[[str], int], sweeps: int, proc: ManagedProcess) -> int:
    """Claims made while the sweep runs ``sweeps`` more statements (it had that many chances
    to report a queue), counted from a settled count (``settled_claims``)."""
    claims, probes = settled_claims(calls), calls("queues_ready_v2")
    wait_for(
        lambda: calls("queues_ready_v2") >= probes + sweeps,
        timeout=60,
        message=lambda: f"{sweeps} sweep statements\n{proc.output()}",
    )
    return calls("claim_v3") - claims


def hold_sequence(conn: psycopg.Connection[Any], queue: str) -> None:
    """In ``conn``'s open transaction, lock the sequence of ``queue``'s first lane: a sweep
    statement that reads it waits until the transaction ends."""
    row = conn.execute(
        "SELECT enqueue_seq::text FROM awa.queue_lanes WHERE queue = %s ORDER BY lane_id LIMIT 1",
        [queue],
    ).fetchone()
    assert row is not None
    conn.execute(f"ALTER SEQUENCE {row[0]} CACHE 1")


def waiting_for_a_lock() -> str | None:
    """Which of the worker's statements waits for a lock: "sweep", "claim" or None."""
    with pg() as conn:
        row = conn.execute(
            "SELECT bool_or(query LIKE '%%queues_ready_v2%%'), bool_or(query LIKE '%%claim_v3%%')"
            " FROM pg_stat_activity WHERE application_name LIKE 'awa:worker:%%'"
            " AND wait_event_type = 'Lock'"
        ).fetchone()
    assert row is not None
    return "sweep" if row[0] else "claim" if row[1] else None


def block_the_sweep(locker: psycopg.Connection[Any], queue: str, proc: ManagedProcess) -> None:
    """Lock ``queue``'s first lane sequence in ``locker``'s transaction until a sweep
    statement waits for it. A claim of ``queue`` still in flight (the one after its last job)
    may take the lock's wait first: then let it finish and try again."""
    for _ in range(10):
        hold_sequence(locker, queue)
        if wait_for(waiting_for_a_lock, timeout=30, message=proc.output) == "sweep":
            return
        locker.rollback()
        wait_for(lambda: waiting_for_a_lock() is None, timeout=30, message=proc.output)
    raise AssertionError(f"a claim of {queue} waited for the lock ten times\n{proc.output()}")


# Many queues, fairly served ------------------------------------------------------------------


def test_a_worker_without_queue_runs_a_job_in_each_of_hundreds_of_queues(
    manage_py: Start, settings: Any
) -> None:
    # One worker used to stall at about 256 queues: every queue's own dispatcher reserved all
    # of the process's free slots for its claim, and the others waited for them, woken in an
    # order that left some queues out for good.
    settings.AWA = {**settings.AWA, "ENQUEUE_SHARDS": 1}
    ids = one_job_per_queue([f"tenant-{i}" for i in range(400)])
    proc = worker(manage_py, "--concurrency", "8")
    run_all(ids, proc, timeout=90)
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
    run_all(ids, proc)
    # 1,500 jobs of 20 ms on 4 slots take 7.5 s at best: the other queues did not wait for them.
    assert completed(busy_ids) < len(busy_ids) * 0.8


# The sweep finds exactly the work that can run ----------------------------------------------


def test_without_notify_the_sweep_finds_every_committed_job_and_claims_nothing_else(
    manage_py: Start, settings: Any, calls: Callable[[str], int]
) -> None:
    """The sweep alone finds jobs in idle queues, in a queue with more lanes than one sweep
    statement reads too; a queue whose lane positions were all rolled back (a gap: its
    sequence is ahead of its rows) costs no claim, and a job committed behind the gap runs."""
    settings.AWA = {**settings.AWA, "ENQUEUE_SHARDS": 1}
    tenants = [f"tenant-{i}" for i in range(100)]
    first = one_job_per_queue([*tenants, "gap"])
    with transaction.atomic():  # one queue with 150 lanes (one per priority)
        first += [
            h.id
            for h in awa_django.enqueue_many(
                [
                    testjobs.ledger_async.using(queue="wide", priority=p - 75).prepare(p)
                    for p in range(150)
                ]
            )
        ]
    proc = worker(manage_py, overrides={"NOTIFY": False})
    run_all(first, proc, timeout=120)
    # Every queue is idle now: a job in any of them is found by the sweep alone.
    later = one_job_per_queue(tenants[::7]) + one_job_per_queue(["wide"], priority=99)
    run_all(later, proc)
    with pytest.raises(RuntimeError), transaction.atomic():
        testjobs.ledger_async.using(queue="gap").enqueue(0)  # takes a lane position...
        raise RuntimeError  # ...and rolls back: a trailing gap
    assert claims_over_sweeps(calls, 30, proc) <= 1, proc.output()
    behind = one_job_per_queue(["gap"])
    run_all(behind, proc)


def test_queues_whose_jobs_wait_for_a_flow_limit_cost_no_claims_until_it_frees(
    manage_py: Start, settings: Any, calls: Callable[[str], int]
) -> None:
    """Jobs parked behind their kind's concurrency limit: their queues are not claimed from
    while the limit holds (they used to be, every sweep), a job of another queue is picked up
    at once, and once the limit frees every parked job runs."""
    settings.AWA = {**settings.AWA, "ENQUEUE_SHARDS": 1}
    kind = "tests.jobs.common.slow_sync"
    with pg() as conn:
        conn.execute("SELECT * FROM awa.flow_kind_set_v1(%s, 1, NULL, NULL, 'test', false)", [kind])
    proc = worker(manage_py)
    hold = testjobs.slow_sync.using(queue="hold").enqueue(8).id  # holds the kind's permit
    wait_for(lambda: Ledger.objects.filter(job_id=hold).exists() or _running(hold), timeout=30)
    with transaction.atomic():
        parked = [
            h.id
            for h in awa_django.enqueue_many(
                [testjobs.slow_sync.using(queue=f"parked-{i}").prepare(0) for i in range(20)]
            )
        ]
    wait_for(lambda: _parked() == 20, timeout=30, message=proc.output)
    # The jobs parked at enqueue; the worker finds their queues and claims from each once
    # when it does: the measure begins after that (from a settled count).
    wait_for(
        lambda: proc.output().count("now serving queue parked-") == 20,
        timeout=30,
        message=proc.output,
    )
    assert _running(hold), "the measure below needs the limit held"
    assert claims_over_sweeps(calls, 20, proc) <= 2, proc.output()
    other = one_job_per_queue(["other"])
    run_all(other, proc, timeout=10)
    run_all([hold, *parked], proc, timeout=90)


def _running(job_id: int) -> bool:
    with pg() as conn:
        row = conn.execute("SELECT state FROM awa.jobs WHERE id = %s", [job_id]).fetchone()
    return row is not None and row[0] == "running"


def _parked() -> int:
    with pg() as conn:
        row = conn.execute("SELECT count(*) FROM awa.flow_waiting").fetchone()
    assert row is not None
    return int(row[0])


def test_resuming_a_paused_queue_wakes_the_worker(manage_py: Start) -> None:
    """Resuming sends a NOTIFY: the job runs at once, not at the next sweep (60 s here)."""
    with pg() as conn:
        conn.execute("SELECT awa.queue_pause_v1('napping', true)")
    job = one_job_per_queue(["napping"])
    proc = worker(manage_py, overrides={"POLL_INTERVAL": 60.0})
    wait_for(lambda: "started" in proc.output(), timeout=60, message=proc.output)
    assert completed(job) == 0
    awa_django.operator.queue_pause("napping", False)
    run_all(job, proc, timeout=15)


# The sweep under faults -----------------------------------------------------------------------


def test_a_slow_sweep_statement_does_not_hold_up_the_sweep_of_other_queues(
    manage_py: Start,
) -> None:
    """A sweep statement that waits for a lock gives up after SWEEP_LOCK_TIMEOUT (1 s), and
    the pause after a slow statement is at most SWEEP_MAX_PAUSE (it used to be 19 times the
    statement's duration, 19 s here): a job in a queue the next statement asks about is found
    while the lock is still held."""
    names = [f"tenant-{i:02}" for i in range(40)]  # 160 lanes: two sweep statements
    first = one_job_per_queue(names)
    # After a statement gives up on the lock, the queues it asked about are probed one at a
    # time, each followed by a pause of at most SWEEP_MAX_PAUSE: 0.1 s keeps those (about 60)
    # within the wait below on a loaded machine, where the old pause after a 1 s statement
    # alone (19 s) would not.
    overrides = {"NOTIFY": False, "SWEEP_MAX_PAUSE": 0.1, "SWEEP_MAX_INTERVAL": 600.0}
    proc = worker(manage_py, overrides=overrides)
    run_all(first, proc)
    with pg(autocommit=False) as locker:
        block_the_sweep(locker, names[0], proc)  # the first statement waits for it
        later = one_job_per_queue([names[-1]])  # asked about by the second statement
        run_all(later, proc, timeout=10)
        locker.rollback()
    again = one_job_per_queue([names[0]])  # swept again once the lock is gone
    run_all(again, proc, timeout=20)


def test_a_blocked_sweep_never_delays_heartbeats(manage_py: Start) -> None:
    """The sweep has a connection of its own: while one of its statements waits for a lock,
    a running job keeps heartbeating and is never rescued (the sweep used to share the
    heartbeat connection, and the job's attempt was rescued as if its worker were dead)."""
    first = one_job_per_queue(["idle", "long"])
    proc = worker(manage_py)
    run_all(first, proc)
    with pg(autocommit=False) as locker:
        block_the_sweep(locker, "idle", proc)
        job = testjobs.slow_sync.using(queue="long").enqueue(5).id  # 2.5 x HEARTBEAT_STALENESS
        run_all([job], proc, timeout=60)
        locker.rollback()
    with pg() as conn:
        row = conn.execute(
            "SELECT attempt, run_lease FROM awa.jobs WHERE id = %s", [job]
        ).fetchone()
    assert row == (1, 1), proc.output()  # one attempt, never rescued


def test_a_sweep_that_fails_claims_from_every_idle_queue_and_backs_off(
    manage_py: Start, settings: Any, calls: Callable[[str], int]
) -> None:
    """A failing sweep statement makes the queues it asked about due (no committed job is
    lost), the next one waits longer after each failure, the failures are logged once per
    minute with their count, and the recovery once."""
    settings.AWA = {**settings.AWA, "ENQUEUE_SHARDS": 1}
    first = one_job_per_queue([f"tenant-{i}" for i in range(5)])
    proc = worker(manage_py, overrides={"NOTIFY": False, "SWEEP_BACKOFF_MAX": 0.4})
    run_all(first, proc)
    with pg() as conn:
        conn.execute(f"ALTER FUNCTION {PROBE} RENAME TO queues_ready_gone")
    try:
        later = one_job_per_queue(["tenant-3"])
        run_all(later, proc, timeout=30)
        wait_for(
            lambda: "sweep statement(s) failed" in proc.output(),
            timeout=10,
            message="the failed sweep to be logged",
        )
        # More failures (each claims from the 5 queues it asked about), after back-offs of
        # 0.05 s doubled up to 0.4 s: still the one line.
        claims = calls("claim_v3")
        wait_for(lambda: calls("claim_v3") >= claims + 15, timeout=30, message=proc.output)
    finally:
        with pg() as conn:
            conn.execute(f"ALTER FUNCTION {GONE} RENAME TO queues_ready_v2")
    wait_for(
        lambda: "the sweep of idle queues works again" in proc.output(),
        timeout=30,
        message=proc.output,
    )
    output = proc.output()
    assert output.count("sweep statement(s) failed") == 1, output
    assert _failures_so_far(proc) >= 4, output  # failed again and again, logged once
    again = one_job_per_queue(["tenant-4"])
    run_all(again, proc)


def _failures_so_far(proc: ManagedProcess) -> int:
    """The count of failed statements the recovery line gives (-1: none yet)."""
    found = re.findall(r"works again \(after (\d+) failed statement", proc.output())
    return int(found[-1]) if found else -1
