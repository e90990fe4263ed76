"""Maintenance: leader election, rescue, promotion, rotation and truncate-only prune, retention,
and dead tuples under a pinned MVCC horizon. Real subprocesses and real Postgres."""

from __future__ import annotations

import json
import signal
import time
from typing import Any

import psycopg
import pytest

from awa_django.db import storage
from awa_django.db.storage import Finalization
from awa_django.sql import RING_SLOTS
from tests.jobs import common as testjobs
from tests.support.awa_schema import job_state
from tests.support.database import pg
from tests.support.factories import WORKER, enqueue_sql
from tests.support.polling import wait_for
from tests.support.workers import Start, worker
from tests.testapp.models import Ledger

pytestmark = [pytest.mark.usefixtures("clean_awa")]


def scalar(sql: str, *params: Any) -> Any:
    with pg() as conn:
        row = conn.execute(sql, list(params)).fetchone()
    return None if row is None else row[0]


# Leader election and rescue (subprocesses) -------------------------------------------------------


@pytest.mark.worker
def test_one_leader_and_failover_when_it_dies(manage_py: Start) -> None:
    a = worker(manage_py, "--queue", "work")
    wait_for(
        lambda: scalar("SELECT count(*) FROM awa.runtime_instances WHERE is_leader") == 1,
        timeout=20,
        message=lambda: f"a leader; output:\n{a.output()}",
    )
    b = worker(manage_py, "--queue", "work")
    wait_for(
        lambda: scalar("SELECT count(*) FROM awa.runtime_instances") == 2,
        timeout=20,
        message="both runtime rows",
    )
    assert scalar("SELECT pid FROM awa.runtime_instances WHERE is_leader") == a.pid
    a.proc.send_signal(signal.SIGKILL)
    wait_for(
        lambda: scalar("SELECT pid FROM awa.runtime_instances WHERE is_leader") == b.pid,
        timeout=20,
        message=lambda: f"the survivor to lead; output:\n{b.output()}",
    )
    # The new leader works from durable state: a scheduled job is promoted and run.
    job = testjobs.ledger_sync.using(
        run_after=__import__("datetime").timedelta(seconds=0.3)
    ).enqueue(5)
    wait_for(
        lambda: scalar("SELECT state FROM awa.jobs WHERE id = %s", job.id) == "completed",
        timeout=20,
        message=lambda: f"the promoted job to run; output:\n{b.output()}",
    )
    b.proc.send_signal(signal.SIGTERM)
    wait_for(lambda: b.proc.poll() is not None, timeout=20, message="b to exit")


@pytest.mark.worker
def test_sigkill_worker_jobs_are_rescued_and_completed_by_another(manage_py: Start) -> None:
    staleness, rescue, poll = 2.0, 0.2, 0.05
    jobs = [testjobs.hang_first.enqueue().id for _ in range(24)]
    victim = worker(manage_py, "--queue", "hang=32", "--no-maintenance")
    wait_for(
        lambda: scalar("SELECT count(*) FROM awa.jobs WHERE state = 'running'") == 24,
        timeout=30,
        message=lambda: f"24 running jobs; output:\n{victim.output()}",
    )
    wait_for(
        lambda: scalar("SELECT count(*) FROM awa.attempt_state") == 24,
        timeout=10,
        message="heartbeats of all 24",
    )
    victim.proc.send_signal(signal.SIGKILL)
    victim.proc.wait(10)
    killed_at = time.monotonic()
    survivor = worker(manage_py, "--queue", "hang=32")
    wait_for(
        lambda: (
            scalar("SELECT count(*) FROM awa.jobs WHERE id = ANY(%s) AND state = 'completed'", jobs)
            == 24
        ),
        timeout=staleness + rescue + poll + 2.0 + 5.0,  # + start-up of the survivor
        message=lambda: f"all rescued and completed; output:\n{survivor.output()}",
    )
    elapsed = time.monotonic() - killed_at
    assert elapsed < staleness + rescue + poll + 2.0 + 5.0
    # None lost, each completed once; every extra execution matches a recorded rescue.
    for job_id in jobs:
        runs = list(
            Ledger.objects.filter(job_id=job_id)
            .order_by("run_lease")
            .values_list("run_lease", flat=True)
        )
        assert runs == [1, 2], (job_id, runs)
    rescued = scalar(
        "SELECT count(*) FROM awa.claim_closures WHERE outcome = 'rescued' "
        "AND job_id = ANY(%s) AND run_lease = 1",
        jobs,
    )
    assert rescued == 24
    state = scalar("SELECT errors FROM awa.jobs WHERE id = %s", jobs[0])
    assert state[0]["message"] == "heartbeat stale: worker presumed dead"
    survivor.proc.send_signal(signal.SIGTERM)
    wait_for(lambda: survivor.proc.poll() is not None, timeout=20, message="survivor exit")


