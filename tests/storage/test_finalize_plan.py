"""finalize_v2 finds each outcome's claim through the claims' index even when its session made its
(generic, kept) plan while the claim partitions were empty (``enable_seqscan = off`` in its
definition): a plan made then would scan the whole partition on every later call, so a drain's
finalizes would grow with the claims already made."""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest

from tests.support.database import pg

pytestmark = [pytest.mark.storage, pytest.mark.usefixtures("clean_awa")]


def claim(conn: psycopg.Connection[Any], n: int) -> list[tuple[int, int, int]]:
    rows = conn.execute(
        "SELECT job_id, run_lease, claim_slot FROM awa.claim_v3('plan', %s)", [n]
    ).fetchall()
    return [(r[0], r[1], r[2]) for r in rows]


def enqueue(conn: psycopg.Connection[Any], n: int) -> None:
    jobs = json.dumps([{"kind": "k", "queue": "plan"}] * n)
    conn.execute("SELECT count(*) FROM awa.enqueue_v1(%s::jsonb)", [jobs])


def finalize(conn: psycopg.Connection[Any], rows: list[tuple[int, int, int]]) -> None:
    items = [{"id": j, "lease": lease, "slot": s, "outcome": "completed"} for j, lease, s in rows]
    stale = conn.execute("SELECT * FROM awa.finalize_v2(%s::jsonb)", [json.dumps(items)])
    assert stale.fetchall() == []


def test_finalize_v2_runs_with_sequential_scans_off() -> None:
    with pg() as conn:
        row = conn.execute(
            "SELECT proconfig FROM pg_proc WHERE oid = 'awa.finalize_v2(jsonb)'::regprocedure"
        ).fetchone()
    assert row is not None
    assert "enable_seqscan=off" in row[0]
    assert "plan_cache_mode=force_generic_plan" in row[0]


def test_a_plan_made_on_empty_claim_partitions_still_probes_the_index() -> None:
    with pg() as conn:
        try:
            conn.execute("LOAD 'auto_explain'")
        except psycopg.Error as exc:  # pragma: no cover - a server without the contrib module
            pytest.skip(f"auto_explain is not available: {exc}")
        conn.execute("VACUUM ANALYZE awa.claims")
        enqueue(conn, 1)
        finalize(conn, claim(conn, 1))  # this session's plan is made here, claims near empty
        enqueue(conn, 3000)
        rows = claim(conn, 3000)
        plans: list[str] = []
        conn.add_notice_handler(lambda notice: plans.append(notice.message_primary or ""))
        conn.execute(
            "SET auto_explain.log_min_duration = 0; SET auto_explain.log_nested_statements = on;"
            " SET client_min_messages = log"
        )
        finalize(conn, rows[:5])
        conn.execute("SET client_min_messages = notice; SET auto_explain.log_min_duration = -1")
        finalize(conn, rows[5:])
    text = "\n".join(plans)
    assert "INSERT INTO awa.claim_closures" in text  # the statement's plan was logged
    assert "Seq Scan on claims_" not in text, text
