"""The probe of the worker's sweep of idle queues, ``awa.queues_ready_v2``, against real
Postgres: a queue is reported exactly when a claim now would take a job from it, and one probe
reads a bounded number of lanes (docs/worker.md, "Many queues").
"""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest

from awa_django.db import storage
from awa_django.db.storage import QueueReadiness
from tests.support.database import pg
from tests.support.factories import WORKER, enqueue_sql

pytestmark = [
    pytest.mark.storage,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("clean_awa"),
]


def jobs_json(n: int, queue: str, kind: str = "k", priority: int = 0, **extra: Any) -> str:
    return json.dumps(
        [
            {
                "kind": kind,
                "queue": queue,
                "priority": priority,
                "args": {"args": [i], "kwargs": {}},
                **extra,
            }
            for i in range(n)
        ]
    )


def claim_ids(conn: psycopg.Connection[Any], queue: str, n: int = 100) -> list[int]:
    return [j.job_id for j in storage.claim(conn, queue, n, WORKER)]


def probe(conn: psycopg.Connection[Any], *queues: str, **kw: Any) -> list[QueueReadiness]:
    return storage.queues_ready(conn, list(queues), **kw)


def ready(conn: psycopg.Connection[Any], *queues: str) -> list[str]:
    return sorted(r.queue for r in probe(conn, *queues) if r.ready)


def one_lane(conn: psycopg.Connection[Any], queue: str) -> None:
    """Give ``queue`` a single lane at priority 0 (so a test knows which lane a job takes)."""
    conn.execute("SELECT awa.ensure_lanes_v1(%s, 0, 1)", [queue])


def test_the_probe_reports_exactly_the_queues_a_claim_would_take_a_job_from() -> None:
    """A queue with a committed job not yet claimed, not paused; a claimed-out, empty or paused
    queue is left out, and so is a queue whose only job a producer still holds uncommitted."""
    with pg() as conn, pg(autocommit=False) as producer:
        enqueue_sql(conn, jobs_json(2, "a"))
        enqueue_sql(conn, jobs_json(1, "b"))
        enqueue_sql(conn, jobs_json(1, "paused"))
        conn.execute("SELECT awa.queue_pause_v1('paused', true)")
        enqueue_sql(producer, jobs_json(1, "held"))
        assert ready(conn, "a", "b", "paused", "held", "none") == ["a", "b"]
        assert claim_ids(conn, "a", n=1)
        assert ready(conn, "a", "b") == ["a", "b"]
        assert claim_ids(conn, "a") and claim_ids(conn, "b")
        assert ready(conn, "a", "b", "paused") == []
        conn.execute("SELECT awa.queue_pause_v1('paused', false)")
        assert ready(conn, "paused") == ["paused"]
        producer.commit()
        assert ready(conn, "held") == ["held"]
        assert conn.execute("SELECT awa.rotate_v3('claim')").fetchone() == ("rotated",)
        assert ready(conn, "a", "b", "paused", "held") == ["held", "paused"]  # cursors survive


def test_a_queue_whose_only_positions_were_rolled_back_is_idle_and_settled() -> None:
    """A trailing gap (a producer took a lane position, then rolled back) is no work: the queue
    is not reported, and its stamp settles, so later probes skip it; a job committed behind the
    gap is reported and claimed."""
    with pg() as conn, pg(autocommit=False) as producer:
        one_lane(conn, "g")
        enqueue_sql(conn, jobs_json(1, "g"))
        assert claim_ids(conn, "g")
        enqueue_sql(producer, jobs_json(3, "g"))
        producer.rollback()
        [row] = probe(conn, "g")
        assert (row.ready, row.upto) == (False, None)
        assert row.stamp is not None  # settled: every position is claimed or rolled back
        [again] = probe(conn, "g", stamps=[row.stamp])
        assert again == row
        [job] = [i for i, _ in enqueue_sql(conn, jobs_json(1, "g"))]
        [behind] = probe(conn, "g", stamps=[row.stamp])
        assert behind.ready and behind.stamp is None
        assert claim_ids(conn, "g") == [job]
        [after] = probe(conn, "g")
        assert not after.ready and after.stamp is not None and after.stamp != row.stamp