@pytest.mark.worker
def test_sigstopped_worker_loses_to_the_rescue(manage_py: Start) -> None:
    job = testjobs.slow_first.enqueue().id
    first = worker(manage_py, "--queue", "stop", "--no-maintenance")
    wait_for(
        lambda: scalar("SELECT state FROM awa.jobs WHERE id = %s", job) == "running",
        timeout=20,
        message=lambda: f"the job to run; output:\n{first.output()}",
    )
    first.proc.send_signal(signal.SIGSTOP)
    try:
        second = worker(manage_py, "--queue", "stop")
        wait_for(
            lambda: scalar("SELECT state FROM awa.jobs WHERE id = %s", job) == "completed",
            timeout=30,
            message=lambda: f"rescue and completion; output:\n{second.output()}",
        )
        assert scalar("SELECT result FROM awa.jobs WHERE id = %s", job) == "second"
    finally:
        first.proc.send_signal(signal.SIGCONT)
    wait_for(
        lambda: "stale finalization" in first.output(),
        timeout=20,
        message=lambda: f"the first worker's late completion to be refused:\n{first.output()}",
    )
    assert scalar("SELECT result FROM awa.jobs WHERE id = %s", job) == "second"
    assert scalar("SELECT run_lease FROM awa.jobs WHERE id = %s", job) == 2
    assert sorted(Ledger.objects.filter(job_id=job).values_list("run_lease", flat=True)) == [1, 2]


@pytest.mark.worker
def test_leader_killed_during_promotion_loses_no_job_and_doubles_none(manage_py: Start) -> None:
    with pg() as conn:
        ids = [
            i
            for i, _ in enqueue_sql(
                conn,
                json.dumps(
                    [{"kind": "k", "queue": "backlog", "delay": 3600} for _ in range(30_000)]
                ),
            )
        ]
        conn.execute("UPDATE awa.deferred_jobs SET run_at = now() - interval '1 second'")
    # Nobody serves "backlog": promoted jobs stay available, so promotion alone is observed.
    a = worker(manage_py, "--queue", "work")
    wait_for(
        lambda: scalar("SELECT count(*) FROM awa.ready_entries WHERE queue = 'backlog'") > 0,
        timeout=30,
        interval=0.01,
        message=lambda: f"promotion to start:\n{a.output()}",
    )
    a.proc.send_signal(signal.SIGKILL)
    a.proc.wait(10)
    b = worker(manage_py, "--queue", "work")
    wait_for(
        lambda: scalar("SELECT count(*) FROM awa.deferred_jobs") == 0,
        timeout=60,
        message=lambda: f"the new leader to promote the rest:\n{b.output()}",
    )
    with pg() as conn:
        row = conn.execute(
            "SELECT count(*), count(DISTINCT job_id) FROM awa.ready_entries WHERE queue = 'backlog'"
        ).fetchone()
        states = conn.execute(
            "SELECT state, count(*) FROM awa.jobs WHERE id = ANY(%s) GROUP BY state", [ids]
        ).fetchall()
    assert row == (30_000, 30_000)
    assert states == [("available", 30_000)]
    b.proc.send_signal(signal.SIGTERM)
    wait_for(lambda: b.proc.poll() is not None, timeout=20, message="exit")


@pytest.mark.worker
def test_awa_maintenance_once_promotes_and_exits(manage_py: Start) -> None:
    job = testjobs.ledger_sync.using(run_after=__import__("datetime").timedelta(hours=1)).enqueue(1)
    with pg() as conn:
        conn.execute("UPDATE awa.deferred_jobs SET run_at = now() - interval '1 second'")
    proc = manage_py("awa_maintenance", "--once")
    wait_for(lambda: proc.proc.poll() is not None, timeout=30, message="awa_maintenance --once")
    assert proc.proc.returncode == 0, proc.output()
    assert scalar("SELECT state FROM awa.jobs WHERE id = %s", job.id) == "available"
    assert scalar("SELECT count(*) FROM awa.runtime_instances") == 0


