"""Periodic jobs with real processes: two maintenance processes and a leader SIGKILLed in the
middle of a fire still enqueue exactly one job per fire time; a schedule removed from code
stops firing after a restart; a broken schedule does not stop a live leader or the others."""

from __future__ import annotations

import signal
from datetime import datetime, timedelta
from typing import Any

import pytest

from tests.jobs import worker_env
from tests.support.database import pg
from tests.support.polling import wait_for
from tests.support.processes import ManagedProcess

pytestmark = [pytest.mark.usefixtures("clean_awa"), pytest.mark.worker]

EVERY_SECOND = {"job": "tests.jobs.common.noop", "cron": "* * * * * *", "queue": "cron"}


def start(manage_py: Any, command: str, schedules: dict[str, Any], *args: str) -> ManagedProcess:
    env = worker_env(PERIODIC=schedules, CRON_EVAL_INTERVAL=0.05)
    return manage_py(command, *args, extra_env=env)


def rows(sql: str, *params: Any) -> list[tuple[Any, ...]]:
    with pg() as conn:
        return conn.execute(sql, list(params)).fetchall()


def fire_times(name: str) -> list[datetime]:
    return [
        datetime.fromisoformat(r[0])
        for r in rows(
            "SELECT metadata->>'cron_fire_time' FROM awa.jobs WHERE metadata->>'cron_name' = %s "
            "ORDER BY id",
            name,
        )
    ]


def stop(process: ManagedProcess) -> None:
    process.send_signal(signal.SIGTERM)
    wait_for(lambda: process.proc.poll() is not None, timeout=30, message="the process to exit")


def test_a_leader_killed_mid_fire_and_a_second_process_fire_each_time_exactly_once(
    manage_py: Any,
) -> None:
    schedules = {"tick": {**EVERY_SECOND, "catch_up": 1000}}
    first = start(manage_py, "awa_maintenance", schedules)
    second = start(manage_py, "awa_maintenance", schedules)
    processes = {first.pid: first, second.pid: second}
    wait_for(
        lambda: len(fire_times("tick")) >= 3,
        timeout=30,
        message=lambda: f"the first fires; output:\n{first.output()}\n{second.output()}",
    )
    [(leader_pid, instance)] = rows(
        "SELECT pid, instance_id::text FROM awa.runtime_instances WHERE is_leader"
    )
    lanes = [r[0] for r in rows("SELECT lane_id FROM awa.queue_lanes WHERE queue = 'cron'")]
    with pg(autocommit=False) as holder:
        # Hold every lane of the queue: the leader's next fire takes the schedule's row, then
        # waits in the enqueue, in the middle of its transaction.
        for lane in lanes:
            holder.execute("SELECT pg_advisory_xact_lock(4282177, %s)", [lane])
        wait_for(
            lambda: (
                rows(
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s "
                    "AND wait_event_type = 'Lock' AND query LIKE '%%cron_fire_v1%%'",
                    f"awa:worker:{instance}",
                )
                == [(1,)]
            ),
            timeout=30,
            message="the leader to be stuck in the middle of a fire",
        )
        processes[leader_pid].send_signal(signal.SIGKILL)
        processes[leader_pid].wait(10)
        at_kill = len(fire_times("tick"))
        holder.rollback()  # the killed leader's transaction may now commit, or not
    survivor = next(p for pid, p in processes.items() if pid != leader_pid)
    wait_for(
        lambda: len(fire_times("tick")) >= at_kill + 5,
        timeout=60,
        message=lambda: f"the survivor to take over and fire; output:\n{survivor.output()}",
    )
    assert rows("SELECT pid FROM awa.runtime_instances WHERE is_leader") == [(survivor.pid,)]
    stop(survivor)
    times = fire_times("tick")
    assert len(times) == len(set(times)), "a fire time was enqueued twice"
    # Every second from the first fire to the last fired once (catch-up covers the takeover).
    expected = [times[0] + timedelta(seconds=i) for i in range(len(times))]
    assert times == expected
    [(after, last)] = rows("SELECT fire_after, last_fire_at FROM awa.cron_schedules")
    assert after == last == times[-1]


