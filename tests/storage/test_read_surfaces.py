"""Read surfaces: the same answers as simple definitions that read history without bounds,
at a bounded cost.

* Every job in every plane, built through the engine's own functions, reads the same through
  the installed views and functions as through the simple definitions (re-created here as
  temporary objects from tests/storage/reference_sql/read_surfaces_simple.sql).
* Counts of terminal history are exact (tests/storage/test_history_counts.py for their folds).
* The cost of every surface the admin, the commands and get_result use does not grow with
  terminal history: tripling history changes the pages a surface reads by a few index pages,
  where a scan of history would read thousands; with fresh statistics and with statistics
  taken while every table was empty.
* The plan shapes that once made these surfaces quadratic do not come back.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from awa_django.db import storage
from awa_django.db.storage import Finalization
from tests.support.database import pg
from tests.support.factories import WORKER, enqueue_sql

pytestmark = [
    pytest.mark.storage,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("clean_awa"),
]

Conn = psycopg.Connection[Any]


# The simple definitions, as temporary objects --------------------------------------------------

REFERENCE = Path(__file__).resolve().parent / "reference_sql" / "read_surfaces_simple.sql"


def _statement(head: str) -> str:
    """The statement of the reference file that starts with ``head``."""
    text = REFERENCE.read_text(encoding="utf-8")
    start = text.index(head)
    if "$$" in text[start : text.index(";", start)]:
        end = text.index("$$;", text.index("$$", start) + 2) + 3
    else:
        end = text.index(";", start) + 1
    return text[start:end]


def install_reference(conn: Conn) -> None:
    """ref_live_jobs, ref_terminal_jobs, ref_jobs, pg_temp.ref_queue_counts_v1(),
    pg_temp.ref_queue_stats_v1() and pg_temp.ref_throughput_v1(): the reference text."""
    names = {
        "awa.live_jobs": "ref_live_jobs",
        "awa.terminal_jobs": "ref_terminal_jobs",
        "awa.queue_counts_v1()": "pg_temp.ref_queue_counts_v1()",
    }

    def renamed(sql: str) -> str:
        for old, new in names.items():
            sql = sql.replace(old, new)
        return sql

    conn.execute(
        renamed(_statement("CREATE VIEW awa.terminal_jobs")).replace(
            "CREATE VIEW ref_terminal_jobs", "CREATE TEMP VIEW ref_terminal_jobs"
        )
    )
    conn.execute(
        renamed(_statement("CREATE VIEW awa.live_jobs")).replace(
            "CREATE VIEW ref_live_jobs", "CREATE TEMP VIEW ref_live_jobs"
        )
    )
    jobs = _statement("CREATE VIEW awa.jobs")
    conn.execute(renamed(jobs).replace("CREATE VIEW awa.jobs", "CREATE TEMP VIEW ref_jobs"))
    for head, name in (
        ("CREATE FUNCTION awa.queue_counts_v1()", "ref_queue_counts_v1"),
        ("CREATE FUNCTION awa.queue_stats_v1()", "ref_queue_stats_v1"),
        ("CREATE FUNCTION awa.throughput_v1(", "ref_throughput_v1"),
    ):
        sql = _statement(head)
        sql = re.sub(r"CREATE FUNCTION awa\.\w+", f"CREATE FUNCTION pg_temp.{name}", sql, count=1)
        conn.execute(renamed(sql))


# Data built through the engine -----------------------------------------------------------------


def enqueue(conn: Conn, queue: str, n: int, **extra: Any) -> list[int]:
    jobs = [
        {"kind": f"k.{queue}.{i % 3}", "queue": queue, "args": {"args": [i], "kwargs": {}}, **extra}
        for i in range(n)
    ]
    return [job_id for job_id, _ in enqueue_sql(conn, json.dumps(jobs))]


def finalize(conn: Conn, claimed: list[storage.ClaimedJob], outcome: str, **kw: Any) -> None:
    assert (
        storage.finalize(
            conn,
            [Finalization(c.job_id, c.run_lease, c.claim_slot, outcome, **kw) for c in claimed],
        )
        == []
    )


def mixed_jobs(conn: Conn) -> dict[str, list[int]]:
    """Jobs in every place, in three queues (``c`` without a DLQ), every way of getting there."""
    conn.execute("SELECT awa.ensure_lanes_v1('c', 0)")
    conn.execute("UPDATE awa.queue_meta SET dlq_enabled = false WHERE queue = 'c'")
    made: dict[str, list[int]] = {}
    for queue in ("a", "b", "c"):
        enqueue(conn, queue, 40)
        enqueue(conn, queue, 5, priority=10)
        enqueue(conn, queue, 4, delay=3600)  # scheduled
        claimed = storage.claim(conn, queue, 30, WORKER)
        finalize(conn, claimed[:10], "completed", result_json='{"ok": true}')
        finalize(conn, claimed[10:13], "retry", error={"message": "again"})  # retryable
        finalize(conn, claimed[13:16], "fail", error={"message": "boom"})  # DLQ, or failed in c
        finalize(conn, claimed[16:18], "snooze", delay=600)  # scheduled again
        finalize(
            conn,
            claimed[18:20],
            "wait",
            callback_id=uuid.uuid4(),
            timeout=3600.0,
        )  # waiting_external
        for c in claimed[20:22]:
            assert conn.execute("SELECT awa.cancel_v1(%s)", [c.job_id]).fetchone() == ("running",)
        storage.heartbeat(conn, [(c.job_id, c.run_lease, '{"step": 1}') for c in claimed[22:24]])
        made.setdefault("running", []).extend(c.job_id for c in claimed[22:30])
    # Cancelled while available (the head of a lane: a marker claim moves its cursor) and while
    # deferred (a wide done row).
    head = conn.execute(
        "SELECT id FROM awa.live_jobs WHERE queue = 'a' AND state = 'available' ORDER BY id LIMIT 3"
    ).fetchall()
    for (job_id,) in head:
        assert conn.execute("SELECT awa.cancel_v1(%s)", [job_id]).fetchone() == ("available",)
    deferred = conn.execute(
        "SELECT job_id FROM awa.deferred_jobs WHERE queue = 'b' ORDER BY job_id LIMIT 2"
    ).fetchall()
    for (job_id,) in deferred:
        assert conn.execute("SELECT awa.cancel_v1(%s)", [job_id]).fetchone() is not None
    # Drained: available and deferred jobs cancelled by queue_drain_v2.
    enqueue(conn, "d", 5)
    enqueue(conn, "d", 2, delay=3600)
    assert conn.execute("SELECT awa.queue_drain_v2('d')").fetchone() == (7,)
    conn.execute("SELECT awa.queue_pause_v1('b', true)")
    return made


HISTORY_SQL = """
WITH lane AS (
    SELECT l.lane_id, l.enqueue_seq FROM awa.queue_lanes l
    WHERE l.queue = 'hist' AND l.priority = 0 ORDER BY l.shard LIMIT 1
), rows AS MATERIALIZED (
    SELECT lane.lane_id, %(start)s + g AS lane_seq, nextval('awa.job_id_seq') AS job_id,
           now() - interval '2 hours' - make_interval(secs => (%(start)s + %(n)s - g) * 0.5) AS at,
           CASE g %% 3 WHEN 0 THEN 'failed' WHEN 1 THEN 'cancelled' ELSE 'completed' END AS state
    FROM lane, generate_series(1, %(n)s) AS g
), ready AS (
    INSERT INTO awa.ready_entries (ready_slot, ready_generation, lane_id, lane_seq, job_id,
                                   priority, attempt, max_attempts, run_lease, queue, kind, args,
                                   run_at, created_at)
    SELECT 1, 1, r.lane_id, r.lane_seq, r.job_id, 0, 0, 25, 0, 'hist', 'hist.kind',
           jsonb_build_object('args', jsonb_build_array(repeat('x', 100)), 'kwargs', '{}'::jsonb),
           r.at - interval '1 second', r.at - interval '1 second'
    FROM rows r
), done AS (
    INSERT INTO awa.done_entries (ready_slot, ready_generation, job_id, run_lease, lane_id,
                                  lane_seq, state, attempt, attempted_at, finalized_at, result,
                                  queue, kind)
    SELECT 1, 1, r.job_id, 1, r.lane_id, r.lane_seq, r.state, 1, r.at, r.at,
           '{"ok": true}', 'hist', 'hist.kind'
    FROM rows r
), counted AS (
    INSERT INTO awa.done_counts (ready_slot, queue, state, n)
    SELECT 1, 'hist', r.state, count(*) FROM rows r GROUP BY r.state
), marker AS (
    INSERT INTO awa.claims (claim_slot, claim_generation, job_id, run_lease, ready_slot,
                            ready_generation, lane_id, lane_seq, attempt)
    SELECT 0, 0, -lane.lane_id, %(start)s + %(n)s, -1, -1, lane.lane_id, %(start)s + %(n)s, 0
    FROM lane
), closed AS (
    INSERT INTO awa.claim_closures (claim_slot, job_id, run_lease, outcome)
    SELECT 0, -lane.lane_id, %(start)s + %(n)s, 'marker' FROM lane
)
SELECT setval(lane.enqueue_seq, %(start)s + %(n)s) FROM lane
"""


def add_history(conn: Conn, start: int, n: int) -> None:
    """n terminal jobs of queue ``hist`` (a third each completed, failed, cancelled), all in queue
    slot 1 (live jobs are in slot 0), spent (below the lane cursor): ready and done rows as the
    engine leaves them, finished half a second apart, from two hours ago into the past (a later
    batch is older: history grows, the last hour does not change)."""
    conn.execute("SELECT awa.ensure_lanes_v1('hist', 0)")
    psycopg.ClientCursor(conn).execute(HISTORY_SQL, {"start": start, "n": n})


def rows(conn: Conn, sql: str, params: Any = None) -> list[tuple[Any, ...]]:
    return sorted(conn.execute(sql, params).fetchall(), key=repr)


@pytest.fixture
def conn() -> Iterator[Conn]:
    with pg() as c:
        c.execute("SET default_transaction_isolation = 'read committed'")
        yield c


# Same answers ------------------------------------------------------------------------------------


def test_views_return_what_the_simple_definitions_return(conn: Conn) -> None:
    made = mixed_jobs(conn)
    add_history(conn, 0, 300)
    install_reference(conn)
    columns = (
        "id, kind, queue, state, priority, attempt, max_attempts, run_lease, args, run_at, "
        "created_at, attempted_at, finalized_at, deadline_at, heartbeat_at, errors, result, "
        "progress, metadata, tags, in_dlq, dlq_reason"
    )
    live = rows(conn, f"SELECT {columns} FROM awa.live_jobs")
    assert live == rows(conn, f"SELECT {columns} FROM ref_live_jobs")
    assert {r[3] for r in live} == {
        "available",
        "running",
        "waiting_external",
        "scheduled",
        "retryable",
    }
    assert rows(conn, "SELECT * FROM awa.terminal_jobs") == rows(
        conn, "SELECT * FROM ref_terminal_jobs"
    )
    everything = rows(conn, f"SELECT {columns} FROM awa.jobs")
    assert everything == rows(conn, f"SELECT {columns} FROM ref_jobs")
    assert {r[3] for r in everything} >= {"completed", "failed", "cancelled"}
    # The filters the admin and get_result use, each answered the same.
    for state in ("available", "running", "waiting_external", "scheduled", "retryable"):
        query = f"SELECT {columns} FROM %s WHERE state = '{state}'"
        assert rows(conn, query % "awa.live_jobs") == rows(conn, query % "ref_live_jobs")
    for queue in ("a", "b", "c", "d", "hist", "nope"):
        query = f"SELECT {columns} FROM %s WHERE queue = '{queue}'"
        assert rows(conn, query % "awa.live_jobs") == rows(conn, query % "ref_live_jobs")
        query = f"SELECT * FROM %s WHERE queue = '{queue}'"
        assert rows(conn, query % "awa.terminal_jobs") == rows(conn, query % "ref_terminal_jobs")
    for kind in ("k.a.0", "k.b.1", "k.c.2", "k.d.0", "hist.kind", "nope"):
        query = f"SELECT * FROM %s WHERE kind = '{kind}'"
        assert rows(conn, query % "awa.terminal_jobs") == rows(conn, query % "ref_terminal_jobs")
    # Every terminal row names its kind itself (every writer copies it): the kind filter is an
    # index range of done_entries, never a read of the bodies.
    assert conn.execute("SELECT count(*) FROM awa.done_entries WHERE kind IS NULL").fetchone() == (
        0,
    )
    assert conn.execute(
        "SELECT count(*) FROM awa.done_entries d JOIN awa.ready_entries r USING "
        "(lane_id, lane_seq, ready_slot) WHERE d.kind IS DISTINCT FROM r.kind"
    ).fetchone() == (0,)
    for (job_id,) in conn.execute("SELECT id FROM ref_jobs ORDER BY id").fetchall():
        query = f"SELECT {columns} FROM %s WHERE id = {job_id}"
        assert rows(conn, query % "awa.jobs") == rows(conn, query % "ref_jobs"), job_id
    assert len(made["running"]) == 24


def test_counts_and_stats_match_the_simple_functions_below_the_cap(conn: Conn) -> None:
    mixed_jobs(conn)
    add_history(conn, 0, 300)
    install_reference(conn)
    with conn.transaction():  # one now() for both
        assert rows(conn, "SELECT * FROM awa.queue_counts_v1()") == rows(
            conn, "SELECT * FROM pg_temp.ref_queue_counts_v1()"
        )
        stats = rows(conn, "SELECT * FROM awa.queue_stats_v1()")
        assert stats == rows(conn, "SELECT * FROM pg_temp.ref_queue_stats_v1()")
        assert rows(conn, "SELECT * FROM awa.queue_stats") == stats
        for queue in (None, "a", "hist", "nope"):
            assert rows(conn, "SELECT * FROM awa.throughput_v1(%s)", [queue]) == rows(
                conn, "SELECT * FROM pg_temp.ref_throughput_v1(%s)", [queue]
            )
    by_queue = {r[0]: r for r in stats}
    assert by_queue["hist"][6:9] == (100, 100, 100)  # completed, failed, cancelled
    assert by_queue["a"][11] is not None  # lag of an available job
    assert by_queue["b"][10] is True  # paused


def plan_nodes(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield node
    for child in node.get("Plans", []):
        yield from plan_nodes(child)


def test_the_queue_list_view_reads_its_statistics_once(conn: Conn) -> None:
    """Each row of awa.queue_stats reads its queue's statistics by key: a scan of every queue
    per row and column made the view quadratic (60 s for 32,000 queues); a read of the names
    alone computes none."""
    conn.execute(
        "INSERT INTO awa.queue_meta (queue) SELECT 'q' || g FROM generate_series(1, 300) g"
    )
    enqueue(conn, "q7", 2)
    [[plan]] = conn.execute(
        "EXPLAIN (ANALYZE, FORMAT JSON) SELECT * FROM awa.queue_stats"
    ).fetchone()  # type: ignore[misc]
    scans = [n for n in plan_nodes(plan["Plan"]) if n["Node Type"] == "CTE Scan"]
    assert scans and all(n["Actual Loops"] <= 1 for n in scans), scans
    rows = {r[0]: r for r in conn.execute("SELECT * FROM awa.queue_stats").fetchall()}
    assert len(rows) == 300 and rows["q7"][1] == 2 and rows["q8"][1:3] == (0, 0)
    [[plan]] = conn.execute(
        "EXPLAIN (ANALYZE, FORMAT JSON) "
        "SELECT count(*) FROM (SELECT queue FROM awa.queue_stats LIMIT 10001) x"
    ).fetchone()  # type: ignore[misc]
    stats = [n for n in plan_nodes(plan["Plan"]) if "queue_stats_v1" in str(n.get("Function Name"))]
    assert all(n["Actual Loops"] == 0 for n in stats), stats


def test_ring_slots_count_small_children_exactly(conn: Conn) -> None:
    mixed_jobs(conn)
    slots = conn.execute("SELECT ring, slot, rows FROM awa.ring_slots_v1()").fetchall()
    queue_rows = sum(n for ring, _, n in slots if ring == "queue")
    [exact] = conn.execute(
        "SELECT (SELECT count(*) FROM awa.ready_entries) + (SELECT count(*) FROM "
        "awa.ready_tombstones) + (SELECT count(*) FROM awa.done_entries)"
        " + (SELECT count(*) FROM awa.done_counts)"
    ).fetchone()  # type: ignore[misc]
    assert queue_rows == exact


# Bounded cost ------------------------------------------------------------------------------------

#: What the admin, the commands and get_result read (the kind filter and kind search of terminal
#: history are left out: they read history until they find their rows, docs/storage.md).
SURFACES = {
    "queue_counts": "SELECT * FROM awa.queue_counts_v1()",
    "queue_stats": "SELECT * FROM awa.queue_stats_v1()",
    "queue_stats view count": (
        "SELECT count(*) FROM (SELECT queue FROM awa.queue_stats LIMIT 10001) x"
    ),
    "throughput all": "SELECT * FROM awa.throughput_v1(NULL)",
    "throughput hist": "SELECT * FROM awa.throughput_v1('hist')",
    "ring_slots": "SELECT * FROM awa.ring_slots_v1()",
    "queue minutes": "SELECT * FROM awa.queue_minutes_v2('a', 1440)",
    "live newest": "SELECT * FROM awa.live_jobs ORDER BY id DESC LIMIT 50",
    "live count": "SELECT count(*) FROM (SELECT id FROM awa.live_jobs LIMIT 10001) x",
    "live running": "SELECT * FROM awa.live_jobs WHERE state = 'running' ORDER BY id DESC LIMIT 50",
    "live available": (
        "SELECT * FROM awa.live_jobs WHERE state = 'available' ORDER BY id DESC LIMIT 50"
    ),
    "live waiting count": (
        "SELECT count(*) FROM (SELECT id FROM awa.live_jobs WHERE state = 'waiting_external' "
        "LIMIT 10001) x"
    ),
    "live queue": "SELECT * FROM awa.live_jobs WHERE queue = 'a' ORDER BY id DESC LIMIT 50",
    "live by id": "SELECT * FROM awa.live_jobs WHERE id = {running}",
    "jobs by id (running)": "SELECT * FROM awa.jobs WHERE id = {running}",
    "jobs by id (terminal)": "SELECT * FROM awa.jobs WHERE id = {terminal}",
    "terminal newest": (
        "SELECT * FROM awa.terminal_jobs ORDER BY finalized_at DESC, id DESC LIMIT 50"
    ),
    "terminal failed": (
        "SELECT * FROM awa.terminal_jobs WHERE state = 'failed' "
        "ORDER BY finalized_at DESC, id DESC LIMIT 50"
    ),
    "terminal failed count": (
        "SELECT count(*) FROM (SELECT id FROM awa.terminal_jobs WHERE state = 'failed' "
        "LIMIT 10001) x"
    ),
    "terminal queue a": (
        "SELECT * FROM awa.terminal_jobs WHERE queue = 'a' "
        "ORDER BY finalized_at DESC, id DESC LIMIT 50"
    ),
    "terminal queue a count": (
        "SELECT count(*) FROM (SELECT id FROM awa.terminal_jobs WHERE queue = 'a' LIMIT 10001) x"
    ),
    "terminal kind": (
        "SELECT * FROM awa.terminal_jobs WHERE kind = 'k.a.1' "
        "ORDER BY finalized_at DESC, id DESC LIMIT 50"
    ),
    "terminal kind count": (
        "SELECT count(*) FROM (SELECT id FROM awa.terminal_jobs WHERE kind = 'k.b.2' LIMIT 10001) x"
    ),
    "terminal last hour": (
        "SELECT * FROM awa.terminal_jobs WHERE finalized_at >= now() - interval '1 hour' "
        "ORDER BY finalized_at DESC, id DESC LIMIT 50"
    ),
}


def pages_read(conn: Conn, sql: str) -> int:
    """Shared buffers a statement touched (hit or read), from EXPLAIN (ANALYZE, BUFFERS), on its
    second run (the first also reads the catalogs to plan the statements of a function)."""
    conn.execute(sql).fetchall()
    [[plan]] = conn.execute(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {sql}").fetchone()  # type: ignore[misc]
    top = plan["Plan"]
    return int(top.get("Shared Hit Blocks", 0)) + int(top.get("Shared Read Blocks", 0))


def set_autovacuum(conn: Conn, enabled: bool) -> None:
    for (table,) in conn.execute(
        "SELECT c.oid::regclass::text FROM pg_class c JOIN pg_namespace n "
        "ON n.oid = c.relnamespace WHERE n.nspname = 'awa' AND c.relkind = 'r'"
    ).fetchall():
        conn.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = {str(enabled).lower()})")


@pytest.mark.parametrize("statistics", ["fresh", "empty"])
def test_no_read_surface_grows_with_history(conn: Conn, statistics: str) -> None:
    set_autovacuum(conn, False)
    try:
        if statistics == "empty":
            conn.execute(
                "ANALYZE awa.ready_entries, awa.done_entries, awa.claims, "
                "awa.claim_closures, awa.deferred_jobs, awa.dlq_entries"
            )
        made = mixed_jobs(conn)
        # Enough history that a count of it row by row would read thousands of pages.
        add_history(conn, 0, 60_000)
        ids = {
            "running": made["running"][0],
            "terminal": conn.execute(
                "SELECT job_id FROM awa.done_entries WHERE queue = 'hist' LIMIT 1"
            ).fetchone()[0],  # type: ignore[index]
        }
        if statistics == "fresh":
            conn.execute("ANALYZE")
        before = {name: pages_read(conn, sql.format(**ids)) for name, sql in SURFACES.items()}
        add_history(conn, 60_000, 120_000)
        if statistics == "fresh":
            conn.execute("ANALYZE")
        after = {name: pages_read(conn, sql.format(**ids)) for name, sql in SURFACES.items()}
        history_pages = conn.execute(
            "SELECT (pg_relation_size('awa.ready_entries_1') + "
            "pg_relation_size('awa.done_entries_1')) / current_setting('block_size')::int"
        ).fetchone()[0]  # type: ignore[index]
    finally:
        set_autovacuum(conn, True)
    assert history_pages > 6000  # 120,000 more jobs of history: a scan would read thousands
    # A few more index levels, and the binomial noise of a 1,000-page sample.
    grown = {
        name: after[name] - before[name] for name in SURFACES if after[name] - before[name] > 100
    }
    assert grown == {}, (before, after)


def join_filters(node: dict[str, Any]) -> tuple[int, list[str]]:
    """Rows removed by join filters in a plan, and the join filters that call a lane cursor."""
    removed = int(node.get("Rows Removed by Join Filter", 0))
    cursors = [node["Join Filter"]] if "lane_cursor" in str(node.get("Join Filter", "")) else []
    for child in node.get("Plans", []):
        more, found = join_filters(child)
        removed += more
        cursors += found
    return removed, cursors


def test_running_jobs_are_never_a_nested_scan_of_closures(conn: Conn) -> None:
    """The plan this prevents: a state filter estimated at 0.5 % of the claim ring made the planner
    scan every closure for every claim (196 million rows removed by a join filter)."""
    conn.execute("ANALYZE awa.claims, awa.claim_closures")  # statistics of empty partitions
    enqueue(conn, "a", 3000)
    claimed = storage.claim(conn, "a", 3000, WORKER)
    finalize(conn, claimed[100:], "completed")
    for sql in (
        "SELECT * FROM awa.live_jobs WHERE state = 'running'",
        "SELECT count(*) FROM awa.live_jobs WHERE state = 'running'",
        "SELECT count(*) FROM awa.live_jobs WHERE queue = 'a' AND state = 'running'",
        "SELECT * FROM awa.queue_counts_v1()",
    ):
        [[plan]] = conn.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}").fetchone()  # type: ignore[misc]
        removed, cursor_filters = join_filters(plan["Plan"])
        assert removed < 3000, (sql, removed)
        assert cursor_filters == [], sql
    assert conn.execute(
        "SELECT count(*) FROM awa.live_jobs WHERE state = 'running'"
    ).fetchone() == (100,)


def test_claims_without_a_kind_finish_with_their_kind(conn: Conn) -> None:
    """A claim that does not name its job's kind (claims.kind is nullable, e.g. one written by
    raw SQL): its completion reads the kind from the ready row, so history by kind stays whole."""
    enqueue(conn, "old", 6)
    claimed = storage.claim(conn, "old", 6, WORKER)
    conn.execute(
        "UPDATE awa.claims SET kind = NULL WHERE job_id = ANY(%s)", [[c.job_id for c in claimed]]
    )
    finalize(conn, claimed[:3], "completed")
    finalize(conn, claimed[3:5], "fail", error={"message": "boom"})  # to the DLQ
    assert conn.execute("SELECT awa.cancel_v1(%s)", [claimed[5].job_id]).fetchone() == ("running",)
    kinds = dict(
        conn.execute(  # type: ignore[arg-type]
            "SELECT id, kind FROM awa.terminal_jobs WHERE queue = 'old'"
        ).fetchall()
    )
    assert kinds == {c.job_id: c.kind for c in (*claimed[:3], claimed[5])}
    assert conn.execute("SELECT count(*) FROM awa.done_entries WHERE kind IS NULL").fetchone() == (
        0,
    )
