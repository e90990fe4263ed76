"""Finalization, rescue-safety, cancel, promotion and DLQ of the storage engine (real Postgres)."""

from __future__ import annotations

import json
import threading
from typing import Any

import psycopg
import pytest

from awa_django.db import storage
from awa_django.db.storage import Finalization
from tests.support.awa_schema import job_state
from tests.support.database import pg
from tests.support.factories import WORKER, enqueue_sql

pytestmark = [
    pytest.mark.storage,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("clean_awa"),
]


def one(conn: psycopg.Connection[Any], queue: str = "f", **extra: Any) -> int:
    [(job_id, _)] = enqueue_sql(conn, json.dumps([{"kind": "k", "queue": queue, **extra}]))
    return job_id


def claim_one(conn: psycopg.Connection[Any], queue: str = "f") -> storage.ClaimedJob:
    [claimed] = storage.claim(conn, queue, 1, WORKER)
    return claimed


def fin(
    conn: psycopg.Connection[Any], c: storage.ClaimedJob, outcome: str, **kw: Any
) -> list[tuple[int, int]]:
    return storage.finalize(
        conn, [Finalization(c.job_id, c.run_lease, c.claim_slot, outcome, **kw)]
    )


def promote_due(conn: psycopg.Connection[Any]) -> int:
    # Make every deferred job due now, as if its time had come, then promote.
    conn.execute("UPDATE awa.deferred_jobs SET run_at = now() - interval '1 second'")
    return storage.promote(conn)


def test_completion_stores_the_result_and_a_stale_lease_changes_nothing() -> None:
    with pg() as conn:
        job_id = one(conn)
        c = claim_one(conn)
        wrong = Finalization(job_id, c.run_lease + 1, c.claim_slot, "completed", result_json="1")
        assert storage.finalize(conn, [wrong]) == [(job_id, c.run_lease + 1)]
        assert job_state(conn, job_id)["state"] == "running"  # type: ignore[index]
        assert fin(conn, c, "completed", result_json='{"ok": [1, 2]}') == []
        state = job_state(conn, job_id)
        assert state is not None
        assert (state["state"], state["result"], state["attempt"]) == (
            "completed",
            {"ok": [1, 2]},
            1,
        )
        # A second finalization of the same attempt (say, a rescued worker's late ack) loses.
        assert fin(conn, c, "fail", error={"message": "late"}) == [(job_id, c.run_lease)]
        assert job_state(conn, job_id)["state"] == "completed"  # type: ignore[index]
        assert conn.execute("SELECT count(*) FROM awa.dlq_entries").fetchone() == (0,)


