"""Server time of one claim and one finalize: the worker's ``claim_v3``/``finalize_v2`` against
the same functions with their generic statements only (the per-slot branches never taken), in
one database, interleaved: what the static per-slot statements save
(docs/design/static-per-slot-statements.md).

    .venv/dj52/bin/python benchmarks/claim_cost.py [--calls 2000] [--rounds 5] [--batch 1]
        [--producers 4]

One embedded PostgreSQL 18 (fsync off: this measures CPU, not the disk), migrated. A queue with
4 enqueue shards gets its jobs from ``--producers`` connections (so as many lanes have work);
after a warm-up the claim ring is rotated once, as the maintenance leader does. Each round
runs ``--calls`` claim + finalize cycles of ``--batch`` jobs with each version, alternating the
order round by round, and reads two clocks per call: the server's own execution time of the
call (``EXPLAIN (ANALYZE)``'s "Execution Time" of ``SELECT * FROM ...claim_v3(...)``; planning
the one-line outer statement is not included) and the backend's CPU time (user + system, from
``/proc``); and a third, the clock of ``benchmarks/run``'s probe (``clock_timestamp()`` read
around the call by a PL/pgSQL wrapper, committed). Medians over rounds; per job when
``--batch`` > 1.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if __name__ == "__main__":
    sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]

_EXPLAIN = "EXPLAIN (ANALYZE, TIMING OFF) "
_EXECUTION = re.compile(r"Execution Time: ([0-9.]+) ms")


def backend_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().split()
    return (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK")


def explain_ms(conn: Any, sql: str, params: list[Any]) -> float:
    text = "\n".join(row[0] for row in conn.execute(sql, params))
    match = _EXECUTION.search(text)
    assert match, text
    return float(match.group(1))


#: The claim and finalize functions of each version compared.
FUNCTIONS = {
    "generic": ("awa_generic.claim_v3", "awa_generic.finalize_v2"),
    "per-slot": ("awa.claim_v3", "awa.finalize_v2"),
}


def install_generic(conn: Any) -> None:
    """``claim_v3`` and ``finalize_v2`` rendered with per-slot branches for a slot that never
    exists, in schema awa_generic: every call takes their generic ELSE statements."""
    from importlib import resources

    from awa_django.sql import RING_SLOTS, render

    conn.execute("CREATE SCHEMA awa_generic")
    for path, name in (("claim.sql", "claim_v3"), ("finalize.sql", "finalize_v2")):
        text = (resources.files("awa_django.sql") / "functions" / path).read_text("utf-8")
        text = render(text, RING_SLOTS, {ring: [9999] for ring in RING_SLOTS})
        start = text.index(f"CREATE OR REPLACE FUNCTION awa.{name}(")
        block = text[start : text.index("\n$$;\n", start) + len("\n$$;\n")]
        conn.execute(block.replace(f"FUNCTION awa.{name}(", f"FUNCTION awa_generic.{name}("))


#: The clock of ``benchmarks/run``'s probe (benchmarks/peers/awa_probes.py): a PL/pgSQL wrapper
#: reads clock_timestamp() around one claim (one finalize), which commits; one per version.
PROBES = """
CREATE FUNCTION awa_cc_probe.claim_{tag}(p_queue text, p_max integer, OUT o_us double precision,
                                         OUT o_rows jsonb)
LANGUAGE plpgsql AS $$
DECLARE
    t0 timestamptz := clock_timestamp();
BEGIN
    SELECT jsonb_agg(jsonb_build_object('id', c.job_id, 'lease', c.run_lease,
                                        'slot', c.claim_slot, 'outcome', 'completed'))
    INTO o_rows
    FROM {claim}(p_queue, p_max) c
    WHERE c.job_id IS NOT NULL;
    o_us := extract(epoch FROM clock_timestamp() - t0) * 1e6;
END $$;
CREATE FUNCTION awa_cc_probe.finalize_{tag}(p_items jsonb, OUT o_us double precision)
LANGUAGE plpgsql AS $$
DECLARE
    t0 timestamptz := clock_timestamp();
BEGIN
    PERFORM * FROM {finalize}(p_items);
    o_us := extract(epoch FROM clock_timestamp() - t0) * 1e6;