@pytest.mark.worker
def test_awa_maintenance_process_is_a_visible_leader(manage_py: Start) -> None:
    proc = manage_py("awa_maintenance")
    wait_for(
        lambda: scalar("SELECT pid FROM awa.runtime_instances WHERE is_leader") == proc.pid,
        timeout=20,
        message=lambda: f"the maintenance process to lead:\n{proc.output()}",
    )
    proc.send_signal(signal.SIGTERM)
    wait_for(lambda: proc.proc.poll() is not None, timeout=20, message="exit")
    assert proc.proc.returncode == 0, proc.output()
    assert scalar("SELECT count(*) FROM awa.runtime_instances") == 0


# Rotation and prune (SQL-level, deterministic) ---------------------------------------------------


def jobs_json(n: int, queue: str = "ring") -> str:
    return json.dumps([{"kind": "k", "queue": queue} for _ in range(n)])


def run_through(conn: psycopg.Connection[Any], queue: str = "ring") -> None:
    """Enqueue, claim and complete one filler job (so the current slots are not empty)."""
    enqueue_sql(conn, jobs_json(1, queue))
    claimed = storage.claim(conn, queue, 1, WORKER)
    storage.finalize(
        conn, [Finalization(c.job_id, c.run_lease, c.claim_slot, "completed") for c in claimed]
    )


def rotate_until(conn: psycopg.Connection[Any], ring: str, slot: int) -> None:
    for _ in range(40):
        current = conn.execute(
            "SELECT current_slot FROM awa.ring_state WHERE ring = %s", [ring]
        ).fetchone()
        if current == (slot,):
            return
        run_through(conn)
        conn.execute("SELECT awa.prune_v1(%s)", [ring])
        assert conn.execute("SELECT awa.rotate_v2(%s)", [ring]).fetchone() == ("rotated",)
    raise AssertionError(f"{ring} ring never reached slot {slot}")


@pytest.mark.storage
@pytest.mark.django_db(transaction=True)
def test_queue_prune_never_truncates_live_work() -> None:
    with pg() as conn:
        [(job, _)] = enqueue_sql(conn, jobs_json(1, "live"))  # unclaimed, in queue slot 0
        rotate_until(conn, "queue", RING_SLOTS["queue"] - 1)  # slot 0: the oldest sealed slot
        assert conn.execute("SELECT awa.prune_v1('queue')").fetchone() == (
            "skipped_busy: available job not yet claimed",
        )
        [claimed] = storage.claim(conn, "live", 1, WORKER)
        assert conn.execute("SELECT awa.prune_v1('queue')").fetchone() == (
            "skipped_busy: open attempt of a job in this slot",
        )
        assert conn.execute("SELECT awa.rotate_v2('queue')").fetchone() == ("skipped_busy",)
        assert job_state(conn, job)["state"] == "running"  # type: ignore[index]
        storage.finalize(
            conn, [Finalization(job, claimed.run_lease, claimed.claim_slot, "completed")]
        )
        assert conn.execute("SELECT awa.prune_v1('queue')").fetchone() == ("pruned",)
        assert job_state(conn, job) is None  # its history aged out with the slot
        assert conn.execute("SELECT count(*) FROM awa.ready_entries_0").fetchone() == (0,)
        assert conn.execute("SELECT awa.rotate_v2('queue')").fetchone() == ("skipped_idle",)
        run_through(conn)
        assert conn.execute("SELECT awa.rotate_v2('queue')").fetchone() == ("rotated",)
        outcomes = [
            r[0]
            for r in conn.execute(
                "SELECT outcome FROM awa.ring_prunes WHERE ring = 'queue' ORDER BY pruned_at"
            )
        ]
        assert outcomes[-1] == "pruned"


@pytest.mark.storage
@pytest.mark.django_db(transaction=True)
def test_claim_prune_carries_long_attempts_forward_and_keeps_the_cursor() -> None:
    with pg() as conn:
        enqueue_sql(conn, jobs_json(3, "long"))
        [held] = storage.claim(conn, "long", 1, WORKER)  # stays open in claim slot 0
        assert held.claim_slot == 0
        rotate_until(conn, "claim", 7)
        assert conn.execute("SELECT awa.prune_v1('claim')").fetchone() == ("pruned",)
        assert conn.execute("SELECT count(*) FROM awa.claims_0").fetchone() == (0,)
        # The attempt lives on in the current slot, still running, and still claimable only once.
        assert job_state(conn, held.job_id)["state"] == "running"  # type: ignore[index]
        rest = storage.claim(conn, "long", 10, WORKER)
        assert [c.job_id for c in rest] == [held.job_id + 1, held.job_id + 2]
        # Its worker's finalization (with the old slot) still lands, not reported stale.
        assert (
            storage.finalize(conn, [Finalization(held.job_id, held.run_lease, 0, "completed")])
            == []
        )
        assert job_state(conn, held.job_id)["state"] == "completed"  # type: ignore[index]
        # The carried claim kept the job's kind, and the terminal row names it (history by kind).
        assert conn.execute(
            "SELECT kind FROM awa.done_entries WHERE job_id = %s", [held.job_id]
        ).fetchone() == ("k",)
        # Consumed rows are never handed out again, and no control row was updated for it.
        assert storage.claim(conn, "long", 10, WORKER) == []
        assert conn.execute("SELECT count(*) FROM awa.lane_floors").fetchone() == (0,)


