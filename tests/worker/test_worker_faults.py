"""The worker and the maintenance leader under faults, as real subprocesses (and, for the loops'
error handling, in-process against the real database).

Every background loop survives any error that is not a lost connection, fails only the
offending item with a readable error and carries on; a handler ends its job whatever it raises
or returns; a handler that will not stop loses its slot, not the worker. Each test gives the
worker a handler or a process that misbehaves: raising what it should not, blocking, exiting,
ignoring signals.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import uuid
from typing import Any

import psycopg
import pytest
from psycopg import errors

from awa_django.db import storage
from awa_django.db.links import Link, is_connection_lost
from awa_django.db.storage import Finalization
from awa_django.maintenance.leader import Maintenance, MaintenanceSettings
from awa_django.worker.batcher import CompletionBatcher
from tests.jobs import common as testjobs
from tests.support.awa_schema import job_state
from tests.support.database import pg
from tests.support.factories import WORKER, enqueue_sql
from tests.support.polling import wait_for
from tests.support.processes import ManagedProcess
from tests.support.workers import Start, worker
from tests.testapp.models import Ledger

pytestmark = [pytest.mark.usefixtures("clean_awa")]


def jobs(*ids: int) -> dict[int, dict[str, Any]]:
    with pg() as conn:
        return {i: job_state(conn, i) or {"state": "missing"} for i in ids}


def settled(*ids: int) -> bool:
    return all(j["state"] in ("completed", "failed", "cancelled") for j in jobs(*ids).values())


def last_error(job: dict[str, Any]) -> dict[str, Any]:
    errors_ = job["errors"] or [{}]
    return dict(errors_[-1])


def alive(proc: ManagedProcess) -> bool:
    return proc.proc.poll() is None


def stop(proc: ManagedProcess, timeout: float = 15) -> int:
    proc.send_signal(signal.SIGTERM)
    return proc.wait(timeout)


# Outcomes that cannot be stored as given ---------------------------------------------------------

HOSTILE = {
    # mode: (final state, in the DLQ, text the last error must contain)
    "nul_message": ("failed", True, "bad \\x00 text"),
    "surrogate_message": ("failed", True, "bad \\ud800 text"),
    "cancel_nul": ("failed", True, "NUL"),
    "retry_nan": ("failed", True, "seconds"),
    "snooze_huge": ("failed", True, "seconds"),
    "wait_inf": ("failed", True, "timeout"),
    "wait_foreign": ("failed", True, "callback"),
    "bad_progress": ("failed", True, "not JSON"),
    "surrogate_result": ("failed", True, "surrogate"),
    "huge_int_result": ("failed", True, "digits"),
}


@pytest.mark.worker
def test_unstorable_outcomes_fail_only_their_job_and_the_worker_goes_on(manage_py: Start) -> None:
    handles = {mode: testjobs.hostile.enqueue(mode) for mode in HOSTILE}
    fine = [testjobs.hostile.enqueue("fine") for _ in range(5)]
    proc = worker(manage_py, "--queue", "hostile=4")
    ids = [h.id for h in handles.values()] + [h.id for h in fine]
    wait_for(
        lambda: settled(*ids),
        timeout=30,
        message=lambda: f"every job to settle: {jobs(*ids)}\n{proc.output()}",
    )
    states = jobs(*ids)
    for mode, (state, in_dlq, text) in HOSTILE.items():
        job = states[handles[mode].id]
        assert (mode, job["state"], job["in_dlq"]) == (mode, state, in_dlq)
        assert text in last_error(job)["message"], (mode, job["errors"])
    assert {states[h.id]["state"] for h in fine} == {"completed"}
    # The worker is still whole: a job enqueued now completes too.
    later = testjobs.hostile.enqueue("fine")
    wait_for(lambda: settled(later.id), timeout=15, message=lambda: proc.output())
    assert jobs(later.id)[later.id]["state"] == "completed"
    assert stop(proc) == 0, proc.output()
    assert "Traceback" not in proc.output()


@pytest.mark.worker
def test_progress_that_is_not_json_never_stops_heartbeats(manage_py: Start) -> None:
    handle = testjobs.progress_garbage_then_finish.enqueue(2.5)
    proc = worker(manage_py, "--queue", "work", overrides={"HEARTBEAT_STALENESS": 1.0})
    wait_for(lambda: settled(handle.id), timeout=30, message=lambda: proc.output())
    job = jobs(handle.id)[handle.id]
    assert (job["state"], job["attempt"], job["errors"]) == ("completed", 1, None)
    assert Ledger.objects.filter(job_id=handle.id).count() == 1  # never rescued and re-run
    assert stop(proc) == 0, proc.output()


# Handlers that raise what is not an Exception ----------------------------------------------------


@pytest.mark.worker
def test_base_exceptions_from_handlers_fail_their_job_and_the_worker_survives(
    manage_py: Start,
) -> None:
    sync = {
        m: testjobs.hostile.enqueue(m) for m in ("system_exit", "keyboard_interrupt", "custom_base")
    }
    asyn = {
        m: testjobs.hostile_async.enqueue(m)
        for m in ("cancelled_error", "custom_base", "surrogate_result")
    }
    proc = worker(manage_py, "--queue", "hostile=2", "--queue", "hostile-async=2")
    ids = [h.id for h in (*sync.values(), *asyn.values())]
    wait_for(lambda: settled(*ids), timeout=30, message=lambda: f"{jobs(*ids)}\n{proc.output()}")
    states = jobs(*ids)
    types = {
        "system_exit": "SystemExit",
        "keyboard_interrupt": "KeyboardInterrupt",
        "custom_base": "tests.jobs.common.CustomBaseError",
    }
    for mode, handle in sync.items():
        assert (states[handle.id]["state"], last_error(states[handle.id])["type"]) == (
            "failed",
            types[mode],
        )
    assert (
        last_error(states[asyn["cancelled_error"].id])["type"]
        == "asyncio.exceptions.CancelledError"
    )
    assert last_error(states[asyn["custom_base"].id])["type"] == "tests.jobs.common.CustomBaseError"
    assert states[asyn["surrogate_result"].id]["state"] == "failed"
    assert alive(proc)
    later = testjobs.hostile.enqueue("fine")
    wait_for(lambda: settled(later.id), timeout=15, message=lambda: proc.output())
    assert stop(proc) == 0, proc.output()


# Handlers that never stop ------------------------------------------------------------------------


@pytest.mark.worker
@pytest.mark.parametrize("kind", ["stuck_sync", "stuck_async"])
def test_a_handler_stuck_past_its_deadline_frees_its_slot_and_sigterm_still_exits(
    manage_py: Start, kind: str
) -> None:
    handle = getattr(testjobs, kind)
    stuck = handle.enqueue()
    proc = worker(
        manage_py,
        "--queue",
        "stuck=1",
        overrides={
            "QUEUES": {"stuck": {"deadline": 1.0}},
            "ABANDON_AFTER": 0.5,
            "SHUTDOWN_TIMEOUT": 2.0,
        },
    )
    wait_for(
        lambda: Ledger.objects.filter(job_id=stuck.id).count() == 1,
        timeout=15,
        message=lambda: proc.output(),
    )
    # The stuck attempt is rescued; its retry, and a job behind it, run in the freed slot
    # while the first attempt's handler is still sleeping.
    behind = handle.enqueue(False)
    wait_for(
        lambda: settled(stuck.id, behind.id),
        timeout=30,
        message=lambda: f"{jobs(stuck.id, behind.id)}\n{proc.output()}",
    )
    states = jobs(stuck.id, behind.id)
    assert states[stuck.id]["state"] == "completed"
    assert last_error(states[stuck.id])["type"] == "awa_django.Rescued"
    assert states[behind.id]["state"] == "completed"
    assert "abandoned" in proc.output()
    assert stop(proc, timeout=10) == 0, proc.output()


# Callbacks ---------------------------------------------------------------------------------------


@pytest.mark.worker
def test_a_callback_resolved_before_the_handler_returns_is_not_lost(manage_py: Start) -> None:
    handle = testjobs.early_callback.enqueue()
    proc = worker(manage_py, "--queue", "cb")
    wait_for(lambda: settled(handle.id), timeout=20, message=lambda: proc.output())
    job = jobs(handle.id)[handle.id]
    assert (job["state"], job["attempt"], job["result"]) == ("completed", 1, {"early": True})
    assert stop(proc) == 0, proc.output()


# Maintenance -------------------------------------------------------------------------------------


@pytest.mark.worker
def test_awa_maintenance_from_cron_keeps_the_rotation_cadence(manage_py: Start) -> None:
    def generations() -> dict[str, int]:
        with pg() as conn:
            return dict(conn.execute("SELECT ring, generation FROM awa.ring_state").fetchall())

    def work() -> None:
        with pg() as conn:
            enqueue_sql(conn, json.dumps([{"kind": "k", "queue": "m"}]))
            storage.claim(conn, "m", 1, WORKER)

    with pg() as conn:
        conn.execute("UPDATE awa.ring_rotations SET rotated_at = now() - interval '2 days'")
    work()
    first = manage_py("awa_maintenance", "--once")
    assert first.wait(30) == 0, first.output()
    after_first = generations()
    assert after_first["queue"] == 1 and after_first["claim"] == 1
    work()
    second = manage_py("awa_maintenance", "--once")
    assert second.wait(30) == 0, second.output()
    assert generations() == after_first


def _maintenance() -> Maintenance:
    settings = MaintenanceSettings.from_settings()
    return Maintenance(settings, uuid.uuid4())


@pytest.mark.django_db(transaction=True)
def test_the_leader_keeps_leadership_through_lock_timeouts_and_bugs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def scenario() -> tuple[bool, bool, bool]:
        m = _maintenance()

        async def lock_timeout(conn: Any) -> None:
            await conn.execute("SET lock_timeout = '10ms'")
            try:
                raise errors.LockNotAvailable("canceling statement due to lock timeout")
            finally:
                await conn.execute("RESET lock_timeout")

        async def bug(conn: Any) -> None:
            raise TypeError("a bug in a task")

        try:
            await m._elect()
            elected = m.leader
            await m._run_task("promote", lock_timeout)
            after_timeout = m.leader
            await m._run_task("rescue", bug)
            return elected, after_timeout, m.leader
        finally:
            await m.link.close()

    with caplog.at_level(logging.WARNING, "awa_django.maintenance"):
        assert asyncio.run(scenario()) == (True, True, True)
    assert "a bug in a task" in caplog.text


#: Settings that make the staleness bound half a second (a session must be older to be reaped).
QUICK_STALENESS = {
    "HEARTBEAT_STALENESS": 0.5,
    "HEARTBEAT_INTERVAL": 0.1,
    "RUNTIME_REFRESH_INTERVAL": 0.1,
}


def _aged(conn: psycopg.Connection[Any], holder: psycopg.Connection[Any], seconds: float) -> None:
    """Wait until ``holder``'s session is older than ``seconds``: a younger one is of a process
    that connected within the staleness bound, which the leader never takes for frozen."""
    wait_for(
        lambda: (
            conn.execute(
                "SELECT now() - backend_start > make_interval(secs => %s) FROM pg_stat_activity "
                "WHERE pid = %s",
                [seconds, holder.info.backend_pid],
            ).fetchone()
            == (True,)
        ),
        timeout=seconds + 5,
        message="the holder's session to age",
    )


def _stale_holder(conn: psycopg.Connection[Any]) -> tuple[uuid.UUID, psycopg.Connection[Any]]:
    """A session of a worker whose runtime row is an hour stale, holding a serial key's lock."""
    instance = uuid.uuid4()
    conn.execute(
        "INSERT INTO awa.runtime_instances (instance_id, hostname, pid, last_seen_at) "
        "VALUES (%s, 'h', 1, now() - interval '1 hour')",
        [instance],
    )
    holder = psycopg.connect(
        conn.info.dsn, autocommit=True, application_name=f"awa:worker:{instance}"
    )
    holder.execute("SELECT pg_advisory_lock(4282183, 7)")  # a serial key's run lock
    return instance, holder