END $$;
"""


def cycle(conn: Any, pid: int, version: str, batch: int, calls: int) -> dict[str, float]:
    """``calls`` claim + finalize cycles with one version, then ``calls // 10`` sampled ones.

    The plain cycles give the backend's CPU per cycle. Each sample runs the claim, and then the
    finalize of a real claim, under ``EXPLAIN (ANALYZE)`` in a transaction that is rolled back,
    for the server's execution time of each call; then as many claim + finalize cycles timed as
    ``benchmarks/run``'s probe times them (:data:`PROBES`: the calls' own clock, committed).
    """
    claim_fn, finalize_fn = FUNCTIONS[version]
    tag = version.replace("-", "_")  # a version's probes are named awa_cc_probe.claim_<tag>
    claim_sql = f"SELECT job_id, run_lease, claim_slot FROM {claim_fn}('cost', %s)"
    finalize_sql = f"SELECT count(*) FROM {finalize_fn}(%s::jsonb)"

    def items(rows: list[tuple[int, int, int]]) -> str:
        return json.dumps(
            [{"id": j, "lease": lease, "slot": s, "outcome": "completed"} for j, lease, s in rows]
        )

    cpu0 = backend_cpu(pid)
    started = time.perf_counter()
    jobs = 0
    for _ in range(calls):
        rows = conn.execute(claim_sql, [batch]).fetchall()
        conn.execute(finalize_sql, [items(rows)])
        jobs += len(rows)
    wall = time.perf_counter() - started
    cpu = backend_cpu(pid) - cpu0
    claim_ms: list[float] = []
    finalize_ms: list[float] = []
    for _ in range(max(calls // 10, 1)):
        with conn.transaction(force_rollback=True):
            claim_ms.append(explain_ms(conn, _EXPLAIN + claim_sql, [batch]))
        rows = conn.execute(claim_sql, [batch]).fetchall()
        with conn.transaction(force_rollback=True):
            finalize_ms.append(explain_ms(conn, _EXPLAIN + finalize_sql, [items(rows)]))
        conn.execute(finalize_sql, [items(rows)])
    probe_claim: list[float] = []
    probe_finalize: list[float] = []
    for _ in range(max(calls // 10, 1)):
        row = conn.execute(
            f"SELECT o_us, o_rows::text FROM awa_cc_probe.claim_{tag}('cost', %s)", [batch]
        ).fetchone()
        probe_claim.append(row[0])
        row = conn.execute(
            f"SELECT o_us FROM awa_cc_probe.finalize_{tag}(%s::jsonb)", [row[1]]
        ).fetchone()
        probe_finalize.append(row[0])
    return {
        "claim_ms": statistics.median(claim_ms),
        "finalize_ms": statistics.median(finalize_ms),
        "probe_claim_us": statistics.median(probe_claim),
        "probe_finalize_us": statistics.median(probe_finalize),
        "cpu_us": cpu / calls * 1e6,
        "jobs_per_s": jobs / wall,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--calls", type=int, default=2000, help="claim+finalize calls per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batch", type=int, default=1, help="jobs per claim")
    parser.add_argument("--producers", type=int, default=4, choices=range(1, 5))
    args = parser.parse_args()
    versions = ("generic", "per-slot")

    import pgserver  # type: ignore[import-not-found,unused-ignore]
    import psycopg

    url, stop = pgserver.start(
        ROOT / ".pgdata" / "bench-claim-cost", database="awa_cost", ephemeral=True, fsync=False
    )
    try:
        os.environ["DATABASE_URL"] = url
        os.environ["DJANGO_SETTINGS_MODULE"] = "benchmarks.bench_settings"
        import django

        django.setup()
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
        with psycopg.connect(url, autocommit=True) as conn:
            install_generic(conn)
        per_round = args.calls * args.batch * 2 * 1.3
        total = int(per_round * (args.rounds + 1)) + 500
        body = json.dumps([{"kind": "bench.cost", "queue": "cost"}] * 500)
        producers = [psycopg.connect(url, autocommit=True) for _ in range(args.producers)]
        for n in range(0, total, 500):
            producers[(n // 500) % args.producers].execute(
                "SELECT count(*) FROM awa.enqueue_v1(%s::jsonb)", [body]
            )
        lanes = (
            producers[0]
            .execute("SELECT count(DISTINCT lane_id) FROM awa.ready_entries WHERE queue = 'cost'")
            .fetchone()
        )
        for producer in producers:
            producer.close()
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("SET jit = off")
            conn.execute("VACUUM ANALYZE")
            pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]  # type: ignore[index]
            conn.execute("CREATE SCHEMA awa_cc_probe")
            for version in versions:
                claim_fn, finalize_fn = FUNCTIONS[version]
                probes = PROBES.format(
                    tag=version.replace("-", "_"), claim=claim_fn, finalize=finalize_fn
                )
                conn.execute(probes)
            for version in versions:  # warm up both (plan caches, buffers)
                cycle(conn, pid, version, args.batch, args.calls // 2)
            # As the maintenance leader does every CLAIM_ROTATE_INTERVAL: a new claim slot
            # (with rotate_v3's cursor markers).
            conn.execute("SELECT awa.rotate_v3('claim')")
            results: dict[str, list[dict[str, float]]] = {v: [] for v in versions}
            started = time.perf_counter()
            for r in range(args.rounds):
                for version in versions if r % 2 == 0 else versions[::-1]:
                    results[version].append(cycle(conn, pid, version, args.batch, args.calls))
            server = conn.execute("SHOW server_version").fetchone()[0]  # type: ignore[index]
        print(
            f"PostgreSQL {server}; queue with {lanes[0] if lanes else '?'} lanes with work; "
            f"{args.rounds} rounds x {args.calls} calls of {args.batch} job(s) per version in "
            f"{time.perf_counter() - started:.0f} s. Medians over rounds:"
        )
        for version, rounds in results.items():
            claim = statistics.median(r["claim_ms"] for r in rounds) * 1000
            fin = statistics.median(r["finalize_ms"] for r in rounds) * 1000
            cpu = statistics.median(r["cpu_us"] for r in rounds)
            rate = statistics.median(r["jobs_per_s"] for r in rounds)
            pclaim = statistics.median(r["probe_claim_us"] for r in rounds)
            pfin = statistics.median(r["probe_finalize_us"] for r in rounds)
            print(
                f"  {version}: server time per call: claim {claim:8.1f} us, finalize "
                f"{fin:8.1f} us (run's probe clock: claim {pclaim:8.1f} us, finalize "
                f"{pfin:8.1f} us); backend CPU per claim + finalize {cpu:8.1f} us "
                f"({cpu / args.batch:.1f} us per job); one connection's loop {rate:,.0f} jobs/s"
            )
        old, new = versions
        keys = ("claim_ms", "finalize_ms", "probe_claim_us", "probe_finalize_us", "cpu_us")
        for key in (*keys, "jobs_per_s"):
            ratios = [b[key] / a[key] for a, b in zip(results[old], results[new], strict=True)]
            print(
                f"  {key} {new} / {old} per round: {', '.join(f'{x:.2f}' for x in ratios)}"
                f" (median {statistics.median(ratios):.2f})"
            )
    finally:
        stop()


if __name__ == "__main__":
    main()