def test_a_schedule_removed_from_code_stops_firing_after_a_restart(manage_py: Any) -> None:
    both = start(manage_py, "awa_maintenance", {"keep": EVERY_SECOND, "drop": EVERY_SECOND})
    wait_for(
        lambda: len(fire_times("keep")) >= 2 and len(fire_times("drop")) >= 2,
        timeout=30,
        message=lambda: f"both to fire; output:\n{both.output()}",
    )
    stop(both)
    dropped = len(fire_times("drop"))
    kept = len(fire_times("keep"))
    one = start(manage_py, "awa_maintenance", {"keep": EVERY_SECOND})
    wait_for(
        lambda: len(fire_times("keep")) >= kept + 3,
        timeout=30,
        message=lambda: f"keep to go on firing; output:\n{one.output()}",
    )
    stop(one)
    assert len(fire_times("drop")) == dropped
    assert [r[0] for r in rows("SELECT name FROM awa.cron_schedules")] == ["keep"]
    assert "schedule 'drop' removed" in one.output()


def test_a_broken_schedule_never_stops_a_live_leader_or_the_others(manage_py: Any) -> None:
    worker = start(
        manage_py, "awa_worker", {"good": EVERY_SECOND, "bad": EVERY_SECOND}, "--queue", "cron"
    )
    wait_for(
        lambda: len(rows("SELECT 1 FROM awa.cron_schedules")) == 2,
        timeout=30,
        message=lambda: f"the schedules to be synced; output:\n{worker.output()}",
    )
    with pg() as conn:
        conn.execute("UPDATE awa.cron_schedules SET cron_expr = 'often' WHERE name = 'bad'")
    before = len(fire_times("good"))
    wait_for(
        lambda: len(fire_times("good")) >= before + 3,
        timeout=30,
        message=lambda: f"good to go on firing; output:\n{worker.output()}",
    )
    wait_for(
        lambda: (
            rows("SELECT last_job_state FROM awa.cron_schedule_status WHERE name = 'good'")
            == [("completed",)]
        ),
        timeout=30,
        message="the worker to run a fired job",
    )
    assert worker.proc.poll() is None
    assert "schedule 'bad' cannot compute its fire times" in worker.output()
    stop(worker)


def test_a_worker_without_maintenance_syncs_its_schedules_but_never_fires(
    manage_py: Any,
) -> None:
    worker = start(
        manage_py, "awa_worker", {"tick": EVERY_SECOND}, "--queue", "cron", "--no-maintenance"
    )
    wait_for(
        lambda: rows("SELECT name FROM awa.cron_schedules") == [("tick",)],
        timeout=30,
        message=lambda: f"the schedule to be synced; output:\n{worker.output()}",
    )
    # Firing is the leader's: with no maintenance process, nothing fires.
    assert "schedule 'tick' created" in worker.output()
    stop(worker)
    assert fire_times("tick") == []


def test_a_bad_expression_or_time_zone_stops_a_worker_at_start_up_with_a_clear_error(
    manage_py: Any,
) -> None:
    bad = {
        "minute": {**EVERY_SECOND, "cron": "61 * * * *"},
        "zone": {**EVERY_SECOND, "timezone": "Europe/Atlantis"},
    }
    worker = start(manage_py, "awa_worker", bad, "--queue", "cron")
    assert worker.wait(60) != 0
    output = worker.output()
    assert "SystemCheckError" in output, output
    assert "(awa.E007) AWA['PERIODIC']['minute']: cron: '61 * * * *' is not valid" in output
    assert "(awa.E007) AWA['PERIODIC']['zone']: timezone: 'Europe/Atlantis'" in output
    assert rows("SELECT count(*) FROM awa.cron_schedules") == [(0,)]