def test_a_position_an_open_transaction_holds_is_not_work_and_never_settles() -> None:
    """While a producer's transaction is open its position may still commit: not reported, and
    no stamp (the next probe looks again), so its commit is found even without a NOTIFY."""
    with pg() as conn, pg(autocommit=False) as producer:
        one_lane(conn, "open")
        enqueue_sql(conn, jobs_json(1, "open"))
        assert claim_ids(conn, "open")
        [settled] = probe(conn, "open")
        assert settled.stamp is not None
        enqueue_sql(producer, jobs_json(1, "open"))
        [held] = probe(conn, "open", stamps=[settled.stamp])
        assert (held.ready, held.stamp) == (False, None)
        producer.commit()
        [committed] = probe(conn, "open", stamps=[held.stamp])
        assert committed.ready


def test_an_unchanged_stamp_answers_without_reading_cursors_and_a_new_job_changes_it() -> None:
    with pg() as conn:
        enqueue_sql(conn, jobs_json(2, "s"))
        assert claim_ids(conn, "s")
        [row] = probe(conn, "s")
        assert not row.ready and row.stamp is not None
        enqueue_sql(conn, jobs_json(1, "s"))
        [moved] = probe(conn, "s", stamps=[row.stamp])
        assert moved.ready and moved.stamp is None


def test_parked_jobs_make_their_queue_ready_only_when_their_kind_can_start_one() -> None:
    """Jobs parked by their kind's concurrency limit (awa.flow_waiting) are not work while the
    limit holds; once a permit frees, the queue is reported (its next claim un-parks them)."""
    with pg() as claimer, pg() as sweeper:
        claimer.execute("SELECT * FROM awa.flow_kind_set_v1('k', 1, NULL, NULL, 'test', false)")
        enqueue_sql(claimer, jobs_json(3, "kinds"))
        [running] = storage.claim(claimer, "kinds", 10, WORKER)
        assert claimer.execute("SELECT count(*) FROM awa.flow_waiting").fetchone() == (2,)
        [row] = probe(sweeper, "kinds")
        assert not row.ready
        assert running.permits
        claimer.execute("SELECT awa.flow_release_v1(%s)", [running.permits])
        assert ready(sweeper, "kinds") == ["kinds"]


def test_a_heavy_parked_job_waits_for_as_many_permits_as_it_weighs() -> None:
    """A parked job of weight 2 under a limit of 2 with one permit held is not startable; the
    same job is when the worker could give it one unit only (it counts as 1 there)."""
    with pg() as claimer, pg() as other, pg() as sweeper:
        claimer.execute("SELECT * FROM awa.flow_kind_set_v1('h', 2, NULL, NULL, 'test', false)")
        enqueue_sql(claimer, jobs_json(1, "heavy", kind="h"))
        [running] = storage.claim(claimer, "heavy", 10, WORKER)
        enqueue_sql(claimer, jobs_json(1, "heavy", kind="h", metadata={"awa:weight": 2}))
        assert storage.claim(other, "heavy", 10, WORKER) == []
        assert claimer.execute("SELECT count(*) FROM awa.flow_waiting").fetchone() == (1,)
        assert not probe(sweeper, "heavy")[0].ready
        assert probe(sweeper, "heavy", caps=[1])[0].ready
        claimer.execute("SELECT awa.flow_release_v1(%s)", [running.permits])
        assert probe(sweeper, "heavy")[0].ready