@pytest.mark.storage
@pytest.mark.django_db(transaction=True)
def test_lease_prune_refuses_an_open_lease() -> None:
    with pg() as conn:
        enqueue_sql(conn, jobs_json(1, "cb"))
        [c] = storage.claim(conn, "cb", 1, WORKER)

        def lease(job_id: int, lease_: int, claim_slot: int) -> None:
            conn.execute(
                "INSERT INTO awa.leases (lease_slot, lease_generation, job_id, run_lease, "
                "claim_slot, state) SELECT current_slot, generation, %s, %s, %s, "
                "'waiting_external' FROM awa.ring_state WHERE ring = 'lease'",
                [job_id, lease_, claim_slot],
            )

        lease(c.job_id, c.run_lease, c.claim_slot)  # a waiting attempt in lease slot 0
        assert job_state(conn, c.job_id)["state"] == "waiting_external"  # type: ignore[index]
        for _ in range(7):
            lease(-1, 0, 0)  # a dead lease (no open claim), so the ring has something to seal
            assert conn.execute("SELECT awa.rotate_v2('lease')").fetchone() == ("rotated",)
        assert conn.execute("SELECT awa.prune_v1('lease')").fetchone() == (
            "skipped_busy: open lease",
        )
        storage.finalize(conn, [Finalization(c.job_id, c.run_lease, c.claim_slot, "completed")])
        assert conn.execute("SELECT awa.prune_v1('lease')").fetchone() == ("pruned",)


@pytest.mark.storage
@pytest.mark.django_db(transaction=True)
def test_prune_gives_up_quickly_when_a_reader_holds_the_slot() -> None:
    with pg() as conn, pg(autocommit=False) as reader:
        rotate_until(conn, "claim", 7)
        reader.execute("SELECT count(*) FROM awa.claims_0")  # holds ACCESS SHARE on slot 0
        started = time.monotonic()
        assert conn.execute("SELECT awa.prune_v1('claim', 50)").fetchone() == ("blocked_lock",)
        assert time.monotonic() - started < 5
        reader.rollback()
        assert conn.execute("SELECT awa.prune_v1('claim', 50)").fetchone() == ("pruned",)


@pytest.mark.storage
@pytest.mark.django_db(transaction=True)
def test_idle_ring_stops_rotating() -> None:
    with pg() as conn:
        assert conn.execute("SELECT awa.rotate_v2('claim')").fetchone() == ("skipped_idle",)
        run_through(conn)
        assert conn.execute("SELECT awa.rotate_v2('claim')").fetchone() == ("rotated",)
        assert conn.execute("SELECT awa.rotate_v2('claim')").fetchone() == ("skipped_idle",)


@pytest.mark.storage
@pytest.mark.django_db(transaction=True)
def test_a_claim_ring_holding_only_cursor_markers_stops_rotating() -> None:
    """The markers a claim-ring rotation appends do not make the new slot busy: with no claim
    since, the next rotation is skipped as idle (it used to rotate for ever, appending a
    marker per lane every CLAIM_ROTATE_INTERVAL)."""
    with pg() as conn:
        run_through(conn)
        assert conn.execute("SELECT awa.rotate_v3('claim')").fetchone() == ("rotated",)
        markers = conn.execute(
            "SELECT count(*) FROM awa.claims c JOIN awa.ring_state s ON s.ring = 'claim'"
            " WHERE c.claim_slot = s.current_slot AND c.job_id < 0"
        ).fetchone()
        assert markers is not None and markers[0] > 0
        assert conn.execute("SELECT awa.rotate_v3('claim')").fetchone() == ("skipped_idle",)
        run_through(conn)
        assert conn.execute("SELECT awa.rotate_v3('claim')").fetchone() == ("rotated",)


