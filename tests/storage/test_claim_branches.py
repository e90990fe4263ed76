"""The claim's and the finalize's per-slot statements (awa_django/sql/functions/, rendered once
per ring slot between ``--@each`` and ``--@end``) decide exactly as the generic statements of
their ELSE branches, through weights, serial keys, gaps, cancels and every kind of ring rotation
(random walks), and a one-job claim locks what it reads, not every ring partition
(docs/design/static-per-slot-statements.md)."""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from awa_django.db import storage
from awa_django.db.storage import Finalization
from awa_django.sql import RING_SLOTS, render
from tests.support.database import pg
from tests.support.factories import WORKER, enqueue_sql

pytestmark = [
    pytest.mark.storage,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("clean_awa"),
]

SCHEMA = "awa_generic"


def _generic(path: str, name: str) -> str:
    """Function ``name`` of schema file ``path`` rendered with per-slot branches for a slot that
    never exists (9999): every call takes the generic ELSE branch. In schema awa_generic."""
    from importlib import resources

    text = (resources.files("awa_django.sql") / path).read_text(encoding="utf-8")
    text = render(text, RING_SLOTS, {ring: [9999] for ring in RING_SLOTS})
    at = re.search(rf"^CREATE OR REPLACE FUNCTION awa\.{name}\(", text, re.M)
    assert at is not None
    block = text[at.start() : text.index("\n$$;\n", at.start()) + len("\n$$;\n")]
    assert "9999" in block and "_0 " not in block
    return block.replace(f"FUNCTION awa.{name}(", f"FUNCTION {SCHEMA}.{name}(")


@pytest.fixture
def reference() -> Iterator[None]:
    """claim_v3 and finalize_v2 with their generic statements only, in a scratch schema (their
    statements name the awa tables)."""
    with pg() as conn:
        conn.execute(f"CREATE SCHEMA {SCHEMA}")
        conn.execute(_generic("functions/claim.sql", "claim_v3"))
        conn.execute(_generic("functions/finalize.sql", "finalize_v2"))
    try:
        yield
    finally:
        with pg() as conn:
            conn.execute(f"DROP SCHEMA {SCHEMA} CASCADE")


CLAIM5 = "SELECT * FROM {schema}.claim_v3(%s, %s, %s, 60, %s, %s)"


#: What a claim wrote in its transaction (claimed_at is the transaction's now() on a queue
#: without a rate limit): its claims, and the closures and parked rows of jobs it parked.
WRITTEN = """
SELECT (SELECT array_agg(c ORDER BY c.job_id, c.run_lease) FROM awa.claims c
        WHERE c.claimed_at = now()),
       (SELECT count(*) FROM awa.claim_closures),
       (SELECT count(*) FROM awa.serial_waiting)
"""


def _claim_both(conn: psycopg.Connection[Any], params: list[Any]) -> list[tuple[Any, ...]]:
    """The claim with the generic statements, rolled back, then with awa's, in one transaction (one
    now()): the rows returned and the rows written must be equal column for column. Returns
    awa's (committed)."""
    with conn.transaction():
        with conn.transaction() as savepoint:
            ref = conn.execute(CLAIM5.format(schema=SCHEMA), params).fetchall()
            ref_written = conn.execute(WRITTEN).fetchone()
            raise psycopg.Rollback(savepoint)
        new = conn.execute(CLAIM5.format(schema="awa"), params).fetchall()
        new_written = conn.execute(WRITTEN).fetchone()
    assert new == ref
    assert new_written == ref_written
    return new


def _walk_jobs(rnd: random.Random, n: int, dense: bool) -> str:
    jobs = []
    for i in range(n):
        meta: dict[str, Any] = {}
        if rnd.random() < (0.45 if dense else 0.25):
            meta["awa:weight"] = rnd.choice([2, 3, 7])
        if rnd.random() < (0.2 if dense else 0.1):
            meta["awa:serial"] = rnd.choice(["x", "y"])
        job: dict[str, Any] = {
            "kind": "k",
            "queue": "q",
            "priority": rnd.choice([0, 0, 5]),
            "args": {"args": [i], "kwargs": {}},
            "metadata": meta or None,
        }
        if rnd.random() < 0.2:
            job["deadline"] = rnd.choice([5, 3600])
        jobs.append(job)
    return json.dumps(jobs)


