"""Enqueue throughput of awa_django on one Postgres (embedded PostgreSQL 18 unless DATABASE_URL).

    .venv/dj52/bin/python benchmarks/enqueue.py [--rounds 5] [--single 3000] [--bulk 100000]

Reports, as the median of interleaved rounds:
  * single:        one ``Job.enqueue`` per committed transaction, one connection, in autocommit
                   mode (the statement is the transaction: one round trip and one commit);
  * single_atomic: the same inside ``transaction.atomic()`` (BEGIN, statement, COMMIT);
  * floor_atomic:  a bare one-row ``INSERT`` per ``transaction.atomic()`` through the same
                   Django connection: what this client stack and the disk allow at best
                   (single_atomic_over_floor_per_round pairs the two within each round);
  * bulk:          ``enqueue_many`` in batches of 10,000 requests, one transaction per batch
                   (request preparation, i.e. validation and JSON encoding, is inside the timing).
Durability is untouched (fsync and synchronous_commit on). Prints JSON to stdout.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from common import with_server


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--single", type=int, default=3000, help="jobs per single-enqueue round")
    parser.add_argument("--bulk", type=int, default=100_000, help="jobs per bulk round")
    parser.add_argument("--batch", type=int, default=10_000, help="requests per enqueue_many")
    args = parser.parse_args()

    with_server("bench", lambda: run(args))


def run(args: argparse.Namespace) -> None:
    from django.db import connection, transaction

    import awa_django
    from benchmarks import benchjobs

    benchjobs.noop.enqueue(0)  # create the queue's lanes outside the timings

    def single() -> float:
        start = time.perf_counter()
        for i in range(args.single):
            benchjobs.noop.enqueue(i)
        return args.single / (time.perf_counter() - start)

    def single_atomic() -> float:
        start = time.perf_counter()
        for i in range(args.single):
            with transaction.atomic():
                benchjobs.noop.enqueue(i)
        return args.single / (time.perf_counter() - start)

    def floor_atomic() -> float:
        with connection.cursor() as cursor:
            cursor.execute("CREATE TABLE IF NOT EXISTS bench_floor (id bigserial, n int)")
            start = time.perf_counter()
            for i in range(args.single):
                with transaction.atomic():
                    cursor.execute("INSERT INTO bench_floor (n) VALUES (%s)", [i])
        return args.single / (time.perf_counter() - start)

    def bulk() -> float:
        start = time.perf_counter()
        for offset in range(0, args.bulk, args.batch):
            requests = [benchjobs.noop.prepare(i) for i in range(offset, offset + args.batch)]
            with transaction.atomic():
                awa_django.enqueue_many(requests)
        return args.bulk / (time.perf_counter() - start)

    def reset() -> None:
        with connection.cursor() as cursor:
            cursor.execute("TRUNCATE awa.ready_entries, awa.deferred_jobs")
            cursor.execute("CHECKPOINT")

    scenarios = (
        ("single", single),
        ("single_atomic", single_atomic),
        ("floor_atomic", floor_atomic),
        ("bulk", bulk),
    )
    results: dict[str, list[float]] = {name: [] for name, _ in scenarios}
    for _ in range(args.rounds):
        for name, fn in scenarios:
            reset()
            results[name].append(fn())
    with connection.cursor() as cursor:
        cursor.execute("SHOW server_version")
        version = cursor.fetchone()
    report = {
        "postgres": version[0] if version else None,
        "rounds": args.rounds,
        "enqueue_single_jobs_per_s": round(statistics.median(results["single"])),
        "enqueue_single_atomic_jobs_per_s": round(statistics.median(results["single_atomic"])),
        "floor_single_insert_atomic_per_s": round(statistics.median(results["floor_atomic"])),
        "enqueue_bulk_jobs_per_s": round(statistics.median(results["bulk"])),
        # The atomic enqueue's target is a same-run ratio: each round's atomic enqueue over its bare
        # INSERT (the machine's speed drifts between rounds, so medians of rates do not pair).
        "single_atomic_over_floor_per_round": [
            round(a / f, 3)
            for a, f in zip(results["single_atomic"], results["floor_atomic"], strict=True)
        ],
        "raw": {k: [round(v) for v in vs] for k, vs in results.items()},
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
