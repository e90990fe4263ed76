"""Migration 0017 (a leaner claim, issue 14, fourth pass): awa.claim_v3 with its run statement
for queues without kind limits rewritten as one window, the flow limits read by its first
statement and each lane's last position read once (scripts/gen_claim_lean) decides exactly as
0016's body, through weights, serial keys, gaps, cancels and both rings' rotations
(docs/performance.md, "Claim, fourth pass")."""

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

from tests.factories import WORKER, enqueue_sql
from tests.helpers import pg

pytestmark = [
    pytest.mark.storage,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("clean_awa"),
]

ROOT = Path(__file__).resolve().parent.parent
REVERSE = ROOT / "awa_django" / "sql" / "reverse" / "0017_claim_lean.sql"
SCHEMA = "awa_ref0017"


def test_the_generated_migration_is_what_the_script_writes() -> None:
    """0017_claim_lean.sql and its reverse are the output of scripts/gen_claim_lean (which
    asserts that each statement it replaces matches 0016's text as often as expected)."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_claim_lean"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.fixture
def reference() -> Iterator[None]:
    """0016's claim_v3 (from 0017's reverse script) as a function of a scratch schema."""
    text = REVERSE.read_text(encoding="utf-8")
    at = text.index("-- Claim jobs of one queue within its flow limits")
    claim = text[at : text.index("\n$$;\n", at) + len("\n$$;\n")]
    with pg() as conn:
        conn.execute(f"CREATE SCHEMA {SCHEMA}")
        conn.execute(claim.replace("FUNCTION awa.claim_v3(", f"FUNCTION {SCHEMA}.claim_v3("))
    try:
        yield
    finally:
        with pg() as conn:
            conn.execute(f"DROP SCHEMA {SCHEMA} CASCADE")


CLAIM = "SELECT * FROM {schema}.claim_v3(%s, %s, %s, 60, %s, %s)"


#: What a claim wrote in its transaction (claimed_at is the transaction's now() on a queue
#: without a rate limit): its claims, and the closures and parked rows of jobs it parked.
WRITTEN = """
SELECT (SELECT array_agg(c ORDER BY c.job_id, c.run_lease) FROM awa.claims c
        WHERE c.claimed_at = now()),
       (SELECT count(*) FROM awa.claim_closures),
       (SELECT count(*) FROM awa.serial_waiting)
"""


def _both(conn: psycopg.Connection[Any], params: list[Any]) -> list[tuple[Any, ...]]:
    """The claim with 0016's body, rolled back, then with awa's, in one transaction (one
    now()): the rows returned and the rows written must be equal column for column. Returns
    awa's (committed)."""
    with conn.transaction():
        with conn.transaction() as savepoint:
            ref = conn.execute(CLAIM.format(schema=SCHEMA), params).fetchall()
            ref_written = conn.execute(WRITTEN).fetchone()
            raise psycopg.Rollback(savepoint)
        new = conn.execute(CLAIM.format(schema="awa"), params).fetchall()
        new_written = conn.execute(WRITTEN).fetchone()
    assert new == ref
    assert new_written == ref_written
    return new


def _jobs(rnd: random.Random, n: int, dense: bool) -> str:
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
def test_claims_equal_0016s_through_weights_serial_keys_gaps_and_rotations(
    kind_limits: bool, dense: bool
) -> None:
    """A seeded random walk: producers on two connections (several lanes, two priorities),
    jobs with weights (some above the claim's units or its weight cap) and serial keys, a third
    producer whose transactions are rolled back (gaps) or left open across a claim (a gap at the
    end, in flight), cancels (tombstones), claims of 1 to 8 units with and without a weight cap
    and a default deadline, completions, and both rings rotated (with and without cursor
    markers) and pruned. Every claim returns what 0016's body returns on the same state. With a
    kind limited (not one the walk enqueues), the claim takes the full statement, not the lean
    one; the first statement's reading of the kinds decides which. ``dense``: one producer (one
    lane), more weights and serial keys, and a cancel on most steps, anywhere in the first
    rows of the lane, so that tombstoned rows (with and without serial keys) sit inside the runs
    claimed."""
    rnd = random.Random(17)
    held: list[tuple[int, int, int]] = []
    claimed: list[int] = []
    lean = 0
    with pg() as a, pg() as b, pg(autocommit=False) as d, pg(autocommit=False) as c:
        if kind_limits:
            a.execute("INSERT INTO awa.flow_kind_limits (kind, max_running) VALUES ('other', 5)")
        for step in range(260):
            if rnd.random() < 0.5:
                producer = a if dense or rnd.random() < 0.6 else b
                enqueue_sql(producer, _jobs(rnd, rnd.randint(1, 5), dense))
            in_flight = rnd.random() < 0.1
            if in_flight or rnd.random() < 0.05:
                enqueue_sql(d, _jobs(rnd, rnd.randint(1, 3), dense))
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
            rows = _both(c, params)
            if in_flight:
                d.commit()
            jobs = [(r[0], r[1], r[4]) for r in rows if r[0] is not None]
            lean += bool(jobs)
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
            rows = _both(c, ["q", 8, WORKER, None, None])
            if not [r for r in rows if r[0] is not None]:
                break
    assert lean > 100, lean


@pytest.mark.usefixtures("reference")
def test_a_queue_limit_read_by_the_first_statement_binds_as_before() -> None:
    """A queue with a concurrency limit (read with the ring slots now): a claim of more units
    than the limit takes as many jobs as permits, with a marker row, as 0016's body does (the
    permits are session locks: the reference's are released before awa's claim runs)."""
    with pg() as a, pg(autocommit=False) as c:
        enqueue_sql(a, json.dumps([{"kind": "k", "queue": "q"}] * 5))
        a.execute("INSERT INTO awa.flow_limits (queue, max_running) VALUES ('q', 2)")
        with c.transaction():
            with c.transaction() as savepoint:
                c.execute("SELECT setseed(0.25)")
                ref = c.execute(CLAIM.format(schema=SCHEMA), ["q", 4, WORKER, None, None])
                ref_rows = ref.fetchall()
                raise psycopg.Rollback(savepoint)
            c.execute("SELECT pg_advisory_unlock_all()")
            c.execute("SELECT setseed(0.25)")
            new = c.execute(CLAIM.format(schema="awa"), ["q", 4, WORKER, None, None]).fetchall()
        assert new == ref_rows
        assert [r[0] is not None for r in new] == [True, True, False]
