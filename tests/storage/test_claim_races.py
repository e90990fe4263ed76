"""Claim and finalize against the writers that race them: stale-snapshot producers, maintenance
run at the wrong isolation, and carry-forwards that commit while a finalize waits for them
(docs/design/derived-claim-cursor.md)."""

from __future__ import annotations

import json
import threading
from typing import Any

import psycopg
import pytest

from awa_django.db import storage
from awa_django.db.storage import Finalization
from tests.support.database import pg
from tests.support.factories import WORKER, enqueue_sql
from tests.support.polling import wait_for

pytestmark = [
    pytest.mark.storage,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("clean_awa"),
]


def wait_for_lock(conn: psycopg.Connection[Any], pid: Any, what: str) -> None:
    """Until the backend ``pid`` (a row of ``pg_backend_pid()``) waits for a lock."""
    wait_for(
        lambda: (
            conn.execute(
                "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s", pid
            ).fetchone()
            == (True,)
        ),
        message=what,
    )


def one(queue: str) -> str:
    return json.dumps([{"kind": "k", "queue": queue}])


def complete(conn: psycopg.Connection[Any], jobs: list[storage.ClaimedJob]) -> list[Any]:
    return storage.finalize(
        conn, [Finalization(j.job_id, j.run_lease, j.claim_slot, "completed") for j in jobs]
    )


def test_a_row_a_repeatable_read_producer_writes_to_an_older_slot_is_claimed_in_order() -> None:
    """A producer in REPEATABLE READ (allowed: enqueue joins the caller's transaction) appends to
    the queue slot its snapshot saw, older than the slot of rows before it in the lane: the claim
    still finds it, before the rows after it."""
    with pg() as conn, pg(autocommit=False) as producer:
        conn.execute("SELECT awa.ensure_lanes_v1('rr', 0, 1)")  # one shard: one FIFO lane
        producer.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        producer.execute("SELECT 1")  # its snapshot is taken here
        [(a, _)] = enqueue_sql(conn, one("rr"))
        assert conn.execute("SELECT awa.rotate_v3('queue')").fetchone() == ("rotated",)
        [(b, _)] = enqueue_sql(conn, one("rr"))
        first = storage.claim(conn, "rr", 10, WORKER)
        assert [j.job_id for j in first] == [a, b]
        assert complete(conn, first) == []
        [(c, _)] = enqueue_sql(producer, one("rr"))
        producer.commit()
        slots = conn.execute(
            "SELECT job_id, ready_generation FROM awa.ready_entries WHERE job_id IN (%s, %s)",
            [b, c],
        ).fetchall()
        assert dict(slots)[c] < dict(slots)[b]  # c is in the older slot, after b in the lane
        [(d, _)] = enqueue_sql(conn, one("rr"))
        assert [j.job_id for j in storage.claim(conn, "rr", 10, WORKER)] == [c, d]


def test_rotate_v3_refuses_a_snapshot_older_than_its_statements() -> None:
    """Cursor markers computed from a REPEATABLE READ snapshot could lie below claims made
    since: rotate_v3 refuses with SQLSTATE 25000, and nothing is written."""
    with pg() as conn, pg(autocommit=False) as stale:
        enqueue_sql(conn, one("q"))
        storage.claim(conn, "q", 1, WORKER)  # the current claim slot is not idle
        stale.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        with pytest.raises(psycopg.errors.InvalidTransactionState, match="READ COMMITTED"):
            stale.execute("SELECT awa.rotate_v3('claim')")
        stale.rollback()
        generation = conn.execute(
            "SELECT max(generation) FROM awa.ring_rotations WHERE ring = 'claim'"
        ).fetchone()
        assert generation == (0,)


def _open_slot(conn: psycopg.Connection[Any], job: storage.ClaimedJob) -> int | None:
    row = conn.execute(
        "SELECT c.claim_slot FROM awa.claims c WHERE c.job_id = %s AND c.run_lease = %s"
        " AND NOT EXISTS (SELECT 1 FROM awa.claim_closures z WHERE z.job_id = c.job_id"
        " AND z.run_lease = c.run_lease AND z.claim_slot = c.claim_slot)",
        [job.job_id, job.run_lease],
    ).fetchone()
    return None if row is None else int(row[0])


def _ring_step(conn: psycopg.Connection[Any]) -> None:
    enqueue_sql(conn, one("fill"))
    complete(conn, storage.claim(conn, "fill", 10, WORKER))
    conn.execute("SELECT awa.prune_v1('claim')")
    conn.execute("SELECT awa.rotate_v3('claim')")


def test_a_completion_waiting_on_a_carry_forward_finds_the_carried_claim() -> None:
    """The finalize of a live attempt whose claim was carried once (its first slot is gone)
    meets a second carry-forward that commits while the finalize waits for it: the completion
    is written where the claim went, not reported stale."""
    with pg() as conn:
        enqueue_sql(conn, one("carry"))
        [held] = storage.claim(conn, "carry", 1, WORKER)  # left open
        for _ in range(40):  # until carried once and about to be carried again
            slot = _open_slot(conn, held)
            current = conn.execute(
                "SELECT current_slot FROM awa.ring_state WHERE ring = 'claim'"
            ).fetchone()
            assert slot is not None and current is not None
            if slot != held.claim_slot and (current[0] + 1) % 8 == slot:
                break
            _ring_step(conn)
        else:  # pragma: no cover - reported
            raise AssertionError("the claim was never carried twice")
        with pg(autocommit=False) as reader, pg(autocommit=False) as pruner, pg() as finalizer:
            # A reader's lock makes the prune's truncation time out: its carry commits alone.
            reader.execute("SELECT count(*) FROM awa.claims")
            assert pruner.execute("SELECT awa.prune_v1('claim')").fetchone() == ("blocked_lock",)
            pid = finalizer.execute("SELECT pg_backend_pid()").fetchone()
            assert pid is not None
            result: dict[str, Any] = {}

            def finalize() -> None:
                result["stale"] = complete(finalizer, [held])

            thread = threading.Thread(target=finalize)
            thread.start()
            wait_for_lock(conn, pid, "the finalize waiting for the prune's closure")
            pruner.commit()
            reader.rollback()
            thread.join(timeout=30)
        assert result["stale"] == []
        assert _open_slot(conn, held) is None
        state = conn.execute("SELECT state FROM awa.jobs WHERE id = %s", [held.job_id]).fetchone()
        assert state == ("completed",)


