"""What unique jobs cost against plain jobs, in one run (embedded PostgreSQL 18 unless
DATABASE_URL).

    .venv/dj52/bin/python benchmarks/unique_cost.py [--rounds 5] [--single 2000] [--bulk 5000]
        [--pinned 20000]

Throughput, as the median of interleaved rounds (each round runs every scenario once):
  * plain_atomic:     one ``Job.enqueue`` per ``transaction.atomic()`` block;
  * unique_atomic:    the same for a ``unique=True`` job, every key new (the key is taken);
  * duplicate_atomic: the same key every time (nothing written; the holder is looked up);
  * plain_bulk / unique_bulk: ``enqueue_many`` of ``--bulk`` requests in one transaction.
``unique_over_plain_per_round`` pairs the first two within each round (machine drift cancels).

Dead tuples under a pinned MVCC horizon (a REPEATABLE READ transaction holding an xid):
``--pinned`` unique jobs are enqueued, claimed and completed, then the leader's sweep releases
their keys, then the same keys are enqueued again (taken over in place); the same count of plain
jobs goes through the same cycle. Reported: dead tuples (pgstattuple) in awa.unique_keys and in
every ring partition for each. Durability is untouched. Prints JSON to stdout.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import uuid
from typing import Any

from common import with_server

WORKER = uuid.UUID("00000000-0000-0000-0000-0000000b0b0b")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--single", type=int, default=2000, help="jobs per single round")
    parser.add_argument("--bulk", type=int, default=5000, help="requests per bulk round")
    parser.add_argument("--pinned", type=int, default=20_000, help="jobs per pinned cycle")
    args = parser.parse_args()
    with_server("unique", lambda: run(args))


def run(args: argparse.Namespace) -> None:
    from django.db import connection, transaction

    import awa_django
    from benchmarks import benchjobs

    counter = iter(range(10**12))
    benchjobs.noop.enqueue(0)  # lanes exist before the timings
    benchjobs.unique_noop.enqueue(-1)

    def timed(n: int, body: Any) -> float:
        start = time.perf_counter()
        body()
        return n / (time.perf_counter() - start)

    def plain_atomic() -> float:
        def body() -> None:
            for i in range(args.single):
                with transaction.atomic():
                    benchjobs.noop.enqueue(i)

        return timed(args.single, body)

    def unique_atomic() -> float:
        def body() -> None:
            for _ in range(args.single):
                with transaction.atomic():
                    benchjobs.unique_noop.enqueue(next(counter))

        return timed(args.single, body)

    def duplicate_atomic() -> float:
        held = next(counter)
        benchjobs.unique_noop.enqueue(held)

        def body() -> None:
            for _ in range(args.single):
                with transaction.atomic():
                    benchjobs.unique_noop.enqueue(held)

        return timed(args.single, body)

    def plain_bulk() -> float:
        def body() -> None:
            with transaction.atomic():
                awa_django.enqueue_many([benchjobs.noop.prepare(i) for i in range(args.bulk)])

        return timed(args.bulk, body)

    def unique_bulk() -> float:
        def body() -> None:
            requests = [benchjobs.unique_noop.prepare(next(counter)) for _ in range(args.bulk)]
            with transaction.atomic():
                awa_django.enqueue_many(requests)

        return timed(args.bulk, body)

    def reset() -> None:
        with connection.cursor() as cursor:
            cursor.execute("TRUNCATE awa.ready_entries, awa.deferred_jobs, awa.unique_keys")
            cursor.execute("CHECKPOINT")

    scenarios = (
        ("plain_atomic", plain_atomic),
        ("unique_atomic", unique_atomic),
        ("duplicate_atomic", duplicate_atomic),
        ("plain_bulk", plain_bulk),
        ("unique_bulk", unique_bulk),
    )
    results: dict[str, list[float]] = {name: [] for name, _ in scenarios}
    for _ in range(args.rounds):
        for name, fn in scenarios:
            reset()
            results[name].append(fn())
    reset()
    report: dict[str, Any] = {
        "rounds": args.rounds,
        **{f"{k}_jobs_per_s": round(statistics.median(v)) for k, v in results.items()},
        "unique_over_plain_per_round": [
            round(u / p, 3)
            for u, p in zip(results["unique_atomic"], results["plain_atomic"], strict=True)
        ],
        "unique_bulk_over_plain_bulk": round(
            statistics.median(results["unique_bulk"]) / statistics.median(results["plain_bulk"]),
            3,
        ),
        "pinned": pinned_cycle(args.pinned),
        "raw": {k: [round(v) for v in vs] for k, vs in results.items()},
    }
    print(json.dumps(report, indent=2))


def pinned_cycle(n: int) -> dict[str, Any]:
    """Dead tuples left by ``n`` unique and ``n`` plain jobs under a pinned horizon."""
    import psycopg
    from django.db import connection, transaction

    import awa_django
    from awa_django.db import storage
    from awa_django.db.storage import Finalization
    from benchmarks import benchjobs

    dsn = connection.get_connection_params()
    conninfo = psycopg.conninfo.make_conninfo(
        **{k: v for k, v in dsn.items() if k in ("host", "port", "dbname", "user", "password")}
    )
    with psycopg.connect(conninfo, autocommit=True) as conn, psycopg.connect(conninfo) as pin:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pgstattuple")

        def dead() -> dict[str, int]:
            keys = conn.execute(
                "SELECT dead_tuple_count FROM pgstattuple('awa.unique_keys')"
            ).fetchone()
            ring = conn.execute(
                "SELECT COALESCE(sum((pgstattuple(c.oid)).dead_tuple_count), 0) FROM pg_class c "
                "JOIN pg_namespace s ON s.oid = c.relnamespace "
                "WHERE s.nspname = 'awa' AND c.relkind = 'r' AND c.relispartition"
            ).fetchone()
            return {"unique_keys": int(keys[0]), "ring_partitions": int(ring[0])}

        def complete_all(queue: str) -> None:
            while claimed := storage.claim(conn, queue, 512, WORKER):
                storage.finalize(
                    conn,
                    [
                        Finalization(c.job_id, c.run_lease, c.claim_slot, "completed")
                        for c in claimed
                    ],
                )

        def sweep() -> None:
            after: tuple[Any, Any] = (None, None)
            while True:
                _, *nxt = conn.execute(
                    "SELECT * FROM awa.unique_sweep_v1(%s, %s, 1000)", list(after)
                ).fetchone()
                after = (nxt[0], nxt[1])
                if after[0] is None:
                    return

        conn.execute("VACUUM awa.unique_keys")
        pin.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        pin.execute("SELECT txid_current()")
        before = dead()
        out: dict[str, Any] = {"jobs": n, "before": before}
        with transaction.atomic():
            awa_django.enqueue_many([benchjobs.noop.prepare(i) for i in range(n)])
        complete_all("bench")
        out["plain_cycle"] = dead()
        base = 10**11
        with transaction.atomic():
            awa_django.enqueue_many([benchjobs.unique_noop.prepare(base + i) for i in range(n)])
        complete_all("bench-unique")
        out["unique_enqueued_and_completed"] = dead()
        sweep()
        out["unique_keys_swept"] = dead()
        with transaction.atomic():
            awa_django.enqueue_many([benchjobs.unique_noop.prepare(base + i) for i in range(n)])
        complete_all("bench-unique")
        out["same_keys_again_and_completed"] = dead()
        pin.rollback()
    return out


if __name__ == "__main__":
    main()