@pytest.mark.usefixtures("reference")
@pytest.mark.parametrize(
    ("kind_limits", "dense"),
    [(False, False), (True, False), (False, True)],
    ids=["no-kind-limits", "a-kind-limited", "one-lane-many-cancels"],
)
def test_claims_equal_the_generic_statements_through_weights_serial_keys_gaps_and_rotations(
    kind_limits: bool, dense: bool
) -> None:
    """A seeded random walk: producers on two connections (several lanes, two priorities),
    jobs with weights (some above the claim's units or its weight cap) and serial keys, a third
    producer whose transactions are rolled back (gaps) or left open across a claim (a gap at the
    end, in flight), cancels (tombstones), claims of 1 to 8 units with and without a weight cap
    and a default deadline, completions, and both rings rotated (with and without cursor
    markers) and pruned. Every claim returns what the generic statements return on the same
    state. With a kind limited (not one the walk enqueues), the claim takes its run statement
    with kind permits, not the one used while no kind has limits; the first statement's reading
    of the kinds decides which. ``dense``: one producer (one lane), more weights and serial
    keys, and a cancel on most steps, anywhere in the first rows of the lane, so that tombstoned
    rows (with and without serial keys) sit inside the runs claimed."""
    rnd = random.Random(17)
    held: list[tuple[int, int, int]] = []
    claimed: list[int] = []
    took_jobs = 0
    with pg() as a, pg() as b, pg(autocommit=False) as d, pg(autocommit=False) as c:
        if kind_limits:
            a.execute("INSERT INTO awa.flow_kind_limits (kind, max_running) VALUES ('other', 5)")
        for step in range(260):
            if rnd.random() < 0.5:
                producer = a if dense or rnd.random() < 0.6 else b
                enqueue_sql(producer, _walk_jobs(rnd, rnd.randint(1, 5), dense))
            in_flight = rnd.random() < 0.1
            if in_flight or rnd.random() < 0.05:
                enqueue_sql(d, _walk_jobs(rnd, rnd.randint(1, 3), dense))
                if not in_flight:
                    d.rollback()
            if rnd.random() < (0.6 if dense else 0.15):
                # Near the cursors, and half the time a job with a serial key (a tombstoned
                # serial key neither stops the run nor is the first one left).
                row = a.execute(
                    "SELECT j.id FROM awa.live_jobs j WHERE j.state = 'available' "
                    "AND (%s OR j.metadata ? 'awa:serial') ORDER BY j.id LIMIT 1 OFFSET %s",
                    [rnd.random() < 0.5, rnd.randint(0, 6 if dense else 3)],
                ).fetchone()
                if row is not None:
                    a.execute("SELECT awa.cancel_v1(%s)", [row[0]])
            params = [
                "q",
                rnd.choice([1, 1, 1, 2, 3, 8]),
                WORKER,
                rnd.choice([None, None, 30.0]),
                rnd.choice([None, None, 2]),
            ]
            rows = _claim_both(c, params)
            if in_flight:
                d.commit()
            jobs = [(r[0], r[1], r[4]) for r in rows if r[0] is not None]
            took_jobs += bool(jobs)
            claimed += [j for j, _, _ in jobs]
            assert len(claimed) == len(set(claimed)), f"step {step}: a job twice"
            done = [j for j in jobs if rnd.random() < 0.85]
            held += [j for j in jobs if j not in done]
            if held and rnd.random() < 0.15:
                done.append(held.pop(0))
            if done:
                items = json.dumps(
                    [{"id": j, "lease": le, "slot": s, "outcome": "completed"} for j, le, s in done]
                )
                c.execute("SELECT * FROM awa.finalize_v2(%s::jsonb)", [items]).fetchall()
                c.commit()
            if rnd.random() < 0.3:
                a.execute("SELECT awa.prune_v1('claim')")
                a.execute(f"SELECT awa.{rnd.choice(['rotate_v2', 'rotate_v3'])}('claim')")
            if rnd.random() < 0.12:
                a.execute("SELECT awa.prune_v1('queue')")
                a.execute("SELECT awa.rotate_v3('queue')")
        d.rollback()
        for _ in range(100):  # then everything left
            rows = _claim_both(c, ["q", 8, WORKER, None, None])
            if not [r for r in rows if r[0] is not None]:
                break
    assert took_jobs > 100, took_jobs


