"""What each least-privilege role can do (docs/roles.md): every documented operation of a role
works when it logs in as that role, through the Python API, ``manage.py`` commands and worker
and maintenance processes, and the operations of the other roles are refused.

tests/operations/test_roles_catalog.py proves what the roles cannot write; this module proves that
the system still runs on them: an application enqueues and reads its jobs, a worker process drains
them, the maintenance leader runs every task, an operator acts on jobs and queues, a reader reads.
"""

from __future__ import annotations

import signal
import uuid
from typing import Any

import psycopg
import pytest
from psycopg import errors

from awa_django.db import storage
from awa_django.db.storage import Finalization
from tests.support.factories import WORKER
from tests.support.polling import wait_for
from tests.support.roles import RolesDB, enqueue_as, refused, state_of

ERROR = {"type": "Boom", "message": "boom", "traceback": "boom"}


def _claim(conn: psycopg.Connection[Any], queue: str, n: int) -> list[storage.ClaimedJob]:
    claimed = storage.claim(conn, queue, n, WORKER)
    assert len(claimed) == n
    return sorted(claimed, key=lambda c: c.job_id)


def _park(conn: psycopg.Connection[Any], queue: str) -> tuple[int, uuid.UUID]:
    """As a worker: claim one job of ``queue``, register a callback and park the attempt."""
    [c] = _claim(conn, queue, 1)
    callback = uuid.uuid4()
    row = conn.execute(
        "SELECT awa.callback_register_v1(%s, %s, %s)", [c.job_id, c.run_lease, callback]
    ).fetchone()
    assert row == (True,)
    wait = Finalization(
        c.job_id, c.run_lease, c.claim_slot, "wait", callback_id=callback, has_state=True
    )
    assert storage.finalize(conn, [wait]) == []
    return c.job_id, callback


def _dead_letter(db: RolesDB, queue: str, n: int) -> list[int]:
    """``n`` jobs enqueued as the app, claimed and failed for good as the worker (DLQ)."""
    enqueue_as(db, "app", queue, n)
    with db.connect("worker") as conn:
        claimed = _claim(conn, queue, n)
        items = [Finalization(c.job_id, c.run_lease, c.claim_slot, "fail", error=ERROR)
                 for c in claimed]  # fmt: skip
        assert storage.finalize(conn, items) == []
    return [c.job_id for c in claimed]


# The application ---------------------------------------------------------------------------


def test_the_application_enqueues_and_reads_its_jobs_by_id(roles_db: RolesDB) -> None:
    # Through the Python API, inside one transaction: a single job into a queue and priority
    # never seen (its lanes and their sequences are made by awa.ensure_lanes_v1, as the owner),
    # a bulk batch (the COPY path is not open to this role: awa.enqueue_v1), a scheduled job, a
    # unique job and a django.tasks task; then the job states, the task's result and the health
    # view's checks as the application reads them.
    result = roles_db.shell(
        "app",
        """
        import json
        from datetime import timedelta
        from django.db import transaction
        import awa_django
        from awa_django.operator import reads
        from awa_django.telemetry.health import check_health, parse_lag_thresholds
        from tests.jobs import common as testjobs
        from tests.jobs import tasks as tasks_for_tests

        with transaction.atomic():
            one = testjobs.noop.using(queue="app-fresh", priority=37).enqueue()
            many = awa_django.enqueue_many(
                [testjobs.noop.using(queue="app-bulk", priority=-3).prepare() for _ in range(3)]
            )
            later = testjobs.noop.using(queue="app-fresh", run_after=timedelta(hours=1)).enqueue()
            unique = testjobs.noop.using(queue="app-fresh", unique_key="u1").enqueue()
            again = testjobs.noop.using(queue="app-fresh", unique_key="u1").enqueue()
            task = tasks_for_tests.add.enqueue(2, 3)
        ids = [one.id, *(h.id for h in many), later.id, unique.id]
        health = check_health(
            worker=False, leader=False, max_lag=parse_lag_thresholds(["3600"])
        )
        print(json.dumps({
            "states": [reads.job_show(i).state.value for i in ids],
            "duplicate": again.duplicate and again.id == unique.id,
            "task": tasks_for_tests.add.get_result(task.id).status.value,
            "enqueued_at": task.enqueued_at is not None,
            "health": health.ok,
        }))
        """,
    )
    assert result == {
        "states": ["available"] * 4 + ["scheduled", "available"],
        "duplicate": True,
        "task": "READY",
        "enqueued_at": True,
        "health": True,
    }
    with roles_db.connect("owner") as conn:
        owners = conn.execute(
            "SELECT DISTINCT c.relowner::regrole::text FROM awa.queue_lanes l "
            "JOIN pg_class c ON c.oid = l.enqueue_seq WHERE l.queue IN ('app-fresh', 'app-bulk')"
        ).fetchall()
    assert owners == [(roles_db.names["owner"],)]


