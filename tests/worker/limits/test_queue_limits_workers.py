"""Flow control with real worker processes (docs/flow.md): a global concurrency limit across
processes, also while one is SIGKILLed; weights; a rate limit over 11 s without busy polling; a
limit changed at runtime. How many handlers ran at once is read from the ledger's start and
end rows (database clock), never from job states, which finish in batches."""

from __future__ import annotations

import json
import signal
from typing import Any

import pytest

import awa_django
from tests.jobs import common as testjobs
from tests.support.database import pg
from tests.support.ledger_runs import completed, max_overlap, running_now
from tests.support.polling import wait_for
from tests.support.processes import ManagedProcess
from tests.support.workers import Start, exited, worker
from tests.testapp.models import Ledger

pytestmark = [pytest.mark.worker, pytest.mark.usefixtures("clean_awa")]


def overrides(queue: str, **limits: Any) -> dict[str, Any]:
    return {"QUEUES": {queue: limits}}


def test_global_limit_holds_across_four_processes_and_a_sigkill(manage_py: Start) -> None:
    awa_django.enqueue_many([testjobs.flow_sleep.prepare(0.15) for _ in range(40)])
    settings = overrides("flow", global_concurrency=3)
    procs = [worker(manage_py, "--queue", "flow=4", overrides=settings) for _ in range(4)]
    wait_for(lambda: completed("flow") >= 8, timeout=60, message="the first jobs")
    # SIGKILL a worker that is running a job right now (its permits die with its session).
    with pg() as conn:
        running = conn.execute(
            "SELECT DISTINCT c.worker_id FROM awa.jobs j JOIN awa.claims c ON c.job_id = j.id "
            "AND c.run_lease = j.run_lease WHERE j.state = 'running' AND j.queue = 'flow'"
        ).fetchall()
        instances = dict(
            conn.execute("SELECT instance_id, pid FROM awa.runtime_instances").fetchall()
        )
    victim: ManagedProcess | None = None
    pids = {instances.get(r[0]) for r in running}
    for proc in procs:
        if proc.pid in pids:
            victim = proc
    assert victim is not None, "no worker was running a job"
    # The killed attempts end at the kill: read just before it (read after, it could fall after
    # another worker took the permits the kill freed, and show an overlap that never was).
    with pg() as conn:
        row = conn.execute("SELECT clock_timestamp()").fetchone()
    assert row is not None
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    killed = {
        (j, lease): row[0]
        for j, lease in Ledger.objects.values_list("job_id", "run_lease").distinct()
    }
    wait_for(lambda: completed("flow") == 40, timeout=90, message="every job to complete")
    assert max_overlap(killed) == 3
    for proc in procs:
        if proc is not victim:
            proc.send_signal(signal.SIGTERM)
            assert exited(proc, 30) == 0, proc.output()
    with pg() as conn:
        assert conn.execute(
            "SELECT in_use FROM awa.flow_status_v1() WHERE queue = 'flow'"
        ).fetchone() == (0,)


def test_weights_count_against_the_global_limit(manage_py: Start) -> None:
    requests = []
    for i in range(30):
        weight = 4 if i % 3 == 0 else 1
        requests.append(testjobs.flow_sleep.using(weight=weight).prepare(0.1))
    awa_django.enqueue_many(requests)
    settings = overrides("flow", global_concurrency=4)
    procs = [worker(manage_py, "--queue", "flow=8", overrides=settings) for _ in range(2)]
    wait_for(lambda: completed("flow") == 30, timeout=90, message="every job to complete")
    assert max_overlap() == 4
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
        assert exited(proc, 30) == 0, proc.output()


@pytest.mark.slow
def test_rate_limit_holds_across_processes_without_busy_polling(manage_py: Start) -> None:
    with pg() as conn:
        dbname = conn.execute("SELECT current_database()").fetchone()
        assert dbname is not None
        conn.execute(f"ALTER DATABASE \"{dbname[0]}\" SET track_functions = 'pl'")
    awa_django.enqueue_many([testjobs.flow_tick.prepare() for _ in range(1100)])
    settings = overrides("flow-rate", rate_limit=100, rate_burst=10)
    procs = [worker(manage_py, "--queue", "flow-rate=64", overrides=settings) for _ in range(2)]
    wait_for(lambda: completed("flow-rate") == 1100, timeout=90, message="every job to complete")
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
        assert exited(proc, 30) == 0, proc.output()
    with pg() as conn:
        # Attempts started within 10 s of the first one: at most 100 x 10 + 10.
        row = conn.execute(
            "WITH a AS (SELECT attempted_at FROM awa.terminal_jobs WHERE queue = 'flow-rate') "
            "SELECT count(*) FILTER (WHERE attempted_at < (SELECT min(attempted_at) FROM a) "
            "+ interval '10 s'), count(*) FROM a"
        ).fetchone()
        assert row is not None
        assert row[1] == 1100
        assert row[0] <= 1010, row
        # Each claim that the rate limit held back sleeps until the next job may start: about
        # one claim per job per worker, not a poll loop (2 workers x 11 s at POLL_INTERVAL would
        # be 440 claims; busy polling, tens of thousands).
        calls = conn.execute(
            "SELECT coalesce(sum(calls), 0) FROM pg_stat_user_functions "
            "WHERE schemaname = 'awa' AND funcname = 'claim_v3'"
        ).fetchone()
        assert calls is not None
        assert 0 < calls[0] <= 3000, calls


def test_a_limit_changed_at_runtime_takes_effect_within_a_poll_interval(
    manage_py: Start,
) -> None:
    awa_django.enqueue_many([testjobs.flow_sleep.prepare(1.5) for _ in range(12)])
    settings = overrides("flow", global_concurrency=1)
    procs = [worker(manage_py, "--queue", "flow=8", overrides=settings) for _ in range(2)]
    wait_for(lambda: running_now() == 1, timeout=30, message="one job running")
    with pg() as conn:
        conn.execute("SELECT * FROM awa.flow_set_v1('flow', 5, NULL, NULL, 'test', false)")
    # POLL_INTERVAL is 0.05 s here; a claim and a handler start take a few ms more.
    wait_for(lambda: running_now() == 5, timeout=1.0, interval=0.01, message="five running")
    wait_for(lambda: completed("flow") == 12, timeout=60, message="every job to complete")
    assert max_overlap() == 5
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
        assert exited(proc, 30) == 0, proc.output()
    rows = json.dumps([p.output()[-2000:] for p in procs])
    assert "flow limits from settings" in rows


def test_limits_hold_on_workers_serving_several_limited_queues(manage_py: Start) -> None:
    """Each queue's dispatcher claims on the process's one claim connection: permits handed
    back by one queue's claim must never be handed back again by another's."""
    requests = []
    for i in range(24):
        queue = "flow" if i % 2 else "flow-b"
        requests.append(testjobs.flow_sleep.using(queue=queue).prepare(0.1))
    awa_django.enqueue_many(requests)
    settings = {"QUEUES": {"flow": {"global_concurrency": 1}, "flow-b": {"global_concurrency": 2}}}
    procs = [worker(manage_py, overrides=settings) for _ in range(2)]
    wait_for(
        lambda: completed("flow") + completed("flow-b") == 24,
        timeout=90,
        message="every job to complete",
    )
    assert max_overlap(queue="flow") == 1
    assert max_overlap(queue="flow-b") == 2
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
        assert exited(proc, 30) == 0, proc.output()