@pytest.mark.storage
@pytest.mark.django_db(transaction=True)
def test_rescue_closes_first_and_the_late_completion_loses() -> None:
    with pg() as conn:
        [(job, _)] = enqueue_sql(conn, jobs_json(1, "resc"))
        [c] = storage.claim(conn, "resc", 1, WORKER)
        assert conn.execute("SELECT count(*) FROM awa.rescue_v1(3600)").fetchone() == (0,)
        conn.execute("UPDATE awa.claims SET claimed_at = now() - interval '2 hours'")
        rows = conn.execute(
            "SELECT job_id, run_lease, reason FROM awa.rescue_v1(3600, 10, 0.01)"
        ).fetchall()
        assert rows == [(job, 1, "heartbeat stale: worker presumed dead")]
        assert job_state(conn, job)["state"] == "retryable"  # type: ignore[index]
        assert storage.finalize(
            conn, [Finalization(job, c.run_lease, c.claim_slot, "completed")]
        ) == [(job, c.run_lease)]
        assert job_state(conn, job)["state"] == "retryable"  # type: ignore[index]


@pytest.mark.storage
@pytest.mark.django_db(transaction=True)
def test_deadline_rescue() -> None:
    with pg() as conn:
        [(job, _)] = enqueue_sql(
            conn, json.dumps([{"kind": "k", "queue": "dl", "deadline": 0.01, "max_attempts": 1}])
        )
        storage.claim(conn, "dl", 1, WORKER)
        conn.execute("SELECT pg_sleep(0.05)")
        rows = conn.execute("SELECT reason FROM awa.rescue_v1(3600)").fetchall()
        assert rows == [("hard deadline exceeded",)]
        state = job_state(conn, job)
        assert state is not None and (state["state"], state["in_dlq"]) == ("failed", True)


@pytest.mark.storage
@pytest.mark.django_db(transaction=True)
def test_retention_of_dlq_and_runtime_rows() -> None:
    with pg() as conn:
        [(job, _)] = enqueue_sql(conn, jobs_json(1, "ret"))
        [c] = storage.claim(conn, "ret", 1, WORKER)
        storage.finalize(conn, [Finalization(job, c.run_lease, c.claim_slot, "fail")])
        conn.execute("SELECT awa.runtime_upsert_v1(gen_random_uuid(), 'h', 1, '{}', 1, 'x')")
        assert conn.execute("SELECT awa.dlq_expire_v1(3600)").fetchone() == (0,)
        conn.execute("UPDATE awa.dlq_entries SET dlq_at = now() - interval '2 hours'")
        conn.execute("UPDATE awa.runtime_instances SET last_seen_at = now() - interval '2 hours'")
        assert conn.execute("SELECT awa.dlq_expire_v1(3600)").fetchone() == (1,)
        assert conn.execute("SELECT awa.cleanup_v1(3600)").fetchone() == (1,)
        assert conn.execute("SELECT count(*) FROM awa.runtime_instances").fetchone() == (0,)


# Dead tuples under a pinned MVCC horizon ---------------------------------------------------------