@pytest.mark.django_db(transaction=True)
def test_a_leader_elected_after_an_outage_takes_no_live_worker_for_dead_within_the_staleness(
    settings: Any,
) -> None:
    """After a database restart or an outage every worker's runtime row and heartbeats are
    stale only because none could reach the database. A leader elected then that terminated
    their sessions at once handed their serial keys to other jobs while their handlers still
    ran (found by the chaos soak). For the staleness bound it reaps no session and rescues no
    attempt for a stale heartbeat; a passed deadline it rescues at once. A leader elected
    without an outage (a deploy's new process) holds back nothing."""
    with pg() as conn:
        [(stale, _)] = enqueue_sql(conn, json.dumps([{"kind": "k", "queue": "hb"}]))
        storage.claim(conn, "hb", 1, WORKER)
        conn.execute("UPDATE awa.claims SET claimed_at = now() - interval '2 hours'")
        [(late, _)] = enqueue_sql(
            conn, json.dumps([{"kind": "k", "queue": "dl", "deadline": 0.01, "max_attempts": 1}])
        )
        storage.claim(conn, "dl", 1, WORKER)
        conn.execute("SELECT pg_sleep(0.05)")

        async def deploy() -> bool:
            fresh = _maintenance()
            try:
                await fresh._elect()
                return fresh.leader and fresh.settled()
            finally:
                await fresh.link.close()

        settings.AWA = {**settings.AWA, **QUICK_STALENESS}
        assert asyncio.run(deploy())
        _, holder = _stale_holder(conn)
        with holder:
            _aged(conn, holder, 0.5)

            async def scenario() -> tuple[bool, dict[str, int], dict[str, int]]:
                m = _maintenance()
                try:
                    # An outage: the connection is gone; the next election notices it and
                    # the one after elects this process.
                    backend = (await m.link.connection()).info.backend_pid
                    conn.execute("SELECT pg_terminate_backend(%s)", [backend])
                    await m._elect()
                    await m._elect()
                    link = await m.link.connection()
                    await m._rescue(link)
                    early = dict(m.counters)
                    m.held_back_until = 0.0  # the staleness bound has passed
                    await m._rescue(link)
                    return m.leader, early, dict(m.counters)
                finally:
                    await m.link.close()

            elected, early, settled = asyncio.run(scenario())
            assert elected
            assert (early.get("rescued"), early.get("permits_reaped")) == (1, None)
            assert (settled.get("rescued"), settled.get("permits_reaped")) == (2, 1)
            with pytest.raises(psycopg.OperationalError):
                holder.execute("SELECT 1")
        states = {job: job_state(conn, job)["state"] for job in (stale, late)}  # type: ignore[index]
        assert states == {stale: "retryable", late: "failed"}


