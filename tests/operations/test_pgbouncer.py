"""Producers behind PgBouncer in transaction pooling mode (docs/pgbouncer.md).

The ``pgbouncer`` lane of scripts/test runs these (and the other tests marked ``pooler``) with
``AWA_TEST_PGBOUNCER=1``: the test's Django connections go through a real PgBouncer in
transaction mode (tests/conftest.py), and after each test its server connections are checked to
carry no session state. The dj52 and dj6 lanes run them against the server directly, where they
must pass too. Workers always connect directly (``AWA_TEST_DIRECT_URL``): they hold session
advisory locks and ``LISTEN``.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from django.db import connection, transaction

import awa_django
from tests.jobs import common as testjobs
from tests.jobs import tasks as tasks_for_tests
from tests.jobs import worker_env
from tests.support.callbacks import job_row, parked
from tests.support.database import PGBOUNCER, pg
from tests.support.polling import wait_for
from tests.support.processes import ManagedProcess

pytestmark = [pytest.mark.pooler, pytest.mark.usefixtures("clean_awa")]

Start = Callable[..., ManagedProcess]


def states(*ids: int) -> list[str]:
    with pg() as conn:
        rows = dict(conn.execute("SELECT id, state FROM awa.jobs WHERE id = ANY(%s)", [list(ids)]))
    return [rows.get(i, "missing") for i in ids]


@pytest.mark.skipif(not PGBOUNCER, reason="only in the pgbouncer lane (AWA_TEST_PGBOUNCER=1)")
def test_the_lane_reaches_the_database_through_pgbouncer_in_transaction_mode() -> None:
    port = int(connection.settings_dict["PORT"])
    # PgBouncer's admin console (the "pgbouncer" database) answers simple queries only.
    with psycopg.connect(
        host="127.0.0.1", port=port, dbname="pgbouncer", user="postgres", autocommit=True
    ) as admin:
        cur = admin.cursor(row_factory=psycopg.rows.dict_row)
        cur.execute("SHOW CONFIG")
        config = {row["key"]: row["value"] for row in cur.fetchall()}
    assert config["pool_mode"] == "transaction"
    direct = os.environ["AWA_TEST_DIRECT_URL"]
    assert f":{port}/" not in direct


def test_every_enqueue_path_commits_with_the_callers_transaction() -> None:
    with transaction.atomic():
        one = testjobs.noop.enqueue()
        # The first enqueue to a new queue creates its lanes on a second connection.
        fresh = testjobs.noop.using(queue="pgb-new", priority=7).enqueue()
        many = awa_django.enqueue_many([testjobs.noop.prepare() for _ in range(20)])
        timed = awa_django.enqueue_many(
            [testjobs.noop.using(run_after=timedelta(hours=1)).prepare(), testjobs.noop.prepare()]
        )
        unique = testjobs.noop.using(unique_key="pgb:1").enqueue()
        again = testjobs.noop.using(unique_key="pgb:1").enqueue()
        batch = awa_django.enqueue_many(
            [testjobs.noop.using(unique_key=f"pgb:{i}").prepare() for i in range(3)]
        )
        task = tasks_for_tests.add.enqueue(2, 3)
        # Nothing is visible to another session before the commit.
        with pg() as conn:
            assert conn.execute("SELECT count(*) FROM awa.jobs").fetchone() == (0,)
    assert again.duplicate and again.id == unique.id
    assert [h.duplicate for h in batch] == [False, True, False]  # pgb:1 is taken
    ids = [one.id, fresh.id, *(h.id for h in many), *(h.id for h in timed), unique.id]
    ids += [h.id for h in batch if not h.duplicate] + [int(task.id)]
    assert len(set(ids)) == len(ids)
    found = states(*ids)
    assert found.count("scheduled") == 1 and set(found) == {"available", "scheduled"}


def test_a_rolled_back_transaction_writes_nothing() -> None:
    with pytest.raises(RuntimeError), transaction.atomic():
        testjobs.noop.enqueue()
        awa_django.enqueue_many([testjobs.noop.prepare() for _ in range(5)])
        testjobs.noop.using(unique=True).enqueue()
        raise RuntimeError("rollback")
    with pg() as conn:
        assert conn.execute("SELECT count(*) FROM awa.jobs").fetchone() == (0,)


def test_resolve_callback_and_the_admin_actions() -> None:
    from tests.support.admin_client import confirmed
    from tests.support.factories import dead_letter, staff

    with pg() as conn:
        waiting, callback = parked(conn, queue="pgb-cb")
    assert awa_django.resolve_callback(callback, result={"ok": True}) == "resolved"
    with pg() as conn:
        assert job_row(conn, waiting.job_id)["state"] == "completed"
    # Admin actions, confirmed then run (with their LogEntry) in one request's transaction.
    testjobs.noop.using(queue="pgb-admin").enqueue()
    client = staff("manage_queue", "retry_dlq")
    _, done = confirmed(client, "queuestat", "pause_queues", ["pgb-admin"])
    assert done.status_code == 302, done
    with pg() as conn:
        row = conn.execute("SELECT paused FROM awa.queue_meta WHERE queue = 'pgb-admin'")
        assert row.fetchone() == (True,)
    [dead] = dead_letter(1, queue="pgb-dlq")
    _, done = confirmed(client, "deadletter", "retry_jobs", [dead])
    assert done.status_code == 302, done
    assert states(dead) == ["available"]


@pytest.mark.worker
def test_a_worker_on_a_direct_connection_is_woken_by_a_pooled_enqueue(manage_py: Start) -> None:
    """NOTIFY sent in a producer's transaction through PgBouncer reaches a worker that LISTENs
    on a direct connection at commit: the job runs at once, not after POLL_INTERVAL."""
    direct = os.environ.get("AWA_TEST_DIRECT_URL")
    env = {
        **worker_env(POLL_INTERVAL=60.0, RUNTIME_REFRESH_INTERVAL=60.0),
        **({"DATABASE_URL": direct} if direct else {}),
    }
    proc = manage_py("awa_worker", "--queue", "pgb-wake=4", extra_env=env)

    def listening() -> Any:
        with pg() as conn:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND application_name LIKE 'awa:worker:%%' AND query = 'LISTEN awa_cancel'"
            ).fetchone()
        return row and row[0]

    wait_for(listening, timeout=30, message=lambda: f"the worker's LISTEN:\n{proc.output()}")
    # The worker polled once at start and found nothing; the next poll is a minute away.
    for _ in range(2):
        started = time.monotonic()
        with transaction.atomic():
            job = testjobs.noop.using(queue="pgb-wake").enqueue()
        wait_for(
            lambda job=job: states(job.id) == ["completed"],
            timeout=15,
            message=lambda: f"the job; worker output:\n{proc.output()}",
        )
        assert time.monotonic() - started < 10
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0, proc.output()
