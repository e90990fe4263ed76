"""Dead tuples and throughput with the MVCC horizon pinned, against the same run unpinned.

    .venv/dj52/bin/python benchmarks/pinned.py [--jobs 100000] [--rounds 1]

Each round runs N no-op jobs through ``awa_worker --burst --processes 2`` twice, interleaved:
once clean, once while another connection holds a REPEATABLE READ transaction with an
assigned xid for the whole run (enqueue included). After each run it counts dead tuples in every
``awa`` table exactly (pgstattuple) and sums table sizes. Reports JSON: jobs/s for both, the
pinned/clean ratio, dead tuples per table and sizes. Autovacuum is on (the default).
"""

from __future__ import annotations

import argparse
import json
import statistics
from typing import Any

from common import drain, enqueue, with_server


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=512)
    args = parser.parse_args()
    with_server("bench-pinned", lambda: run(args))


def snapshot() -> tuple[dict[str, int], int]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.relname, (pgstattuple(c.oid)).dead_tuple_count, "
            "pg_total_relation_size(c.oid) FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = 'awa' AND c.relkind = 'r'"
        )
        rows = cursor.fetchall()
    return {name: int(dead) for name, dead, _ in rows if dead}, sum(int(r[2]) for r in rows)


def run(args: argparse.Namespace) -> None:
    import psycopg
    from django.db import connection

    from benchmarks import benchjobs

    with connection.cursor() as cursor:
        cursor.execute("CREATE EXTENSION IF NOT EXISTS pgstattuple")
    benchjobs.anoop.enqueue(-1)
    s = connection.settings_dict
    results: dict[str, list[dict[str, Any]]] = {"clean": [], "pinned": []}
    for _ in range(args.rounds):
        for mode in ("clean", "pinned"):
            with connection.cursor() as cursor:  # start each run from an empty ring
                for _ in range(17):
                    cursor.execute(
                        "SELECT awa.prune_v1('claim'), awa.prune_v1('queue'), "
                        "awa.rotate_v2('claim'), awa.rotate_v2('queue')"
                    )
            pin = None
            if mode == "pinned":
                pin = psycopg.connect(
                    host=s["HOST"], port=s["PORT"], user=s["USER"], dbname=s["NAME"]
                )
                pin.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                pin.execute("SELECT txid_current()")
            try:
                first = enqueue(benchjobs.anoop, args.jobs)
                rate, _ = drain(
                    "bench-async",
                    args.jobs,
                    first,
                    processes=args.processes,
                    concurrency=args.concurrency,
                )
                dead, size = snapshot()
            finally:
                if pin is not None:
                    pin.rollback()
                    pin.close()
            results[mode].append(
                {
                    "jobs_per_s": round(rate),
                    "dead_tuples": dead,
                    "dead_tuples_total": sum(dead.values()),
                    "awa_table_bytes": size,
                }
            )
    clean = statistics.median(r["jobs_per_s"] for r in results["clean"])
    pinned = statistics.median(r["jobs_per_s"] for r in results["pinned"])
    print(
        json.dumps(
            {
                "jobs": args.jobs,
                "processes": args.processes,
                "concurrency": args.concurrency,
                "clean_jobs_per_s": clean,
                "pinned_jobs_per_s": pinned,
                "pinned_vs_clean_throughput": round(pinned / clean, 3),
                "dead_tuples_pinned": results["pinned"][-1]["dead_tuples_total"],
                "runs": results,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