@pytest.mark.django_db(transaction=True)
def test_a_leader_holds_back_after_a_database_restart_only_while_older_processes_may_live(
    settings: Any,
) -> None:
    """A database restart ends every session, also of a process that just starts and never
    saw the outage: a leader then holds back after the database's start, but only while a
    process seen before that start may still live. A database that started empty holds
    nothing back, and ``awa_maintenance --once`` (from cron) reaps a frozen worker's session as
    a long-running leader does, but never a session opened within the staleness bound (a
    worker that reconnected, its runtime row not refreshed yet)."""
    settings.AWA = {**settings.AWA, **QUICK_STALENESS}
    m = _maintenance()
    hold = m.settings.outage_hold_back
    with pg() as conn:
        grace = "SELECT awa.leader_grace_v1(%s)"
        assert conn.execute(grace, [1e6]).fetchone() == (0.0,)
        conn.execute(
            "INSERT INTO awa.runtime_instances (instance_id, hostname, pid, last_seen_at) "
            "VALUES (gen_random_uuid(), 'h', 1, pg_postmaster_start_time() - interval '1 s')"
        )
        row = conn.execute(grace, [1e6]).fetchone()
        assert row is not None and 0 < row[0] < 1e6
        conn.execute("DELETE FROM awa.runtime_instances")
        wait_for(
            lambda: (
                conn.execute(
                    "SELECT now() - pg_postmaster_start_time() > make_interval(secs => %s)",
                    [hold],
                ).fetchone()
                == (True,)
            ),
            timeout=hold + 5,
            message="the database to be up for the hold-back after a restart",
        )
        _, holder = _stale_holder(conn)
        with holder:
            asyncio.run(m.run_once())
            assert m.counters.get("permits_reaped") is None  # a young session
            _aged(conn, holder, m.settings.leader_staleness)
            asyncio.run(m.run_once())
            assert m.counters.get("permits_reaped") == 1
            with pytest.raises(psycopg.OperationalError):
                holder.execute("SELECT 1")