def test_the_application_resolves_and_extends_callbacks(roles_db: RolesDB) -> None:
    enqueue_as(roles_db, "app", "app-cb", 2)
    with roles_db.connect("worker") as worker:
        first, extended = _park(worker, "app-cb")
        second, resolved = _park(worker, "app-cb")
    with roles_db.connect("app") as app:
        row = app.execute(
            "SELECT outcome FROM awa.callback_extend_v1(%s, 600)", [extended]
        ).fetchone()
        assert row == ("extended",)
        row = app.execute(
            "SELECT outcome FROM awa.callback_resolve_v2(%s, '{\"ok\": 1}')", [resolved]
        ).fetchone()
        assert row == ("resolved",)
    assert (state_of(roles_db, first), state_of(roles_db, second)) == (
        "waiting_external",
        "completed",
    )


def test_the_application_cannot_list_jobs_read_callback_ids_or_act(roles_db: RolesDB) -> None:
    [job_id] = enqueue_as(roles_db, "app", "app-refused")
    with roles_db.connect("app") as conn:
        refused(conn, "SELECT * FROM awa.jobs WHERE id = %s", [job_id])
        refused(conn, "SELECT callback_id FROM awa.callback_waits")
        refused(conn, "SELECT * FROM awa.job_list_v1()")
        refused(conn, "SELECT * FROM awa.queue_stats_v1()")
        refused(conn, "SELECT awa.cancel_v1(%s)", [job_id])
        refused(conn, "SELECT awa.queue_pause_v1('app-refused', true)")
        refused(conn, "SELECT awa.dlq_purge_v1(ARRAY[%s]::bigint[])", [job_id])
        refused(conn, "SELECT awa.prune_v1('claim')")
        with pytest.raises(errors.InsufficientPrivilege):
            storage.claim(conn, "app-refused", 1, WORKER)
        # The one read it has: a job whose id it knows.
        row = conn.execute("SELECT state, args FROM awa.job_v1(%s)", [job_id]).fetchone()
    assert row == ("available", {"args": [], "kwargs": {}})
    assert state_of(roles_db, job_id) == "available"


def test_a_forged_lane_record_does_not_let_an_enqueue_skip_the_lane_lock(
    roles_db: RolesDB,
) -> None:
    # awa.xact_lanes records the lanes a transaction holds; any caller can set it. The enqueue
    # (run as the owner) must still take the lane's lock: with every lane of the queue held by
    # another transaction, a forged record makes it wait (here: time out), not append.
    enqueue_as(roles_db, "app", "app-forged")
    with roles_db.connect("owner") as holder, roles_db.connect("app") as app:
        lanes = [
            r[0]
            for r in holder.execute(
                "SELECT lane_id FROM awa.queue_lanes WHERE queue = 'app-forged' AND priority = 0"
            )
        ]
        with holder.transaction():
            for lane in lanes:
                holder.execute("SELECT pg_advisory_xact_lock(4282177, %s)", [lane])
            with pytest.raises(errors.LockNotAvailable), app.transaction():
                app.execute("SET LOCAL lock_timeout = '300ms'")
                app.execute("SELECT set_config('awa.xact_lanes', %s, true)", [str(lanes[0])])
                app.execute(
                    "SELECT * FROM awa.enqueue_one_v2('tests.jobs.common.noop', 'app-forged', 0, "
                    '\'{"args": [], "kwargs": {}}\', 1)'
                )


