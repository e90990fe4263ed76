"""Flow limits per job kind with real worker processes (docs/flow.md, "Per kind"): a kind's
global limit across four processes, also while one is SIGKILLed, with an unlimited kind of the
same queue flowing past; a kind's rate over ~6 s without busy polling; a limit from @job; a
limit changed at runtime. Overlap is read from the ledger (database clock)."""

from __future__ import annotations

import signal
from typing import Any

import pytest
from django.core.management import call_command

import awa_django
from tests.jobs import common as testjobs
from tests.support.database import count, pg
from tests.support.ledger_runs import completed, max_overlap, running_now
from tests.support.polling import wait_for
from tests.support.processes import ManagedProcess
from tests.support.workers import Start, exited, worker

pytestmark = [pytest.mark.worker, pytest.mark.usefixtures("clean_awa")]

RESET_CLAIM_COUNTS = (
    "SELECT pg_stat_reset_single_function_counters(p.oid) FROM pg_proc p "
    "JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = 'awa' "
    "AND p.proname = 'claim_v3'"
)
SLEEP = testjobs.flow_sleep.kind
TICK = testjobs.flow_tick.kind


def kinds(**limits: dict[str, Any]) -> dict[str, Any]:
    return {"KINDS": {kind: value for kind, value in limits.items()}}


def done(kind: str) -> int:
    return count("SELECT count(*) FROM awa.jobs WHERE kind = %s AND state = 'completed'", kind)


def stop(procs: list[ManagedProcess]) -> None:
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
        assert exited(proc, 30) == 0, proc.output()


def test_kind_limit_holds_across_four_processes_and_a_sigkill(manage_py: Start) -> None:
    requests = []
    for _ in range(30):
        requests.append(testjobs.flow_sleep.prepare(0.15))
        requests.append(testjobs.kind_free.prepare(0.02))
    awa_django.enqueue_many(requests)
    settings = {"KINDS": {SLEEP: {"global_concurrency": 3}}}
    procs = [worker(manage_py, "--queue", "flow=4", overrides=settings) for _ in range(4)]
    wait_for(lambda: done(SLEEP) >= 6, timeout=60, message="the first limited jobs")
    # The unlimited kind of the same queue is not held behind the limited one.
    wait_for(lambda: done(testjobs.kind_free.kind) == 30, timeout=30, message="the free kind")
    assert done(SLEEP) < 30
    with pg() as conn:
        running = conn.execute(
            "SELECT DISTINCT c.worker_id FROM awa.jobs j JOIN awa.claims c ON c.job_id = j.id "
            "AND c.run_lease = j.run_lease WHERE j.state = 'running' AND j.kind = %s",
            [SLEEP],
        ).fetchall()
        instances = dict(
            conn.execute("SELECT instance_id, pid FROM awa.runtime_instances").fetchall()
        )
    pids = {instances.get(r[0]) for r in running}
    victim = next((p for p in procs if p.pid in pids), None)
    assert victim is not None, "no worker was running a limited job"
    # The killed attempts end at the kill: read just before it (read after, it could fall after
    # another worker took the permits the kill freed, and show an overlap that never was).
    with pg() as conn:
        row = conn.execute("SELECT clock_timestamp()").fetchone()
    assert row is not None
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    from tests.testapp.models import Ledger

    killed = {
        (j, lease): row[0]
        for j, lease in Ledger.objects.values_list("job_id", "run_lease").distinct()
    }
    wait_for(lambda: done(SLEEP) == 30, timeout=90, message="every limited job to complete")
    assert max_overlap(killed) == 3
    stop([p for p in procs if p is not victim])
    with pg() as conn:
        assert conn.execute(
            "SELECT in_use, waiting FROM awa.flow_kind_status_v1() WHERE kind = %s", [SLEEP]
        ).fetchone() == (0, 0)
        assert conn.execute("SELECT count(*) FROM awa.flow_waiting").fetchone() == (0,)


def test_a_kind_limit_from_job_options(manage_py: Start) -> None:
    awa_django.enqueue_many([testjobs.kind_capped.prepare(0.1) for _ in range(12)])
    procs = [worker(manage_py, "--queue", "flow-kind=8") for _ in range(2)]
    wait_for(lambda: completed("flow-kind") == 12, timeout=60, message="every job to complete")
    assert max_overlap(queue="flow-kind") == 2
    stop(procs)
    with pg() as conn:
        row = conn.execute(
            "SELECT max_running, source FROM awa.flow_kind_limits WHERE kind = %s",
            [testjobs.kind_capped.kind],
        ).fetchone()
    assert row == (2, "settings")