@pytest.mark.django_db(transaction=True)
def test_an_elected_leader_refreshes_its_stale_runtime_row() -> None:
    """After an outage longer than the staleness bound, a worker elected leader still has a
    stale runtime row until its refresh comes round, and other processes ended it as a frozen
    leader: leadership thrashed (10 elections in 2.2 s). The election refreshes the row."""
    m = _maintenance()
    with pg() as conn:
        conn.execute(
            "INSERT INTO awa.runtime_instances (instance_id, hostname, pid, last_seen_at) "
            "VALUES (%s, 'h', 1, now() - interval '1 hour')",
            [m.instance_id],
        )

        async def elect() -> bool:
            try:
                await m._elect()
                return m.leader
            finally:
                await m.link.close()

        assert asyncio.run(elect())
        row = conn.execute(
            "SELECT is_leader, now() - last_seen_at < interval '1 minute' "
            "FROM awa.runtime_instances WHERE instance_id = %s",
            [m.instance_id],
        ).fetchone()
        assert row == (True, True)


def test_only_lost_connections_count_as_lost_connections() -> None:
    assert not is_connection_lost(errors.LockNotAvailable("lock timeout"), None)
    assert not is_connection_lost(errors.DeadlockDetected("deadlock"), None)
    assert not is_connection_lost(errors.QueryCanceled("statement timeout"), None)
    assert not is_connection_lost(errors.SerializationFailure("serialization"), None)
    assert is_connection_lost(errors.AdminShutdown("terminating connection"), None)
    assert is_connection_lost(psycopg.OperationalError("connection failed"), None)
    assert is_connection_lost(psycopg.InterfaceError("the connection is closed"), None)