def test_jobs_parked_by_their_kinds_rate_wait_for_its_next_token() -> None:
    with pg() as conn:
        conn.execute("SELECT * FROM awa.flow_kind_set_v1('r', NULL, 0.001, 1, 'test', false)")
        enqueue_sql(conn, jobs_json(2, "rated", kind="r"))
        assert len(claim_ids(conn, "rated")) == 1
        assert conn.execute("SELECT count(*) FROM awa.flow_waiting").fetchone() == (1,)
        assert ready(conn, "rated") == []  # the next token is 1,000 s away
        conn.execute("SELECT * FROM awa.flow_kind_set_v1('r', NULL, 1000, 1, 'test', false)")
        assert ready(conn, "rated") == ["rated"]


def test_a_queue_at_its_concurrency_limit_is_not_ready_until_a_permit_frees() -> None:
    with pg() as claimer, pg() as sweeper:
        claimer.execute("SELECT * FROM awa.flow_set_v1('lim', 1, NULL, NULL, 'test', false)")
        enqueue_sql(claimer, jobs_json(2, "lim"))
        [running] = storage.claim(claimer, "lim", 10, WORKER)
        [row] = probe(sweeper, "lim")
        assert (row.ready, row.stamp) == (False, None)  # work waits: never settled
        claimer.execute("SELECT awa.flow_release_v1(%s)", [running.permits])
        assert ready(sweeper, "lim") == ["lim"]


def _sequence_locks(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute(
        "SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation"
        " WHERE l.pid = pg_backend_pid() AND l.locktype = 'relation' AND c.relkind = 'S'"
    ).fetchone()
    assert row is not None
    return int(row[0])


def test_one_probe_locks_at_most_max_lanes_sequences_and_reads_a_wide_queue_in_parts() -> None:
    """Each lane read is a sequence locked until the statement ends: a probe reads the queues
    while their lanes fit in ``max_lanes``, and a queue with more lanes than that in parts."""
    with pg() as conn, pg(autocommit=False) as tx:
        for name in ("a", "b"):
            enqueue_sql(conn, jobs_json(1, name))  # 4 lanes each
        for priority in range(5):
            enqueue_sql(conn, jobs_json(1, "wide", priority=priority))  # 20 lanes
        for name in ("a", "b"):
            assert claim_ids(conn, name)
        assert len(claim_ids(conn, "wide")) == 5
        assert [r.queue for r in probe(tx, "a", "b", "wide", max_lanes=6)] == ["a"]
        assert _sequence_locks(tx) == 4
        tx.rollback()
        [late] = [i for i, _ in enqueue_sql(conn, jobs_json(1, "wide", priority=-5))]
        parts: list[QueueReadiness] = []
        after = None
        while True:
            [row] = probe(tx, "wide", max_lanes=6, after_lane=after)
            assert _sequence_locks(tx) <= 6
            tx.rollback()
            parts.append(row)
            assert row.stamp is None  # a queue read in parts is never settled
            if row.upto is None:
                break
            after = row.upto
        assert len(parts) == 4  # 24 lanes, 6 at a time
        assert [p.ready for p in parts].count(True) == 1  # the part with the new lane
        assert claim_ids(conn, "wide") == [late]


def test_the_probe_refuses_to_run_in_a_repeatable_read_snapshot() -> None:
    with pg(autocommit=False) as tx:
        tx.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        with pytest.raises(psycopg.errors.InvalidTransactionState, match="READ COMMITTED"):
            probe(tx, "q")


def test_resuming_a_queue_wakes_the_workers_and_pausing_it_does_not() -> None:
    with pg() as listener, pg() as operator:
        listener.execute("LISTEN awa_jobs")
        operator.execute("SELECT awa.queue_pause_v1('napping', true)")
        operator.execute("SELECT awa.queue_pause_v1('napping', false)")
        notes = [n.payload for n in listener.notifies(timeout=2.0, stop_after=1)]
        assert notes == ["napping"]
        operator.execute("SELECT awa.queue_pause_v1('napping', true)")
        assert [n.payload for n in listener.notifies(timeout=0.5)] == []
