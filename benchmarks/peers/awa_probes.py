"""awa_django-only probes of ``benchmarks/run``: what one enqueue costs inside the caller's
transaction next to a bare INSERT, and what one ``claim_v3`` (the worker's claim) and
``finalize_v2`` cost the server.

Both run in the scenario driver (``drive.py enqueue_atomic|claim_one``) on a fresh clone of
awa_django's template database, after Django is set up.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

__all__ = ["claim_one", "enqueue_atomic"]

BLOCK = 50  # enqueues, then as many bare INSERTs, alternately: drift hits both alike
WARMUP = 50  # claim/finalize iterations not counted (plan caches, lanes, buffers)

# Server-side timing without pg_stat_statements (which needs shared_preload_libraries, a
# server-wide setting that would tax every system's statements): a PL/pgSQL wrapper reads
# clock_timestamp() around the call. The wrapper's own cost (one call, two clock reads) is in
# the figure; parse, plan of the outer SELECT and the commit are not, as in pg_stat_statements.
WRAPPERS = """
CREATE FUNCTION bench_claim_one(p_queue text, OUT o_us double precision, OUT o_job bigint,
                                OUT o_lease bigint, OUT o_slot integer)
LANGUAGE plpgsql AS $$
DECLARE
    t0 timestamptz := clock_timestamp();
BEGIN
    SELECT c.job_id, c.run_lease, c.claim_slot INTO o_job, o_lease, o_slot
    FROM awa.claim_v3(p_queue, 1) c
    WHERE c.job_id IS NOT NULL;
    o_us := extract(epoch FROM clock_timestamp() - t0) * 1e6;
END $$;
CREATE FUNCTION bench_finalize(p_items jsonb, OUT o_us double precision)
LANGUAGE plpgsql AS $$
DECLARE
    t0 timestamptz := clock_timestamp();
BEGIN
    PERFORM * FROM awa.finalize_v2(p_items);
    o_us := extract(epoch FROM clock_timestamp() - t0) * 1e6;
END $$;
"""


def _quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def enqueue_atomic(count: int) -> dict[str, Any]:
    """``with transaction.atomic(): job.enqueue(key)`` against ``with transaction.atomic():``
    one bare ``INSERT ... RETURNING id`` (what ``Model.objects.create`` sends), on the same
    Django connection, in alternating blocks of :data:`BLOCK`; ``count`` of each."""
    from django.db import connection, transaction

    from benchmarks.peers.systems import awa_jobs
    from benchmarks.peers.systems.django_base import setup

    setup()
    job = awa_jobs.peer
    job.enqueue(0)  # the queue's lanes exist before anything is timed
    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE TABLE bench_insert_floor (id bigserial PRIMARY KEY, key bigint NOT NULL)"
        )
    spent = {"enqueue": 0.0, "insert": 0.0}
    key = 1
    for _ in range(0, count, BLOCK):
        start = time.perf_counter()
        for _ in range(BLOCK):
            with transaction.atomic():
                job.enqueue(key)
            key += 1
        spent["enqueue"] += time.perf_counter() - start
        start = time.perf_counter()
        with connection.cursor() as cursor:
            for i in range(BLOCK):
                with transaction.atomic():
                    cursor.execute(
                        "INSERT INTO bench_insert_floor (key) VALUES (%s) RETURNING id", [i]
                    )
                    cursor.fetchone()
        spent["insert"] += time.perf_counter() - start
    done = (count + BLOCK - 1) // BLOCK * BLOCK
    connection.close()
    enqueue = done / spent["enqueue"]
    insert = done / spent["insert"]
    return {
        "enqueue_atomic_jobs_per_s": enqueue,
        "insert_atomic_rows_per_s": insert,
        "enqueue_atomic_vs_insert": enqueue / insert,
        "enqueue_atomic_jobs": done,
    }


def claim_one(url: str, count: int) -> dict[str, Any]:
    """Claim one job with ``awa.claim_v3(queue, 1)`` (the worker's claim) and complete it with
    ``awa.finalize_v2``, ``count`` times (the first :data:`WARMUP` not counted), on queue
    ``peers`` (4 enqueue shards: the default). Server time from the wrappers above; client round
    trips too, with an empty ``SELECT 1`` round trip for scale (those include the commit's WAL
    flush)."""
    import psycopg

    from awa_django.db.storage import Finalization

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(WRAPPERS)
        row = conn.execute(
            "SELECT count(*) FROM awa.queue_lanes WHERE queue = 'peers' AND priority = 0"
        ).fetchone()
        shards = int(row[0]) if row else 0
        claim_us: list[float] = []
        finalize_us: list[float] = []
        claim_rtt: list[float] = []
        finalize_rtt: list[float] = []
        select1_rtt: list[float] = []
        for i in range(count):
            start = time.perf_counter()
            conn.execute("SELECT 1").fetchone()
            mid = time.perf_counter()
            got = conn.execute("SELECT * FROM bench_claim_one('peers')").fetchone()
            claimed = time.perf_counter()
            assert got is not None
            us, job_id, lease, slot = got
            if job_id is None:
                raise SystemExit(f"claim_one: queue empty after {i} claims of {count}")
            items = Finalization.batch_json([Finalization(job_id, lease, slot, "completed")])
            done = conn.execute("SELECT o_us FROM bench_finalize(%s::jsonb)", [items]).fetchone()
            finished = time.perf_counter()
            assert done is not None
            if i < WARMUP:
                continue
            select1_rtt.append((mid - start) * 1e6)
            claim_rtt.append((claimed - mid) * 1e6)
            finalize_rtt.append((finished - claimed) * 1e6)
            claim_us.append(float(us))
            finalize_us.append(float(done[0]))
    both = [c + f for c, f in zip(claim_us, finalize_us, strict=True)]
    select1 = statistics.median(select1_rtt)
    return {
        "claim_one_shards": shards,
        "claim_one_samples": len(claim_us),
        "claim_one_server_p50_us": _quantile(claim_us, 0.5),
        "claim_one_server_p95_us": _quantile(claim_us, 0.95),
        "finalize_one_server_p50_us": _quantile(finalize_us, 0.5),
        "claim_finalize_server_p50_us": _quantile(both, 0.5),
        "select1_rtt_p50_us": select1,
        "claim_one_rtt_minus_select1_p50_us": statistics.median(claim_rtt) - select1,
        "finalize_one_rtt_minus_select1_p50_us": statistics.median(finalize_rtt) - select1,
    }