@pytest.mark.django_db(transaction=True)
def test_the_batcher_fails_only_an_item_the_database_refuses_and_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with pg() as conn:
        ids = [i for i, _ in enqueue_sql(conn, json.dumps([{"kind": "k", "queue": "b"}] * 5))]
        claimed = storage.claim(conn, "b", 5, WORKER)

    async def scenario() -> None:
        link = Link("default", "finalize", "test")
        batcher = CompletionBatcher(link, batch_size=512, flush_interval=0.01)
        task = asyncio.create_task(batcher.run())
        for c in claimed:
            # One item the database refuses (an unbounded delay built past every Python check).
            delay = 1e300 if c.job_id == ids[2] else None
            outcome = "retry" if delay else "completed"
            batcher.add(Finalization(c.job_id, c.run_lease, c.claim_slot, outcome, delay=delay))
        await batcher.drain()
        assert not task.done()
        batcher.close()
        await task
        await link.close()

    with caplog.at_level(logging.WARNING, "awa_django.worker"):
        asyncio.run(scenario())
    states = jobs(*ids)
    assert [states[i]["state"] for i in ids] == [
        "completed",
        "completed",
        "failed",
        "completed",
        "completed",
    ]
    assert "could not be written" in last_error(states[ids[2]])["message"]
    assert str(ids[2]) in caplog.text


# Handlers and processes that defeat the worker --------------------------------------------------


@pytest.mark.worker
def test_a_transaction_left_open_by_a_handler_fails_it_and_the_next_job_starts_clean(
    manage_py: Start,
) -> None:
    leaky = testjobs.leaves_transaction_open.enqueue()
    innocents = [testjobs.innocent.enqueue() for _ in range(5)]
    proc = worker(manage_py, "--queue", "leaky=1")
    ids = [leaky.id, *(h.id for h in innocents)]
    wait_for(lambda: settled(*ids), timeout=30, message=lambda: f"{jobs(*ids)}\n{proc.output()}")
    states = jobs(*ids)
    assert (states[leaky.id]["state"], last_error(states[leaky.id])["type"]) == (
        "failed",
        "awa_django.exceptions.TransactionLeftOpen",
    )
    # Its uncommitted write was rolled back; every job after it on the same thread succeeded.
    assert not Ledger.objects.filter(job_id=leaky.id).exists()
    assert {states[h.id]["state"] for h in innocents} == {"completed"}
    assert stop(proc) == 0, proc.output()