def _prune_next(conn: psycopg.Connection[Any], slot: int) -> None:
    """Step the claim ring until `slot` is the one the next claim prune truncates."""
    for _ in range(40):
        current = conn.execute(
            "SELECT current_slot FROM awa.ring_state WHERE ring = 'claim'"
        ).fetchone()
        assert current is not None
        if (current[0] + 1) % 8 == slot:
            return
        _ring_step(conn)
    raise AssertionError(f"claim slot {slot} never came up for pruning")  # pragma: no cover


# A unique job that blocks duplicates only while it runs.
UNIQUE_RUNNING = (
    "SELECT duplicate FROM awa.enqueue_one_v3('k', 'spent', 0, '{\"args\": [], \"kwargs\": {}}',"
    " 5, p_unique_key => 'one', p_unique_states => ARRAY['running'])"
)


RUNNING = ("unique holder", "attempt check", "burst exit check", "job read", "queue counts")


@pytest.mark.parametrize("reader", ["drain", "claim", *RUNNING])
def test_a_reader_waiting_on_a_claim_prune_keeps_the_lane_cursor_it_moved(reader: str) -> None:
    """A claim prune truncates the slot holding a lane's last claim and writes the lane's cursor
    as a marker in the current slot, in one transaction. TRUNCATE is not MVCC-safe: a statement
    whose snapshot is older than the prune and that first touches the claim ring while the prune
    holds it sees the slot empty and not the marker (nor the open claims the prune carried
    forward). A drain or a claim that waited there must still see the completed job as spent;
    a unique key's holder check, a worker's check of an attempt, a burst worker's exit check and
    the read surfaces (what get_result and the admin show) must still see the running job."""
    with pg() as conn:
        conn.execute("SELECT awa.ensure_lanes_v1('spent', 0, 1)")  # one lane
        if reader in RUNNING:
            assert conn.execute(UNIQUE_RUNNING).fetchone() == (False,)
            # The holder runs: its claim stays open and is carried forward by the prune.
            [job] = storage.claim(conn, "spent", 1, WORKER)
        else:
            enqueue_sql(conn, one("spent"))
            [job] = storage.claim(conn, "spent", 1, WORKER)
            assert complete(conn, [job]) == []
        with pg(autocommit=False) as locker:  # the rotation passes over the locked lane
            locker.execute("SELECT 1 FROM awa.queue_lanes WHERE queue = 'spent' FOR UPDATE")
            assert conn.execute("SELECT awa.rotate_v3('claim')").fetchone() == ("rotated",)
        _prune_next(conn, job.claim_slot)
        with pg(autocommit=False) as pruner, pg() as other:
            assert pruner.execute("SELECT awa.prune_v1('claim')").fetchone() == ("pruned",)
            pid = other.execute("SELECT pg_backend_pid()").fetchone()
            result: dict[str, Any] = {}

            def read() -> None:
                if reader == "drain":
                    result["got"] = other.execute(
                        "SELECT awa.queue_drain_v2('spent', 1000, NULL)"
                    ).fetchone()
                elif reader == "claim":
                    result["got"] = [j.job_id for j in storage.claim(other, "spent", 10, WORKER)]
                elif reader == "unique holder":
                    result["got"] = other.execute(UNIQUE_RUNNING).fetchone()
                elif reader == "job read":
                    result["got"] = other.execute(
                        "SELECT state FROM awa.job_v1(%s)", [job.job_id]
                    ).fetchall()
                elif reader == "queue counts":
                    result["got"] = other.execute(
                        "SELECT running FROM awa.queue_counts_v1() WHERE queue = 'spent'"
                    ).fetchone()
                elif reader == "burst exit check":
                    result["got"] = other.execute(
                        "SELECT awa.queues_idle_v2(ARRAY['spent'])"
                    ).fetchone()
                else:  # a cancel note or a callback asks whether the attempt is open
                    result["got"] = other.execute(
                        "SELECT awa._attempt_open_v1(%s, %s)", [job.job_id, job.run_lease]
                    ).fetchone()

            thread = threading.Thread(target=read)
            thread.start()
            wait_for_lock(conn, pid, f"the {reader} waiting for the prune's truncation")
            pruner.commit()
            thread.join(timeout=30)
        expected = {
            "drain": (0,),
            "claim": [],
            "unique holder": (True,),
            "attempt check": (True,),
            "burst exit check": (False,),
            "job read": [("running",)],
            "queue counts": (1,),
        }
        assert result["got"] == expected[reader]
        states = conn.execute(
            "SELECT state FROM awa.jobs WHERE queue = 'spent' ORDER BY id"
        ).fetchall()
        assert states == [("running",) if reader in RUNNING else ("completed",)]
