"""The burst worker's exit check: awa.queues_idle_v2 gives the answer of the plain
one-statement check (tests/storage/reference_sql/queues_idle_one_statement.sql) in every state a
queue's jobs can be in (available, running, parked for a serial key or a kind's limit, scheduled,
retryable, cancelled, paused), including an attempt still open behind more than 128 later closed
ones, and over several queues at once."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import psycopg
import pytest

from awa_django.db import storage
from awa_django.db.storage import Finalization
from awa_django.sql import query
from tests.support.database import pg
from tests.support.factories import WORKER, enqueue_sql

pytestmark = [pytest.mark.storage, pytest.mark.usefixtures("clean_awa")]


REFERENCE = Path(__file__).resolve().parent / "reference_sql" / "queues_idle_one_statement.sql"


def idle(conn: psycopg.Connection[Any], *queues: str) -> bool:
    """v2's answer (what the worker asks, through the queues_idle query), after checking that
    the one-statement check gives the same one."""
    if conn.execute(
        "SELECT to_regprocedure('pg_temp.queues_idle_reference(text[])')"
    ).fetchone() == (None,):
        conn.execute(REFERENCE.read_text(encoding="utf-8"))
    ref = conn.execute(
        "SELECT pg_temp.queues_idle_reference(%s::text[])", [list(queues)]
    ).fetchone()
    v2 = conn.execute(query("queues_idle"), [list(queues)]).fetchone()
    assert ref is not None and v2 is not None
    assert v2[0] is ref[0], f"queues_idle_v2 {v2[0]}, the one-statement check {ref[0]} for {queues}"
    return bool(v2[0])


def enqueue(conn: psycopg.Connection[Any], queue: str, n: int = 1, **fields: Any) -> list[int]:
    """``n`` jobs of ``queue`` in one transaction (so one lane)."""
    rows = [{"kind": "k", "queue": queue, **fields} for _ in range(n)]
    return [job_id for job_id, _ in enqueue_sql(conn, json.dumps(rows))]


def claim(conn: psycopg.Connection[Any], queue: str, n: int) -> list[storage.ClaimedJob]:
    return storage.claim(conn, queue, n, WORKER)


def finish(
    conn: psycopg.Connection[Any], jobs: list[storage.ClaimedJob], outcome: str = "completed"
) -> None:
    error = None if outcome == "completed" else {"type": "E", "message": "m"}
    delay = 3600.0 if outcome == "retry" else None
    storage.finalize(
        conn,
        [Finalization(j.job_id, j.run_lease, j.claim_slot, outcome, error=error, delay=delay)
         for j in jobs],
    )  # fmt: skip


def close_without_hand_on(conn: psycopg.Connection[Any], job: storage.ClaimedJob) -> None:
    """Close an attempt by its closure row alone (no finalize: nothing is handed on or
    un-parked), so that a job parked behind it stays parked with nothing else live."""
    conn.execute(
        "INSERT INTO awa.claim_closures (claim_slot, job_id, run_lease, outcome) "
        "VALUES (%s, %s, %s, 'completed')",
        [job.claim_slot, job.job_id, job.run_lease],
    )


def test_no_queue_and_an_unknown_queue_are_idle() -> None:
    with pg() as conn:
        assert idle(conn) is True
        assert idle(conn, "nowhere") is True


def test_available_running_and_done() -> None:
    with pg() as conn:
        enqueue(conn, "q", 3)
        assert idle(conn, "q") is False  # available
        jobs = claim(conn, "q", 3)
        assert len(jobs) == 3
        assert idle(conn, "q") is False  # running
        finish(conn, jobs[:2])
        assert idle(conn, "q") is False  # one still running
        finish(conn, jobs[2:])
        assert idle(conn, "q") is True


def test_an_attempt_open_behind_more_than_128_closed_ones_is_running() -> None:
    with pg() as conn:
        enqueue(conn, "q", 300)
        [stuck] = claim(conn, "q", 1)
        rest = claim(conn, "q", 299)
        assert len(rest) == 299
        finish(conn, rest)
        assert idle(conn, "q") is False
        finish(conn, [stuck])
        assert idle(conn, "q") is True


def test_scheduled_and_retryable_jobs_do_not_count() -> None:
    with pg() as conn:
        enqueue(conn, "q", 1, run_at="2999-01-01T00:00:00Z")
        assert idle(conn, "q") is True
        enqueue(conn, "q", 1)
        jobs = claim(conn, "q", 1)
        finish(conn, jobs, "retry")  # retryable in an hour
        row = conn.execute(
            "SELECT count(*) FROM awa.jobs WHERE queue = 'q' AND state = 'retryable'"
        ).fetchone()
        assert row == (1,)
        assert idle(conn, "q") is True


def test_cancelled_available_jobs_do_not_count_but_one_behind_them_does() -> None:
    with pg() as conn:
        ids = enqueue(conn, "q", 3)
        for job_id in ids[:2]:
            assert conn.execute(query("cancel"), [job_id, "no"]).fetchone() == ("available",)
        assert idle(conn, "q") is False  # ids[2], behind two tombstones
        assert conn.execute(query("cancel"), [ids[2], "no"]).fetchone() == ("available",)
        assert idle(conn, "q") is True


def test_paused_queues_available_and_parked_do_not_count_but_running_does() -> None:
    with pg() as conn:
        enqueue(conn, "p", 2)
        [running] = claim(conn, "p", 1)
        conn.execute("SELECT awa.queue_pause_v1('p', true)")
        assert idle(conn, "p") is False  # its attempt still runs
        finish(conn, [running])
        assert idle(conn, "p") is True  # one available, but the queue is paused
        conn.execute("SELECT awa.queue_pause_v1('p', false)")
        assert idle(conn, "p") is False


def test_a_job_parked_for_its_serial_key_counts_unless_its_queue_is_paused() -> None:
    with pg() as conn:
        enqueue(conn, "s", 2, metadata={"awa:serial": "key"})
        [first] = claim(conn, "s", 10)  # the second waits for the key
        row = conn.execute("SELECT count(*) FROM awa.serial_waiting WHERE queue = 's'")
        assert row.fetchone() == (1,)
        close_without_hand_on(conn, first)
        assert idle(conn, "s") is False  # parked, nothing available or running
        conn.execute("SELECT awa.queue_pause_v1('s', true)")
        assert idle(conn, "s") is True


def test_a_job_parked_by_its_kind_limit_counts_unless_its_queue_is_paused() -> None:
    with pg() as conn:
        conn.execute("SELECT * FROM awa.flow_kind_set_v1('k', 1, NULL, NULL, 'test', false)")
        enqueue(conn, "f", 2)
        params = storage._claim_params("f", 10, WORKER, 60.0, None)
        with conn.cursor(row_factory=storage._claimed_job) as cursor:
            got = storage._claimed(cursor.execute(query("claim"), params).fetchall())
        assert len(got.jobs) == 1
        row = conn.execute("SELECT count(*) FROM awa.flow_waiting WHERE queue = 'f'")
        assert row.fetchone() == (1,)
        close_without_hand_on(conn, got.jobs[0])
        assert idle(conn, "f") is False
        conn.execute("SELECT awa.queue_pause_v1('f', true)")
        assert idle(conn, "f") is True


def test_several_queues_are_idle_only_when_each_is() -> None:
    with pg() as conn:
        enqueue(conn, "a", 1)
        enqueue(conn, "b", 1)
        finish(conn, claim(conn, "a", 1))
        assert idle(conn, "a") is True
        assert idle(conn, "a", "b") is False
        [running] = claim(conn, "b", 1)
        assert idle(conn, "b", "a") is False
        finish(conn, [running])
        assert idle(conn, "a", "b", "nowhere") is True