# The worker --------------------------------------------------------------------------------


def test_the_worker_role_claims_heartbeats_and_finalizes_every_outcome(roles_db: RolesDB) -> None:
    ids = enqueue_as(roles_db, "app", "worker-q", 5)
    outcomes = ["completed", "retry", "snooze", "cancel", "fail"]
    with roles_db.connect("worker") as conn:
        conn.execute("LISTEN awa_jobs")
        claimed = _claim(conn, "worker-q", 5)
        assert [c.job_id for c in claimed] == ids
        assert storage.heartbeat(conn, [(c.job_id, c.run_lease, None) for c in claimed]) == []
        items = [
            Finalization(
                c.job_id,
                c.run_lease,
                c.claim_slot,
                outcome,
                result_json="null" if outcome == "completed" else None,
                error=ERROR if outcome in ("retry", "fail") else None,
                delay=3600.0 if outcome in ("retry", "snooze") else None,
            )
            for c, outcome in zip(claimed, outcomes, strict=True)
        ]
        assert storage.finalize(conn, items) == []
        # A second write of the same attempts is stale: nothing changes.
        assert sorted(storage.finalize(conn, items)) == sorted(
            (c.job_id, c.run_lease) for c in claimed
        )
        refused(conn, "SELECT awa.promote_v1()")
        refused(conn, "SELECT awa.cancel_v1(%s)", [ids[0]])
        refused(conn, "SELECT awa.dlq_purge_v1(%s::bigint[])", [ids])
    states = [state_of(roles_db, i) for i in ids]
    assert states == ["completed", "retryable", "scheduled", "cancelled", "failed"]
    with roles_db.connect("reader") as reader:
        row = reader.execute("SELECT in_dlq FROM awa.jobs WHERE id = %s", [ids[4]]).fetchone()
    assert row == (True,)


def test_the_worker_role_parks_and_resolves_a_callback(roles_db: RolesDB) -> None:
    [job_id] = enqueue_as(roles_db, "app", "worker-cb")
    with roles_db.connect("worker") as conn:
        parked, callback = _park(conn, "worker-cb")
        assert state_of(roles_db, job_id) == "waiting_external"
        row = conn.execute(
            "SELECT outcome FROM awa.callback_resolve_v2(%s, '\"done\"')", [callback]
        ).fetchone()
    assert (parked, row) == (job_id, ("resolved",))
    assert state_of(roles_db, job_id) == "completed"


@pytest.mark.worker
def test_a_worker_process_as_the_worker_role_drains_what_the_application_enqueued(
    roles_db: RolesDB,
) -> None:
    ids = enqueue_as(roles_db, "app", "burst-q", 5)
    roles_db.django("worker", "awa_worker", "--burst", "--no-maintenance", "--queue", "burst-q")
    assert [state_of(roles_db, i) for i in ids] == ["completed"] * 5


@pytest.mark.worker
def test_a_worker_role_process_never_stands_for_leader(roles_db: RolesDB) -> None:
    # Without --no-maintenance a worker takes part in the election; the worker role may run
    # no maintenance function, so as leader it would fail every task while holding the lock
    # no other process could take. It does not stand, says so, and runs its jobs.
    proc = roles_db.start("worker", "awa_worker", "--queue", "stand-q")
    try:
        wait_for(
            lambda: "does not stand for leader" in proc.output(),
            timeout=60,
            message=lambda: f"the warning; output:\n{proc.output()}",
        )
        [job_id] = enqueue_as(roles_db, "app", "stand-q")
        wait_for(
            lambda: state_of(roles_db, job_id) == "completed",
            timeout=30,
            message=lambda: f"the job to run; output:\n{proc.output()}",
        )
        leaders = roles_db.scalar(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = 1096237407 "
            "AND objid = 1296124238 AND objsubid = 1 AND database = "
            "(SELECT oid FROM pg_database WHERE datname = current_database())"
        )
        marked = roles_db.scalar("SELECT count(*) FROM awa.runtime_instances WHERE is_leader")
        assert (leaders, marked) == (0, 0)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)


# The maintenance leader --------------------------------------------------------------------


