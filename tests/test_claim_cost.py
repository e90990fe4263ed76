"""Migration 0016 (a cheaper claim, issue 14): awa.claim_v3 and awa.finalize_v2 with their
statements split into per-slot branches (scripts/gen_claim_cost) decide exactly as the bodies
they replace, through every kind of ring rotation, and lock what they read, not every ring
partition (docs/performance.md, "Claim and finalize")."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from awa_django.db import storage
from awa_django.db.storage import Finalization
from tests.factories import WORKER, enqueue_sql
from tests.helpers import pg

pytestmark = [
    pytest.mark.storage,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("clean_awa"),
]

ROOT = Path(__file__).resolve().parent.parent
REVERSE = ROOT / "awa_django" / "sql" / "reverse" / "0016_claim_cost.sql"


def test_the_generated_migration_is_what_the_script_writes() -> None:
    """0016_claim_cost.sql and its reverse are the output of scripts/gen_claim_cost (which
    asserts that each statement it splits matches its released source exactly once)."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_claim_cost"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def _block(text: str, start: str) -> str:
    at = text.index(start)
    return text[at : text.index("\n$$;\n", at) + len("\n$$;\n")]


@pytest.fixture
def reference() -> Iterator[None]:
    """The bodies 0016 replaced (claim_v3 of 0013, finalize_v2 of 0004), from the reverse
    script, as functions of a scratch schema (their statements name the awa tables)."""
    text = REVERSE.read_text(encoding="utf-8")
    claim = _block(text, "-- Claim jobs of one queue within its flow limits")
    finalize = _block(text, "-- Finalize a batch of attempts:")
    with pg() as conn:
        conn.execute("CREATE SCHEMA awa_ref0016")
        conn.execute(claim.replace("FUNCTION awa.claim_v3(", "FUNCTION awa_ref0016.claim_v3("))
        conn.execute(
            finalize.replace("FUNCTION awa.finalize_v2(", "FUNCTION awa_ref0016.finalize_v2(")
        )
    try:
        yield
    finally:
        with pg() as conn:
            conn.execute("DROP SCHEMA awa_ref0016 CASCADE")


def _jobs(n: int, priority: int) -> str:
    return json.dumps(
        [
            {"kind": "k", "queue": "q", "priority": priority, "args": {"args": [i], "kwargs": {}}}
            for i in range(n)
        ]
    )


def _both(conn: psycopg.Connection[Any], sql: str, params: list[Any]) -> list[tuple[Any, ...]]:
    """Run ``sql`` with the reference schema's function, roll it back, then with awa's: one
    transaction (one now()), so the rows must be equal column for column. Returns awa's."""
    with conn.transaction():
        with conn.transaction() as savepoint:
            ref = conn.execute(sql.format(schema="awa_ref0016"), params).fetchall()
            raise psycopg.Rollback(savepoint)
        new = conn.execute(sql.format(schema="awa"), params).fetchall()
    assert new == ref
    return new


CLAIM = "SELECT * FROM {schema}.claim_v3(%s, %s, %s)"
FINALIZE = "SELECT * FROM {schema}.finalize_v2(%s::jsonb)"


@pytest.mark.usefixtures("reference")
@pytest.mark.parametrize("kind_limits", [False, True], ids=["no-kind-limits", "a-kind-limited"])
def test_claims_and_finalizes_equal_the_replaced_bodies_through_every_rotation(
    kind_limits: bool,
) -> None:
    """A seeded random walk: producers on two connections (so several lanes, two priorities),
    cancels (tombstones right above a cursor and further up), claims of 1 to 6 jobs, completions
    (some attempts held open across many rotations, so carried forward), and each ring rotated
    with and without cursor markers (rotate_v3 / rotate_v2) and pruned, the claim ring through
    several wraps, the queue ring through more than one. Every claim and every finalize returns
    what the replaced body returns on the same state, and every job is claimed exactly once.
    With a kind limited (not the walk's: its permits are session locks, which a rolled-back
    claim would keep), the claim runs its full statement rather than the lean one."""
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
    and 8 claim partitions: 0013's claim took ~75 relation locks, 0004's finalize ~25."""
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
