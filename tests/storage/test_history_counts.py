"""Exact terminal counts (docs/storage.md, "Counts"): every statement that writes history
appends its counts to ``awa.done_counts``, the leader's folds sum them without ever missing a
transaction still running, and a count stays exact through folds, concurrent writers and the
prune of a slot. The counts of every way into history against the rows themselves:
tests/storage/test_read_surfaces.py (``mixed_jobs``)."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from awa_django.db import storage
from awa_django.db.storage import Finalization
from awa_django.maintenance.leader import Maintenance, MaintenanceSettings
from awa_django.sql import sql_file
from tests.support.database import pg
from tests.support.factories import WORKER, enqueue_sql

pytestmark = [
    pytest.mark.storage,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("clean_awa"),
]

Conn = psycopg.Connection[Any]
FUNCTIONS = Path(__file__).resolve().parents[2] / "awa_django" / "sql" / "functions"


@pytest.fixture
def conn() -> Iterator[Conn]:
    with pg() as c:
        yield c


def complete(conn: Conn, queue: str, n: int) -> None:
    """n jobs of ``queue`` enqueued, claimed and completed, in their own transactions."""
    jobs = [{"kind": "k", "queue": queue, "args": {"args": [], "kwargs": {}}} for _ in range(n)]
    enqueue_sql(conn, json.dumps(jobs))
    claimed = storage.claim(conn, queue, n, WORKER)
    assert len(claimed) == n
    items = [Finalization(c.job_id, c.run_lease, c.claim_slot, "completed") for c in claimed]
    assert storage.finalize(conn, items) == []


def counts(conn: Conn) -> dict[tuple[str, str], int]:
    rows = conn.execute("SELECT queue, state, n FROM awa._history_counts_v2()").fetchall()
    return {(q, s): n for q, s, n in rows}


def truth(conn: Conn) -> dict[tuple[str, str], int]:
    rows = conn.execute(
        "SELECT queue, state, count(*) FROM awa.done_entries GROUP BY queue, state"
    ).fetchall()
    return {(q, s): n for q, s, n in rows}


def test_every_function_that_writes_history_counts_what_it_writes() -> None:
    """A new way into history that forgot its counts would make every count wrong for ever."""
    for path in sorted(FUNCTIONS.glob("*.sql")):
        for body in re.split(r"^CREATE OR REPLACE FUNCTION ", path.read_text(), flags=re.M)[1:]:
            name = body.split("(", 1)[0]
            writes = len(re.findall(r"INSERT INTO awa\.done_entries\b", body))
            counted = len(re.findall(r"INSERT INTO awa\.done_counts\b", body))
            assert counted >= min(writes, 1), f"{path.name}: {name} writes history uncounted"
            assert counted >= writes or "UNION ALL SELECT * FROM terminal" in body, name


def test_folds_keep_counts_exact_past_a_transaction_still_running(conn: Conn) -> None:
    for _ in range(3):
        complete(conn, "a", 4)
    complete(conn, "b", 2)
    assert counts(conn) == truth(conn) == {("a", "completed"): 12, ("b", "completed"): 2}
    # A writer whose transaction is still open when the leader folds.
    with pg(autocommit=False) as late:
        complete(late, "a", 5)
        assert conn.execute("SELECT awa.done_counts_fold_v1(1)").fetchone()[0] >= 1  # type: ignore[index]
        assert counts(conn) == {("a", "completed"): 12, ("b", "completed"): 2}
        late.commit()
    assert counts(conn) == truth(conn) == {("a", "completed"): 17, ("b", "completed"): 2}
    # The next fold takes the late writer in, once.
    conn.execute("SELECT awa.done_counts_fold_v1(1)")
    complete(conn, "a", 1)
    assert counts(conn) == truth(conn) == {("a", "completed"): 18, ("b", "completed"): 2}
    folds = conn.execute(
        "SELECT count(*) FROM awa.done_counts WHERE folded_before IS NOT NULL"
    ).fetchone()
    assert folds is not None and folds[0] >= 2
    # Keys with fewer deltas than p_min since their fold are left as they are.
    assert conn.execute("SELECT awa.done_counts_fold_v1(256)").fetchone() == (0,)
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="p_min"):
        conn.execute("SELECT awa.done_counts_fold_v1(0)")


def test_a_pruned_slot_takes_its_counts_along(conn: Conn) -> None:
    complete(conn, "a", 3)
    [[slot]] = conn.execute("SELECT DISTINCT ready_slot FROM awa.done_entries").fetchall()
    conn.execute("SELECT awa.done_counts_fold_v1(1)")
    for table in conn.execute("SELECT unnest(awa._ring_children_v1('queue', %s))", [slot]):
        conn.execute(f"TRUNCATE awa.{table[0]}")  # what prune does, once nothing is live
    assert counts(conn) == truth(conn) == {}


def test_a_database_from_before_gets_its_counts_from_its_history(conn: Conn) -> None:
    complete(conn, "a", 3)
    complete(conn, "b", 2)
    jobs = [{"kind": "k", "queue": "b", "args": {"args": [], "kwargs": {}}}]
    [(job_id, _)] = enqueue_sql(conn, json.dumps(jobs))
    assert conn.execute("SELECT awa.cancel_v1(%s)", [job_id]).fetchone() == ("available",)
    conn.execute("DROP TABLE awa.done_counts")  # the layout before counts
    conn.execute(sql_file("upgrades.sql"))
    expected = {("a", "completed"): 3, ("b", "completed"): 2, ("b", "cancelled"): 1}
    assert counts(conn) == truth(conn) == expected


def test_the_leader_folds_a_key_with_enough_deltas(
    conn: Conn, caplog: pytest.LogCaptureFixture
) -> None:
    complete(conn, "a", 2)
    before = counts(conn)
    [[slot]] = conn.execute("SELECT DISTINCT ready_slot FROM awa.done_entries").fetchall()
    conn.execute(
        "INSERT INTO awa.done_counts (ready_slot, queue, state, n) "
        "SELECT %s, 'a', 'completed', 0 FROM generate_series(1, 300)",
        [slot],
    )

    async def fold() -> None:
        leader = Maintenance(MaintenanceSettings.from_settings(), uuid.uuid4())
        try:
            await leader._run_task("counts", leader._fold_counts)
        finally:
            await leader.link.close()

    with caplog.at_level(logging.WARNING, "awa_django.maintenance"):
        asyncio.run(fold())
    assert caplog.text == ""
    assert conn.execute(
        "SELECT count(*) FROM awa.done_counts WHERE folded_before IS NOT NULL"
    ).fetchone() == (1,)
    assert counts(conn) == before == truth(conn)