@pytest.mark.worker
def test_the_maintenance_leader_runs_every_task_as_its_role(roles_db: RolesDB) -> None:
    overrides = {
        "CLAIM_ROTATE_INTERVAL": 0.2,
        "HISTORY_RETENTION": 6.0,
        "PRUNE_INTERVAL": 0.05,
        "DLQ_RETENTION": 0.5,
    }
    # Rings that hold only this test's work (others left jobs nobody claims, which keep their
    # slots from being pruned). Before the leader starts: a dead-lettered job older than the
    # DLQ's retention, and an attempt claimed and abandoned (no heartbeat).
    roles_db.reset()
    [expired] = _dead_letter(roles_db, "maint-dlq", 1)
    [abandoned] = enqueue_as(roles_db, "app", "maint-q")
    with roles_db.connect("worker") as conn:
        _claim(conn, "maint-q", 1)
    wait_for(
        lambda: roles_db.scalar(
            "SELECT now() - dlq_at > interval '0.6 s' FROM awa.dlq_entries WHERE job_id = %s",
            [expired],
        ),
        timeout=10,
        message="the DLQ entry to age",
    )
    leader = roles_db.start("maintenance", "awa_maintenance", overrides=overrides)
    worker = roles_db.start(
        "worker", "awa_worker", "--no-maintenance", "--queue", "maint-q=8", overrides=overrides
    )

    def output() -> str:
        return f"leader:\n{leader.output()}\nworker:\n{worker.output()}"

    try:
        [delayed] = enqueue_as(roles_db, "app", "maint-q", delay=0.3)
        for job_id, what in ((delayed, "promoted"), (abandoned, "rescued")):
            wait_for(
                lambda job_id=job_id: state_of(roles_db, job_id) == "completed",  # type: ignore[misc]
                timeout=30,
                message=lambda what=what: f"the job to be {what} and run; {output()}",  # type: ignore[misc]
            )
        wait_for(
            lambda: state_of(roles_db, expired) is None,
            timeout=30,
            message=lambda: f"the DLQ entry to expire; {output()}",
        )

        def pruned() -> bool:
            enqueue_as(roles_db, "app", "maint-q", 10)
            rings = roles_db.scalar(
                "SELECT array_agg(DISTINCT ring ORDER BY ring) FROM awa.ring_prunes "
                "WHERE outcome = 'pruned'"
            )
            return bool(rings) and {"claim", "queue"} <= set(rings)

        wait_for(pruned, timeout=90, interval=0.2, message=lambda: f"prunes; {output()}")
        marked = roles_db.scalar("SELECT concurrency FROM awa.runtime_instances WHERE is_leader")
        assert marked == 0  # the awa_maintenance process, marked by awa.leader_mark_v1
        assert "permission denied" not in output()
    finally:
        for proc in (worker, leader):
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)


# The operator and the reader ---------------------------------------------------------------