@pytest.mark.worker
def test_a_frozen_leader_is_replaced_and_maintenance_goes_on(manage_py: Start) -> None:
    def leader_pid() -> Any:
        with pg() as conn:
            row = conn.execute("SELECT pid FROM awa.runtime_instances WHERE is_leader").fetchone()
        return None if row is None else row[0]

    a = worker(manage_py, "--queue", "work")
    wait_for(lambda: leader_pid() == a.pid, timeout=20, message=lambda: a.output())
    b = worker(manage_py, "--queue", "work")
    wait_for(lambda: len(jobs_running_instances()) == 2, timeout=20, message=lambda: b.output())
    a.send_signal(signal.SIGSTOP)
    try:
        from datetime import timedelta

        due = testjobs.ledger_sync.using(run_after=timedelta(seconds=0.5)).enqueue(7)
        # Promotion needs a leader: b takes over once a's runtime row is stale.
        wait_for(lambda: settled(due.id), timeout=30, message=lambda: b.output())
        assert leader_pid() == b.pid
        assert "its connection was terminated so that a live process takes over" in b.output()
    finally:
        a.send_signal(signal.SIGCONT)
    wait_for(lambda: "lost leadership" in a.output(), timeout=20, message=lambda: a.output())
    assert stop(a) == 0 and stop(b) == 0


def jobs_running_instances() -> list[int]:
    with pg() as conn:
        return [r[0] for r in conn.execute("SELECT pid FROM awa.runtime_instances")]


@pytest.mark.worker
def test_more_stuck_sync_handlers_than_slots_restart_the_worker(manage_py: Start) -> None:
    stuck = [testjobs.stuck_sync.enqueue() for _ in range(3)]
    proc = worker(
        manage_py,
        "--queue",
        "stuck=1",
        overrides={"QUEUES": {"stuck": {"deadline": 0.5}}, "ABANDON_AFTER": 0.3},
    )
    assert proc.wait(30) == 75, proc.output()
    assert "are stuck after being told to stop" in proc.output()
    assert Ledger.objects.filter(job_id__in=[h.id for h in stuck]).count() >= 2


@pytest.mark.worker
def test_an_abandoned_sync_handler_that_returns_later_still_records_its_outcome(
    manage_py: Start,
) -> None:
    slow = testjobs.slow_first.enqueue()  # sleeps 3 s on attempt 1, ignoring cancellation
    proc = worker(
        manage_py,
        "--queue",
        "stop=1",
        "--no-maintenance",  # nobody rescues it: the late result is what settles the job
        overrides={"QUEUES": {"stop": {"deadline": 0.5}}, "ABANDON_AFTER": 0.3},
    )
    wait_for(lambda: settled(slow.id), timeout=20, message=lambda: proc.output())
    job = jobs(slow.id)[slow.id]
    assert (job["state"], job["attempt"], job["result"]) == ("completed", 1, "first")
    assert "abandoned" in proc.output()
    assert stop(proc) == 0, proc.output()


@pytest.mark.worker
@pytest.mark.slow
def test_an_async_handler_blocking_the_event_loop_ends_the_process(manage_py: Start) -> None:
    handle = testjobs.blocks_the_loop.enqueue(60)
    proc = worker(manage_py, "--queue", "blocker")
    wait_for(
        lambda: Ledger.objects.filter(job_id=handle.id).exists(),
        timeout=15,
        message=lambda: proc.output(),
    )
    # A loop blocked longer than HEARTBEAT_STALENESS (2 s here), and at least 10 s, exits 70.
    assert proc.wait(25) == 70, proc.output()
    assert "the event loop has not run for" in proc.output()
    assert "blocks_the_loop" in proc.output()  # the log names the blocking code


@pytest.mark.worker
def test_a_second_signal_exits_at_once_even_while_a_handler_blocks_the_loop(
    manage_py: Start,
) -> None:
    handle = testjobs.blocks_the_loop.enqueue(60)
    proc = worker(manage_py, "--queue", "blocker", overrides={"HEARTBEAT_STALENESS": 120.0})
    wait_for(
        lambda: Ledger.objects.filter(job_id=handle.id).exists(),
        timeout=15,
        message=lambda: proc.output(),
    )

    # Signals that arrive together are one signal to Python: keep signalling until it leaves.
    def signalled_and_gone() -> bool:
        if proc.proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        return proc.proc.poll() is not None

    wait_for(signalled_and_gone, timeout=5, interval=0.2, message=lambda: proc.output())
    assert proc.wait(1) == 128 + signal.SIGTERM, proc.output()


@pytest.mark.worker
@pytest.mark.parametrize("how", ["system_exit", "stop"])
def test_handler_code_that_ends_the_event_loop_exits_70_and_says_so(
    manage_py: Start, how: str
) -> None:
    testjobs.ends_the_loop.enqueue(how)
    proc = worker(manage_py, "--queue", "blocker")
    assert proc.wait(20) == 70, proc.output()
    assert "CRITICAL" in proc.output()