def ring_bytes(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute(
        "SELECT sum(pg_total_relation_size(c.oid)) FROM pg_class c "
        "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'awa' "
        "AND c.relkind = 'r' AND c.relispartition"
    ).fetchone()
    return int(row[0]) if row and row[0] else 0


def prune_past_transient_locks(conn: psycopg.Connection[Any], ring: str) -> str:
    """``prune_v1`` once, again while a lock it needs was held for longer than its lock timeout.

    Autovacuum, started on a partition that 50,000 jobs went through, holds a lock that the
    prune's ACCESS EXCLUSIVE waits for; the prune gives up after 50 ms ('blocked_lock') and the
    maintenance leader tries again on its next pass. This does the same, within a deadline.
    """
    outcome = ""

    def settled() -> bool:
        nonlocal outcome
        [(outcome,)] = conn.execute("SELECT awa.prune_v1(%s)", [ring]).fetchall()
        return outcome not in ("blocked_lock", "skipped_locked")

    wait_for(settled, timeout=60, interval=0.2, message=lambda: f"a {ring} prune ({outcome})")
    return outcome


@pytest.mark.storage
@pytest.mark.django_db(transaction=True)
def test_dead_tuples_stay_bounded_under_a_pinned_horizon() -> None:
    with pg() as conn, pg(autocommit=False) as pin:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pgstattuple")
        run_through(conn, "pinned")  # lanes exist before the pin
        pin.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        pin.execute("SELECT txid_current()")  # an xid: the horizon is pinned from here on
        for _ in range(25):
            enqueue_sql(conn, jobs_json(2000, "pinned"))
            while claimed := storage.claim(conn, "pinned", 512, WORKER):
                storage.finalize(
                    conn,
                    [
                        Finalization(c.job_id, c.run_lease, c.claim_slot, "completed")
                        for c in claimed
                    ],
                )
        assert conn.execute(
            "SELECT count(*) FROM awa.jobs WHERE queue = 'pinned' AND state = 'completed'"
        ).fetchone() == (50_001,)
        dead = dict(
            conn.execute(
                "SELECT c.relname, (pgstattuple(c.oid)).dead_tuple_count FROM pg_class c "
                "JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname = 'awa' AND c.relkind = 'r'"
            ).fetchall()
        )
        loaded = ring_bytes(conn)
        pin.rollback()
        # Released: a few rotations and prunes bring the ring back to its steady size.
        outcomes: list[tuple[str, str, str]] = []
        for ring, times in (("claim", 9), ("queue", 17)):
            for _ in range(times):
                run_through(conn)
                pruned = prune_past_transient_locks(conn, ring)
                [(rotated,)] = conn.execute("SELECT awa.rotate_v2(%s)", [ring]).fetchall()
                outcomes.append((ring, pruned, rotated))
        settled = ring_bytes(conn)
    hot = {
        name: n
        for name, n in dead.items()
        if name.split("_")[0] in ("ready", "claims", "claim", "done")
    }
    assert hot and all(n == 0 for n in hot.values()), hot
    # 50,000 jobs went through; everything else (control rows) stays small and does not scale.
    assert sum(dead.values()) <= 20, {k: v for k, v in dead.items() if v}
    assert settled < loaded / 5, (loaded, settled, outcomes)


@pytest.mark.worker
def test_leader_rotates_and_prunes_rings_while_work_flows(manage_py: Start) -> None:
    overrides = {"CLAIM_ROTATE_INTERVAL": 0.2, "HISTORY_RETENTION": 1.5, "PRUNE_INTERVAL": 0.05}
    proc = worker(manage_py, "--queue", "work=16", overrides=overrides)

    def pruned(ring: str) -> bool:
        return bool(
            scalar(
                "SELECT count(*) FROM awa.ring_prunes WHERE ring = %s AND outcome = 'pruned'", ring
            )
        )

    enqueued: list[int] = []

    def feed_and_check() -> bool:
        enqueued.extend(testjobs.ledger_sync.enqueue(i).id for i in range(20))
        return pruned("claim") and pruned("queue")

    wait_for(
        feed_and_check,
        timeout=60,
        interval=0.2,
        message=lambda: f"claim and queue slots to be pruned; output:\n{proc.output()}",
    )
    # Nothing was lost on the way: every job enqueued so far completes.
    wait_for(
        lambda: (
            scalar("SELECT count(*) FROM awa.jobs WHERE state IN ('available', 'running')") == 0
        ),
        timeout=30,
        message="the queue to drain",
    )
    wait_for(
        lambda: Ledger.objects.count() == len(enqueued),
        timeout=30,
        message="every enqueued job to run",
    )
    assert set(Ledger.objects.values_list("job_id", flat=True)) == set(enqueued)
    proc.send_signal(signal.SIGTERM)
    wait_for(lambda: proc.proc.poll() is not None, timeout=20, message="exit")


# The maintenance thread of a worker process ------------------------------------------------------


class _Loop:
    """Stands in for ``Maintenance``: its ``run`` raises, returns, or waits to be cancelled."""

    def __init__(self, how: str) -> None:
        self.how = how

    async def run(self) -> None:
        import asyncio

        if self.how == "raises":
            raise ValueError("boom")
        if self.how == "waits":
            await asyncio.Event().wait()


@pytest.mark.parametrize("how", ["raises", "returns", "waits"])
def test_a_maintenance_thread_reports_its_loop_ending_unless_stopped(how: str) -> None:
    from awa_django.maintenance.thread import MaintenanceThread

    ended: list[BaseException | None] = []
    thread = MaintenanceThread(_Loop(how), ended.append)  # type: ignore[arg-type]
    thread.start()
    if how == "waits":
        thread.stop(timeout=5)
        assert ended == [] and not thread._thread.is_alive()
        return
    thread._thread.join(5)
    assert len(ended) == 1
    assert (type(ended[0]).__name__ if ended[0] else None) == (
        "ValueError" if how == "raises" else None
    )