def test_the_operator_acts_on_jobs_queues_and_callbacks(roles_db: RolesDB) -> None:
    retried, purged = _dead_letter(roles_db, "op-q", 2)
    [waiting] = enqueue_as(roles_db, "app", "op-q")
    with roles_db.connect("worker") as worker:
        parked, callback = _park(worker, "op-q")
    [cancelled, drained] = enqueue_as(roles_db, "app", "op-other", 2)
    result = roles_db.shell(
        "operator",
        f"""
        import json
        from awa_django import operator as op

        op.queue_pause("op-q")
        paused = [q.paused for q in op.queue_stats() if q.queue == "op-q"]
        op.queue_pause("op-q", paused=False)
        print(json.dumps({{
            "paused": paused,
            "cancel": op.cancel({cancelled}).value,
            "history": [r.outcome for r in op.history_retry([{cancelled}], by="ops")],
            "kind": op.set_kind_limits("tests.jobs.common.noop", rate_limit=5.0, actor="ops").kind,
            "kind_cleared": op.clear_kind_limits("tests.jobs.common.noop", actor="ops"),
            "schedule": [op.schedule_pause("none", by="ops"), op.schedule_trigger("none")],
            "extended": op.extend_callback("{callback}", 600),
            "retried": op.dlq_retry([{retried}]),
            "purged": op.dlq_purge([{purged}]),
            "limits": op.set_queue_limits("op-q", global_concurrency=3, actor="ops").queue,
            "cleared": op.clear_queue_limits("op-q", actor="ops"),
            "dlq": op.queue_dlq("op-q", False),
            "resolved": op.resolve_callback("{callback}", result=1),
            "drained": op.queue_drain("op-other"),
            "listed": [j.id for j in op.job_list(queue="op-other")],
        }}))
        """,
    )
    assert result["paused"] == [True]
    assert result["cancel"] == "available"
    assert result["history"] == ["retried"]
    assert (result["kind"], result["kind_cleared"]) == ("tests.jobs.common.noop", None)
    assert result["schedule"] == [False, None]
    assert result["extended"] == "extended"
    assert (result["retried"], result["purged"]) == ([retried], [purged])
    assert (result["limits"], result["cleared"], result["dlq"]) == ("op-q", None, True)
    assert result["resolved"] == "resolved"
    # The queue's two jobs and the history retry of the cancelled one, which the drain cancelled.
    assert len(result["listed"]) == 3 and {cancelled, drained} <= set(result["listed"])
    assert result["drained"] == 2
    assert parked == waiting
    states = {i: state_of(roles_db, i) for i in (retried, purged, parked, cancelled, drained)}
    assert states == {
        retried: "available",
        purged: None,
        parked: "completed",
        cancelled: "cancelled",
        drained: "cancelled",
    }
    with roles_db.connect("operator") as conn:
        refused(conn, 'SELECT * FROM awa.enqueue_v1(\'[{"kind": "k"}]\')')
        refused(conn, "SELECT awa.prune_v1('queue')")
        with pytest.raises(errors.InsufficientPrivilege):
            storage.claim(conn, "op-q", 1, WORKER)


def test_the_reader_reads_what_the_admin_shows_and_cannot_act(roles_db: RolesDB) -> None:
    [job_id] = enqueue_as(roles_db, "app", "read-q")
    result = roles_db.shell(
        "reader",
        f"""
        import json
        from django.apps import apps
        from awa_django.operator import reads

        counts = {{}}
        for model in apps.get_app_config("awa_django").get_models():
            counts[model.__name__] = len(list(model.objects.all()[:50]))
        reads.queue_stats(); reads.workers(); reads.rings(); reads.dlq_list()
        reads.schedules(); reads.queue_limits(); reads.kind_limits(); reads.throughput("read-q")
        print(json.dumps({{
            "counts": counts,
            "job": reads.job_show({job_id}).state.value,
            "listed": [j.id for j in reads.job_list(queue="read-q")],
        }}))
        """,
    )
    assert result["job"] == "available" and result["listed"] == [job_id]
    assert result["counts"]["LiveJob"] >= 1
    refused_cli = roles_db.django("reader", "awa_queue", "pause", "read-q", check=False)
    assert refused_cli.returncode == 1 and "permission denied" in refused_cli.stderr
    with roles_db.connect("reader") as conn:
        for statement in (
            "SELECT awa.cancel_v1(%(id)s)",
            "SELECT awa.queue_pause_v1('read-q', true)",
            "SELECT awa.dlq_purge_v1(ARRAY[%(id)s]::bigint[])",
            "SELECT * FROM awa.callback_resolve_v2(gen_random_uuid())",
            'SELECT * FROM awa.enqueue_v1(\'[{"kind": "k"}]\')',
            "SELECT awa.promote_v1()",
        ):
            refused(conn, statement, {"id": job_id})
    assert state_of(roles_db, job_id) == "available"


def test_the_script_keeps_every_role_working_when_run_again(roles_db: RolesDB) -> None:
    # After a migrate, awa_roles runs again: same grants, and enqueue still works.
    roles_db.django(
        "owner",
        "awa_roles",
        "--apply",
        *[arg for kind, name in roles_db.names.items() if kind != "owner"
          for arg in (f"--{kind}", name)],
    )  # fmt: skip
    assert state_of(roles_db, enqueue_as(roles_db, "app", "again-q")[0]) == "available"