@pytest.mark.worker
@pytest.mark.slow
def test_the_supervisor_kills_a_child_that_will_not_stop(manage_py: Start) -> None:
    proc = worker(
        manage_py, "--queue", "work", "--processes", "2", overrides={"SHUTDOWN_TIMEOUT": 0.5}
    )
    wait_for(lambda: len(jobs_running_instances()) == 2, timeout=20, message=proc.output)
    frozen = jobs_running_instances()[0]
    import os

    os.kill(frozen, signal.SIGSTOP)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 1, proc.output()
    assert "did not stop within" in proc.output()


@pytest.mark.worker
def test_workers_do_not_outlive_a_killed_supervisor(manage_py: Start) -> None:
    import os

    proc = worker(manage_py, "--queue", "work", "--processes", "2")
    wait_for(lambda: len(jobs_running_instances()) == 2, timeout=20, message=proc.output)
    children = jobs_running_instances()
    with open(f"/proc/{children[0]}/environ", "rb") as environ:
        family = dict(item.split(b"=", 1) for item in environ.read().split(b"\0") if b"=" in item)[
            b"AWA_WORKER_FAMILY"
        ].decode()
    assert os.path.exists(family)
    proc.send_signal(signal.SIGKILL)

    def gone(pid: int) -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        with open(f"/proc/{pid}/stat") as stat:  # a zombie counts as gone
            return stat.read().split(") ")[-1].startswith("Z")

    wait_for(lambda: all(gone(p) for p in children), timeout=20, message="the children to exit")
    # The supervisor never removed the family's lock file: its last children did.
    assert not os.path.exists(family)


# A database replaced under a running worker ------------------------------------------------------


@pytest.mark.worker
def test_a_worker_whose_database_is_recreated_exits_70_before_touching_it(
    manage_py: Start,
) -> None:
    """Ids start over in a recreated database: nothing a worker holds about the old one (open
    attempts, batched outcomes, lanes) may reach it, so the first reconnect ends the process."""
    import os
    from urllib.parse import urlsplit, urlunsplit

    server = os.environ.get("AWA_TEST_DIRECT_URL") or os.environ["DATABASE_URL"]
    scratch = "awa_replaced_" + uuid.uuid4().hex[:8]
    url = urlunsplit(urlsplit(server)._replace(path=f"/{scratch}"))
    with pg() as admin:
        admin.execute(f'CREATE DATABASE "{scratch}"')
    try:
        migrate = manage_py("migrate", "-v", "0", extra_env={"DATABASE_URL": url})
        assert migrate.wait(120) == 0, migrate.output()
        proc = manage_py("awa_worker", "--queue", "default", extra_env={"DATABASE_URL": url})
        with psycopg.connect(url, autocommit=True) as conn:
            wait_for(
                lambda: (
                    conn.execute("SELECT count(*) FROM awa.runtime_instances").fetchone() == (1,)
                ),
                timeout=20,
                message=lambda: proc.output(),
            )
        with pg() as admin:
            admin.execute(f'DROP DATABASE "{scratch}" WITH (FORCE)')
            admin.execute(f'CREATE DATABASE "{scratch}"')
        assert proc.wait(30) == 70, proc.output()
        assert "is not the one this process first connected to" in proc.output()
    finally:
        with pg() as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{scratch}" WITH (FORCE)')


@pytest.mark.django_db(transaction=True)
def test_a_schedule_sync_that_keeps_failing_is_logged_once_a_minute(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sync is retried at every election while the database is out of reach (twice a
    second in a compressed setup): it is retried each time, and said once a minute."""

    async def unreachable(conn: Any) -> None:
        raise psycopg.OperationalError("connection failed")

    monkeypatch.setattr("awa_django.maintenance.leader.sync_schedules", unreachable)

    async def scenario() -> bool:
        m = _maintenance()
        try:
            for _ in range(3):
                await m.sync()
            return m.synced
        finally:
            await m.link.close()

    with caplog.at_level(logging.WARNING, "awa_django.maintenance"):
        assert asyncio.run(scenario()) is False
    assert caplog.text.count("could not sync periodic schedules") == 1