@pytest.mark.usefixtures("reference")
def test_a_queue_limit_read_by_the_first_statement_binds_as_the_generic_claim() -> None:
    """A queue with a concurrency limit (read with the ring slots now): a claim of more units
    than the limit takes as many jobs as permits, with a marker row, as the generic claim does
    (the permits are session locks: the reference's are released before awa's claim runs)."""
    with pg() as a, pg(autocommit=False) as c:
        enqueue_sql(a, json.dumps([{"kind": "k", "queue": "q"}] * 5))
        a.execute("INSERT INTO awa.flow_limits (queue, max_running) VALUES ('q', 2)")
        with c.transaction():
            with c.transaction() as savepoint:
                c.execute("SELECT setseed(0.25)")
                ref = c.execute(CLAIM5.format(schema=SCHEMA), ["q", 4, WORKER, None, None])
                ref_rows = ref.fetchall()
                raise psycopg.Rollback(savepoint)
            c.execute("SELECT pg_advisory_unlock_all()")
            c.execute("SELECT setseed(0.25)")
            new = c.execute(CLAIM5.format(schema="awa"), ["q", 4, WORKER, None, None]).fetchall()
        assert new == ref_rows
        assert [r[0] is not None for r in new] == [True, True, False]


def _jobs(n: int, priority: int) -> str:
    return json.dumps(
        [
            {"kind": "k", "queue": "q", "priority": priority, "args": {"args": [i], "kwargs": {}}}
            for i in range(n)
        ]
    )


def _both(conn: psycopg.Connection[Any], sql: str, params: list[Any]) -> list[tuple[Any, ...]]:
    """Run ``sql`` with the generic function, roll it back, then with awa's: one
    transaction (one now()), so the rows must be equal column for column. Returns awa's."""
    with conn.transaction():
        with conn.transaction() as savepoint:
            ref = conn.execute(sql.format(schema=SCHEMA), params).fetchall()
            raise psycopg.Rollback(savepoint)
        new = conn.execute(sql.format(schema="awa"), params).fetchall()
    assert new == ref
    return new


CLAIM = "SELECT * FROM {schema}.claim_v3(%s, %s, %s)"
FINALIZE = "SELECT * FROM {schema}.finalize_v2(%s::jsonb)"


@pytest.mark.usefixtures("reference")
@pytest.mark.parametrize("kind_limits", [False, True], ids=["no-kind-limits", "a-kind-limited"])
def test_claims_and_finalizes_equal_the_generic_statements_through_every_rotation(
    kind_limits: bool,
) -> None:
    """A seeded random walk: producers on two connections (so several lanes, two priorities),
    cancels (tombstones right above a cursor and further up), claims of 1 to 6 jobs, completions
    (some attempts held open across many rotations, so carried forward), and each ring rotated
    with and without cursor markers (rotate_v3 / rotate_v2) and pruned, the claim ring through
    several wraps, the queue ring through more than one. Every claim and every finalize returns
    what the generic statements return on the same state, and every job is claimed exactly once.
    With a kind limited (not the walk's: its permits are session locks, which a rolled-back
    claim would keep), the claim runs its run statement with kind permits rather than the one
    used while no kind has limits."""
    rnd = random.Random(15)
    enqueued: list[int] = []
    claimed_ids: list[int] = []
    cancelled: set[int] = set()
    held: list[tuple[int, int, int]] = []
    claim_wraps = queue_wraps = 0
    with pg() as a, pg() as b, pg(autocommit=False) as c:
        if kind_limits:
            a.execute("INSERT INTO awa.flow_kind_limits (kind, max_running) VALUES ('other', 5)")
        for step in range(220):
            if rnd.random() < 0.5:
                producer = a if rnd.random() < 0.6 else b
                batch = _jobs(rnd.randint(1, 5), rnd.choice([0, 0, 5]))
                enqueued += [i for i, _ in enqueue_sql(producer, batch)]
            if rnd.random() < 0.1:
                waiting = [i for i in enqueued if i not in set(claimed_ids) | cancelled]
                if waiting:
                    job = rnd.choice(waiting[:3] if rnd.random() < 0.5 else waiting)
                    a.execute("SELECT awa.cancel_v1(%s)", [job])
                    cancelled.add(job)
            rows = _both(c, CLAIM, ["q", rnd.choice([1, 1, 2, 6]), WORKER])
            jobs = [(r[0], r[1], r[4]) for r in rows if r[0] is not None]
            claimed_ids += [j for j, _, _ in jobs]
            assert len(claimed_ids) == len(set(claimed_ids)), f"step {step}: a job twice"
            done = [j for j in jobs if rnd.random() < 0.85]
            held += [j for j in jobs if j not in done]
            if held and rnd.random() < 0.15:
                done.append(held.pop(0))
            if done:
                items = json.dumps(
                    [{"id": j, "lease": le, "slot": s, "outcome": "completed"} for j, le, s in done]
                )
                assert _both(c, FINALIZE, [items]) == []
            if rnd.random() < 0.35:
                a.execute("SELECT awa.prune_v1('claim')")
                rotate = rnd.choice(["rotate_v2", "rotate_v3"])
                out = a.execute(f"SELECT awa.{rotate}('claim')").fetchone()
                claim_wraps += out == ("rotated",)
            if rnd.random() < 0.15:
                a.execute("SELECT awa.prune_v1('queue')")
                out = a.execute("SELECT awa.rotate_v3('queue')").fetchone()
                queue_wraps += out == ("rotated",)
        # Then everything left: the walk ends with every job claimed once, cancelled ones never.
        for _ in range(100):
            rows = _both(c, CLAIM, ["q", 6, WORKER])
            if not [r for r in rows if r[0] is not None]:
                break
            claimed_ids += [r[0] for r in rows if r[0] is not None]
    assert claim_wraps > 16 and queue_wraps > 16, (claim_wraps, queue_wraps)
    assert sorted(claimed_ids) == sorted(set(enqueued) - cancelled)