def test_racing_closers_exactly_one_wins() -> None:
    with pg() as conn:
        job_ids = [one(conn) for _ in range(50)]
        claimed = storage.claim(conn, "f", 50, WORKER)
        assert [c.job_id for c in claimed] == job_ids
    results: list[list[tuple[int, int]]] = [[], []]

    def closer(index: int, outcome: str) -> None:
        with pg() as conn:
            results[index] = storage.finalize(
                conn, [Finalization(c.job_id, c.run_lease, c.claim_slot, outcome) for c in claimed]
            )

    threads = [
        threading.Thread(target=closer, args=(0, "completed")),
        threading.Thread(target=closer, args=(1, "cancel")),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    # Every attempt is closed exactly once: each one is stale for exactly one of the two.
    assert sorted(results[0] + results[1]) == sorted((c.job_id, c.run_lease) for c in claimed)
    with pg() as conn:
        row = conn.execute(
            "SELECT count(*), count(DISTINCT job_id) FROM awa.done_entries"
        ).fetchone()
        assert row == (50, 50)


def test_retry_goes_to_deferred_with_backoff_and_error_history() -> None:
    with pg() as conn:
        job_id = one(conn)
        c = claim_one(conn)
        error = {"type": "ValueError", "message": "boom", "traceback": "tb"}
        assert fin(conn, c, "retry", error=error) == []
        row = conn.execute(
            "SELECT state, attempt, run_lease, extract(epoch FROM run_at - now()), errors "
            "FROM awa.deferred_jobs WHERE job_id = %s",
            [job_id],
        ).fetchone()
        assert row is not None
        state, attempt, lease, delay, errors = row
        assert (state, attempt, lease) == ("retryable", 1, 1)
        # 2^1 s plus up to 25 % jitter, measured from a later now()
        assert 1.8 <= float(delay) <= 2.5 + 0.1
        assert len(errors) == 1 and errors[0]["message"] == "boom" and errors[0]["attempt"] == 1
        assert promote_due(conn) == 1
        c2 = claim_one(conn)
        assert (c2.job_id, c2.attempt, c2.run_lease) == (job_id, 2, 2)


def test_retry_after_uses_the_delay_and_is_bounded_by_max_attempts() -> None:
    with pg() as conn:
        job_id = one(conn, max_attempts=2)
        c = claim_one(conn)
        fin(conn, c, "retry", delay=30.0, error={"message": "later"})
        row = conn.execute(
            "SELECT extract(epoch FROM run_at - now()) FROM awa.deferred_jobs WHERE job_id = %s",
            [job_id],
        ).fetchone()
        assert row is not None and 29.0 <= float(row[0]) <= 30.5
        promote_due(conn)
        c2 = claim_one(conn)
        assert c2.attempt == 2
        fin(conn, c2, "retry", delay=30.0, error={"message": "still later"})
        state = job_state(conn, job_id)
        assert state is not None
        assert (state["state"], state["in_dlq"]) == ("failed", True)
        assert state["dlq_reason"].startswith("max_attempts exhausted")
        assert [e["message"] for e in state["errors"]] == ["later", "still later"]


def test_snooze_does_not_count_an_attempt() -> None:
    with pg() as conn:
        job_id = one(conn, max_attempts=1)
        for _ in range(3):
            c = claim_one(conn)
            assert c.attempt == 1
            fin(conn, c, "snooze", delay=5.0)
            assert job_state(conn, job_id)["state"] == "scheduled"  # type: ignore[index]
            promote_due(conn)
        c = claim_one(conn)
        assert (c.attempt, c.run_lease) == (1, 4)


def test_terminal_failure_goes_to_the_dlq_by_default_and_to_history_when_off() -> None:
    with pg() as conn:
        dead = one(conn, queue="dl")
        fin(conn, claim_one(conn, "dl"), "fail", error={"type": "TerminalError", "message": "no"})
        assert conn.execute(
            "SELECT dlq_reason FROM awa.dlq_entries WHERE job_id = %s", [dead]
        ).fetchone() == ("terminal error: no",)
        conn.execute("UPDATE awa.queue_meta SET dlq_enabled = false WHERE queue = 'dl'")
        failed = one(conn, queue="dl")
        fin(conn, claim_one(conn, "dl"), "fail", error={"message": "no"})
        state = job_state(conn, failed)
        assert state is not None and (state["state"], state["in_dlq"]) == ("failed", False)
        assert conn.execute(
            "SELECT count(*) FROM awa.dlq_entries WHERE job_id = %s", [failed]
        ).fetchone() == (0,)


def test_cancel_outcome_and_progress_kept_across_retry_cleared_on_success() -> None:
    with pg() as conn:
        job_id = one(conn)
        c = claim_one(conn)
        assert storage.heartbeat(conn, [(c.job_id, c.run_lease, '{"percent": 40}')]) == []
        fin(conn, c, "retry", error={"message": "x"}, has_state=True)
        assert conn.execute("SELECT count(*) FROM awa.attempt_state").fetchone() == (0,)
        assert job_state(conn, job_id)["progress"] == {"percent": 40}  # type: ignore[index]
        promote_due(conn)
        c2 = claim_one(conn)
        assert c2.progress == {"percent": 40}
        fin(conn, c2, "completed", result_json="null")
        state = job_state(conn, job_id)
        assert state is not None and state["progress"] is None
        other = one(conn)
        fin(conn, claim_one(conn), "cancel", error={"message": "handler said stop"})
        assert job_state(conn, other)["state"] == "cancelled"  # type: ignore[index]


def test_heartbeat_reports_attempts_that_are_no_longer_open() -> None:
    with pg() as conn:
        one(conn)
        c = claim_one(conn)
        assert storage.heartbeat(conn, [(c.job_id, c.run_lease, None)]) == []
        assert conn.execute("SELECT count(*) FROM awa.attempt_state").fetchone() == (1,)
        fin(conn, c, "completed", has_state=True)
        assert storage.heartbeat(conn, [(c.job_id, c.run_lease, None)]) == [(c.job_id, c.run_lease)]
        assert conn.execute("SELECT count(*) FROM awa.attempt_state").fetchone() == (0,)


def test_short_jobs_never_touch_attempt_state() -> None:
    # A trigger that refuses any write to attempt_state: a row written and deleted again (or
    # written in a transaction whose statistics have not been reported yet) fails the test too.
    with pg() as conn:
        conn.execute(
            "CREATE FUNCTION pg_temp.refuse_attempt_state() RETURNS trigger LANGUAGE plpgsql AS "
            "$$ BEGIN RAISE EXCEPTION 'attempt_state written: %', TG_OP; END $$"
        )
        conn.execute(
            "CREATE TRIGGER refuse_writes BEFORE INSERT OR UPDATE OR DELETE "
            "ON awa.attempt_state FOR EACH ROW EXECUTE FUNCTION pg_temp.refuse_attempt_state()"
        )
        try:
            for _ in range(5):
                one(conn)
            claimed = storage.claim(conn, "f", 5, WORKER)
            assert len(claimed) == 5
            for c in claimed:
                fin(conn, c, "completed")
        finally:
            conn.execute("DROP TRIGGER refuse_writes ON awa.attempt_state")


def test_cancel_everywhere() -> None:
    with pg() as conn, pg() as listener:
        listener.execute("LISTEN awa_cancel")
        scheduled = one(conn, delay=3600)
        available = one(conn)
        running = one(conn)
        c = None
        # claim the first available (FIFO: `available` was enqueued before `running`)
        assert conn.execute("SELECT awa.cancel_v1(%s)", [scheduled]).fetchone() == ("scheduled",)
        c = claim_one(conn)
        assert c.job_id == available
        assert conn.execute("SELECT awa.cancel_v1(%s)", [available]).fetchone() == ("running",)
        note = next(listener.notifies(timeout=5, stop_after=1))
        assert json.loads(note.payload) == {"id": available, "lease": c.run_lease}
        assert conn.execute("SELECT awa.cancel_v1(%s)", [running]).fetchone() == ("available",)
        assert conn.execute("SELECT awa.cancel_v1(%s)", [running]).fetchone() == (None,)
        assert conn.execute("SELECT awa.cancel_v1(%s)", [987654321]).fetchone() == (None,)
        for job_id in (scheduled, available, running):
            assert job_state(conn, job_id)["state"] == "cancelled"  # type: ignore[index]
        # The cancelled running attempt's late completion is stale.
        assert fin(conn, c, "completed") == [(c.job_id, c.run_lease)]
        assert claim_ids_empty(conn)


def claim_ids_empty(conn: psycopg.Connection[Any]) -> bool:
    return storage.claim(conn, "f", 10, WORKER) == []


def test_dlq_retry_and_purge() -> None:
    with pg() as conn:
        a = one(conn)
        fin(conn, claim_one(conn), "fail", error={"message": "a"})
        b = one(conn)
        fin(conn, claim_one(conn), "fail", error={"message": "b"})
        assert conn.execute(
            "SELECT * FROM awa.dlq_retry_v1(%s, 'elsewhere', 7)", [[a]]
        ).fetchall() == [(a,)]
        state = job_state(conn, a)
        assert state is not None
        assert (state["state"], state["queue"], state["priority"], state["attempt"]) == (
            "available",
            "elsewhere",
            7,
            0,
        )
        c = claim_one(conn, "elsewhere")
        assert (c.job_id, c.attempt, c.run_lease) == (a, 1, 2)  # run_lease keeps growing
        assert conn.execute("SELECT * FROM awa.dlq_purge_v1(%s)", [[b, 12345]]).fetchall() == [(b,)]
        assert job_state(conn, b) is None


def test_promotion_never_moves_a_job_twice() -> None:
    with pg() as conn:
        ids = [
            i
            for i, _ in enqueue_sql(
                conn, json.dumps([{"kind": "k", "queue": "p", "delay": 3600} for _ in range(2000)])
            )
        ]
        conn.execute("UPDATE awa.deferred_jobs SET run_at = now() - interval '1 second'")
    moved = [0, 0]

    def promoter(index: int) -> None:
        with pg() as conn:
            while (n := storage.promote(conn, 100)) > 0:
                moved[index] += n

    threads = [threading.Thread(target=promoter, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert sum(moved) == 2000
    with pg() as conn:
        assert conn.execute(
            "SELECT count(*), count(DISTINCT job_id) FROM awa.ready_entries WHERE queue = 'p'"
        ).fetchone() == (2000, 2000)
        claimed = [c.job_id for c in storage.claim(conn, "p", 5000, WORKER)]
        assert sorted(claimed) == sorted(ids)


def test_future_jobs_wait_in_deferred_until_promoted() -> None:
    with pg() as conn:
        job_id = one(conn, delay=3600)
        assert job_state(conn, job_id)["state"] == "scheduled"  # type: ignore[index]
        assert storage.promote(conn) == 0
        assert claim_ids_empty(conn)
        assert promote_due(conn) == 1
        assert claim_one(conn).job_id == job_id


def test_exact_counts() -> None:
    with pg() as conn:
        one(conn, queue="cnt")
        one(conn, queue="cnt")
        one(conn, queue="cnt", delay=600)
        c = claim_one(conn, "cnt")
        counts = {q.queue: q for q in storage.queue_counts(conn)}["cnt"]
        assert (counts.available, counts.running, counts.scheduled) == (1, 1, 1)
        fin(conn, c, "completed")
        counts = {q.queue: q for q in storage.queue_counts(conn)}["cnt"]
        assert (counts.available, counts.running, counts.completed) == (1, 0, 1)
