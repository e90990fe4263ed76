"""What flow control costs, and whether a binding global limit is reached (docs/flow.md).

    .venv/dj52/bin/python benchmarks/flow_cost.py [--jobs 30000] [--rounds 3] [--processes 2]
        [--concurrency 512] [--limit 8] [--sleep 0.02] [--sleep-jobs 800]

Interleaved rounds of the drain of ``drain.py`` (async no-op jobs, ``awa_worker --burst``) on
one queue: with no flow limits, then with limits set but not binding (a global concurrency of
10,000 and a rate limit of 1,000,000/s, far above what two processes reach), on the queue and
then on the job kind instead (``@job``'s ``global_concurrency`` / ``rate_limit``). Then a drain of
sleeping jobs (``--sleep`` seconds each) under a binding global limit (``--limit``): the
achieved concurrency is jobs x sleep / elapsed (Little's law), and the most permits seen in use
by a sampler polling ``awa.flow_status_v1()``. Prints JSON with medians.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time

from common import drain, enqueue, with_server


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=30_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=512)
    parser.add_argument("--limit", type=int, default=8)
    parser.add_argument("--sleep", type=float, default=0.02)
    parser.add_argument("--sleep-jobs", type=int, default=800)
    args = parser.parse_args()
    with_server("bench", lambda: run(args))


def set_limits(queue: str, max_running: int | None, rate: float | None) -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        if max_running is None and rate is None:
            cursor.execute(
                "SELECT 1 FROM awa.flow_set_v1(%s, NULL, NULL, NULL, 'bench', true)", [queue]
            )
        else:
            cursor.execute(
                "SELECT 1 FROM awa.flow_set_v1(%s, %s, %s, NULL, 'bench', false)",
                [queue, max_running, rate],
            )


def set_kind_limits(kind: str, max_running: int | None, rate: float | None) -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT 1 FROM awa.flow_kind_set_v1(%s, %s, %s, NULL, 'bench', %s)",
            [kind, max_running, rate, max_running is None and rate is None],
        )


def run(args: argparse.Namespace) -> None:
    from benchmarks import benchjobs

    handle = benchjobs.anoop
    queue = handle.options.queue
    rates: dict[str, list[float]] = {"none": [], "not_binding": [], "kind_not_binding": []}
    for _ in range(args.rounds):
        for mode in rates:
            set_limits(queue, *((10_000, 1_000_000.0) if mode == "not_binding" else (None, None)))
            set_kind_limits(
                handle.kind,
                *((10_000, 1_000_000.0) if mode == "kind_not_binding" else (None, None)),
            )
            first = enqueue(handle, args.jobs)
            rate, _ = drain(
                queue, args.jobs, first, processes=args.processes, concurrency=args.concurrency
            )
            rates[mode].append(rate)
    none = statistics.median(rates["none"])
    limited = statistics.median(rates["not_binding"])
    kind_limited = statistics.median(rates["kind_not_binding"])
    binding = bound_run(args)
    print(
        json.dumps(
            {
                "jobs": args.jobs,
                "processes": args.processes,
                "concurrency": args.concurrency,
                "drain_no_limits": round(none),
                "drain_limits_not_binding": round(limited),
                "cost": round(1 - limited / none, 4),
                "drain_kind_limits_not_binding": round(kind_limited),
                "kind_cost": round(1 - kind_limited / none, 4),
                "rounds": {k: [round(v) for v in vs] for k, vs in rates.items()},
                "binding": binding,
            },
            indent=2,
        )
    )


def bound_run(args: argparse.Namespace) -> dict[str, float]:
    """Sleeping jobs under a binding global limit: the concurrency reached."""
    from django.db import connection

    from benchmarks import benchjobs

    handle = benchjobs.asleep
    queue = handle.options.queue
    set_limits(queue, args.limit, None)
    first = enqueue_sleeping(handle, args.sleep_jobs, args.sleep)
    peak = [0]
    samples: list[int] = []
    done = threading.Event()

    def sample() -> None:
        import psycopg
        from django.db import connection as django_connection

        dsn = django_connection.get_connection_params()
        with psycopg.connect(**dsn, autocommit=True) as conn:
            while not done.is_set():
                row = conn.execute(
                    "SELECT in_use FROM awa.flow_status_v1() WHERE queue = %s", [queue]
                ).fetchone()
                if row and row[0] is not None:
                    samples.append(int(row[0]))
                    peak[0] = max(peak[0], int(row[0]))
                time.sleep(0.005)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        rate, _ = drain(
            queue, args.sleep_jobs, first, processes=args.processes, concurrency=args.concurrency
        )
    finally:
        done.set()
        sampler.join()
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    busy = [s for s in samples if s > 0]
    return {
        "limit": args.limit,
        "sleep_s": args.sleep,
        "jobs": args.sleep_jobs,
        "achieved_concurrency": round(rate * args.sleep, 2),
        "peak_in_use": peak[0],
        "median_in_use": statistics.median(busy) if busy else 0,
    }


def enqueue_sleeping(handle: object, count: int, seconds: float) -> int:
    from django.db import transaction

    import awa_django

    requests = [handle.prepare(seconds) for _ in range(count)]  # type: ignore[attr-defined]
    with transaction.atomic():
        handles = awa_django.enqueue_many(requests)
    return handles[0].id


if __name__ == "__main__":
    main()