def _relation_locks(conn: psycopg.Connection[Any], sql: str, params: list[Any]) -> int:
    """The relation locks ``sql`` took, in a transaction of ``conn`` that is rolled back."""
    conn.execute(sql, params).fetchall()
    row = conn.execute(
        "SELECT count(*) FROM pg_locks WHERE pid = pg_backend_pid() "
        "AND locktype = 'relation' AND relation <> 'pg_locks'::regclass"
    ).fetchone()
    conn.rollback()
    assert row is not None
    return int(row[0])


def _four_lanes(producers: list[psycopg.Connection[Any]], n: int) -> None:
    for p in producers:  # four producer transactions open at once: four lanes
        p.execute("BEGIN")
        enqueue_sql(p, _jobs(n, 0))
    for p in producers:
        p.execute("COMMIT")


def test_a_one_job_claim_and_its_finalize_lock_what_they_read() -> None:
    """A one-job claim of a 4-shard queue with 4 lanes of work, after a claim-ring rotation
    (each lane with its cursor marker in the new slot), and its finalize, lock the current
    slots' partitions (and the small control tables), not each of the 16 ready, 16 tombstone
    and 8 claim partitions: the generic claim took ~75 relation locks, the finalize ~25."""
    with pg() as a, pg() as b, pg() as d, pg() as e, pg(autocommit=False) as c:
        producers = [a, b, d, e]
        enqueue_sql(a, _jobs(1, 0))  # the queue and its lanes exist before the open producers
        _four_lanes(producers, 4)
        done = storage.claim(a, "q", 17, WORKER)
        storage.finalize(
            a, [Finalization(j.job_id, j.run_lease, j.claim_slot, "completed") for j in done]
        )
        assert a.execute("SELECT awa.rotate_v3('claim')").fetchone() == ("rotated",)
        _four_lanes(producers, 4)
        lanes = a.execute("SELECT count(DISTINCT lane_id) FROM awa.ready_entries").fetchone()
        assert lanes == (4,)
        claim_sql = "SELECT job_id, run_lease, claim_slot FROM awa.claim_v3('q', 1)"
        for _ in range(3):  # plans cached
            [(job, lease, slot)] = c.execute(claim_sql).fetchall()
            c.commit()
            storage.finalize(c, [Finalization(job, lease, slot, "completed")])
            c.commit()
        assert _relation_locks(c, claim_sql, []) <= 30
        [(job, lease, slot)] = c.execute(claim_sql).fetchall()
        c.commit()
        items = json.dumps([{"id": job, "lease": lease, "slot": slot, "outcome": "completed"}])
        assert _relation_locks(c, "SELECT * FROM awa.finalize_v2(%s::jsonb)", [items]) <= 12