@pytest.mark.slow
def test_kind_rate_holds_across_processes_without_busy_polling(manage_py: Start) -> None:
    with pg() as conn:
        row = conn.execute("SELECT current_database()").fetchone()
        assert row is not None
        database = row[0]
        conn.execute(f"ALTER DATABASE \"{database}\" SET track_functions = 'pl'")
        conn.execute(RESET_CLAIM_COUNTS)  # the database's counters: start from 0
    try:
        awa_django.enqueue_many([testjobs.flow_tick.prepare() for _ in range(560)])
        settings = {"KINDS": {TICK: {"rate_limit": 100, "rate_burst": 10}}}
        procs = [worker(manage_py, "--queue", "flow-rate=64", overrides=settings) for _ in range(2)]
        wait_for(lambda: done(TICK) == 560, timeout=90, message="every job to complete")
        stop(procs)
        check_kind_rate()
    finally:
        # Later tests (tests/worker/limits/test_queue_limits_workers.py) count claims of their
        # own, from 0.
        with pg() as conn:
            conn.execute(f'ALTER DATABASE "{database}" RESET track_functions')
            conn.execute(RESET_CLAIM_COUNTS)


def check_kind_rate() -> None:
    with pg() as conn:
        # Starts in any window of t seconds (t = 1, 5): at most 100 t + 10.
        for seconds in (1, 5):
            row = conn.execute(
                "WITH a AS (SELECT attempted_at AS t FROM awa.terminal_jobs WHERE kind = %s) "
                "SELECT max((SELECT count(*) FROM a b WHERE b.t >= a.t "
                "AND b.t < a.t + make_interval(secs => %s))) FROM a",
                [TICK, seconds],
            ).fetchone()
            assert row is not None and row[0] <= 100 * seconds + 10, (seconds, row)
        span = conn.execute(
            "SELECT extract(epoch FROM max(attempted_at) - min(attempted_at)) "
            "FROM awa.terminal_jobs WHERE kind = %s",
            [TICK],
        ).fetchone()
        assert span is not None and float(span[0]) >= 5.5, span  # 550 jobs past the burst at 100/s
        calls = conn.execute(
            "SELECT coalesce(sum(calls), 0) FROM pg_stat_user_functions "
            "WHERE schemaname = 'awa' AND funcname = 'claim_v3'"
        ).fetchone()
        assert calls is not None
        # About two claims per worker per token (its soft wait ends, and the NOTIFY of a job
        # another claim un-parked wakes it); busy polling would be tens of thousands.
        assert 0 < calls[0] <= 3000, calls


def test_a_kind_limit_changed_at_runtime_takes_effect_within_a_poll_interval(
    manage_py: Start,
) -> None:
    awa_django.enqueue_many([testjobs.flow_sleep.prepare(1.5) for _ in range(12)])
    settings = {"KINDS": {SLEEP: {"global_concurrency": 1}}}
    procs = [worker(manage_py, "--queue", "flow=8", overrides=settings) for _ in range(2)]
    wait_for(lambda: running_now() == 1, timeout=30, message="one job running")
    call_command("awa_queue", "limit", "--kind", SLEEP, "--global-concurrency", "5", verbosity=0)
    # POLL_INTERVAL is 0.05 s here; a claim and a handler start take a few ms more.
    wait_for(lambda: running_now() == 5, timeout=1.0, interval=0.01, message="five running")
    wait_for(lambda: completed("flow") == 12, timeout=60, message="every job to complete")
    assert max_overlap() == 5
    stop(procs)


def test_serial_keys_of_a_limited_kind_keep_their_order(manage_py: Start) -> None:
    """Jobs with serial keys, of a kind limited to 2: within a key one at a time and in enqueue
    order (a job its kind parks takes no key, and younger jobs of its key wait behind it);
    never more than 2 of the kind at once."""
    from tests.support.ledger_runs import assert_one_at_a_time, runs_by_key

    keys = ["customer:1", "customer:2", "customer:3"]
    serial = testjobs.serial_sleep
    requests = [serial.using(serial_key=keys[i % 3]).prepare(0.02) for i in range(60)]
    requests += [serial.prepare(0.02) for _ in range(10)]
    handles = awa_django.enqueue_many(requests)
    expected = {key: [h.id for h in handles[i:60:3]] for i, key in enumerate(keys)}
    # A production-like staleness, as in test_serial_workers: a rescued attempt's retry may run
    # out of its key's order.
    settings = {
        "KINDS": {serial.kind: {"global_concurrency": 2}},
        "HEARTBEAT_STALENESS": 60.0,
    }
    procs = [worker(manage_py, "--queue", "serial=4", overrides=settings) for _ in range(4)]
    wait_for(lambda: completed("serial") == 70, timeout=120, message="every job to complete")
    stop(procs)
    runs = runs_by_key()
    for key in keys:
        assert [run[2] for run in runs[key]] == expected[key], key
        assert_one_at_a_time(runs[key])
    events = sorted(
        [(start, 1) for key_runs in runs.values() for start, _, _, _ in key_runs]
        + [(end, -1) for key_runs in runs.values() for _, end, _, _ in key_runs],
        key=lambda e: (e[0], e[1]),  # at equal times, ends before starts
    )
    running = peak = 0
    for _, delta in events:
        running += delta
        peak = max(peak, running)
    assert peak == 2
    with pg() as conn:
        for table in ("flow_waiting", "serial_waiting"):
            assert conn.execute(f"SELECT count(*) FROM awa.{table}").fetchone() == (0,)
        assert conn.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
            "AND classid IN (4282182, 4282183)"
        ).fetchone() == (0,)
