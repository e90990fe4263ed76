"""Drain throughput of ``awa_worker`` (embedded PostgreSQL 18 unless DATABASE_URL).

    .venv/dj52/bin/python benchmarks/drain.py [--jobs 50000] [--processes 2] [--rounds 3]
        [--concurrency 512 | --default] [--sync]

Each round pre-enqueues N no-op jobs (async by default), then runs
``manage.py awa_worker --burst --processes P --queue Q=C`` (with ``--default``: no ``--queue``,
the default settings, as a new user runs it) and measures, on the database clock,
the time from the first claim to the last completion (and the wall time of the whole command,
start-up included). Every round verifies that all N jobs completed exactly once. Durability is
untouched (fsync and synchronous_commit on). Prints JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics

from common import drain, enqueue, with_server


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=50_000)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--default",
        action="store_true",
        help="run awa_worker without --queue: every queue, the default AWA settings",
    )
    parser.add_argument("--sync", action="store_true", help="sync no-op handlers (thread pool)")
    args = parser.parse_args()
    with_server("bench", lambda: run(args))


def run(args: argparse.Namespace) -> None:
    from benchmarks import benchjobs

    handle = benchjobs.noop if args.sync else benchjobs.anoop
    rates: list[float] = []
    walls: list[float] = []
    for _ in range(args.rounds):
        first = enqueue(handle, args.jobs)
        rate, wall = drain(
            handle.options.queue,
            args.jobs,
            first,
            processes=args.processes,
            concurrency=None if args.default else args.concurrency,
        )
        rates.append(rate)
        walls.append(wall)
    print(
        json.dumps(
            {
                "jobs": args.jobs,
                "processes": args.processes,
                "concurrency": "default" if args.default else args.concurrency,
                "handlers": "sync" if args.sync else "async",
                "drain_jobs_per_s": round(statistics.median(rates)),
                "drain_jobs_per_s_rounds": [round(r) for r in rates],
                "wall_seconds_rounds": [round(w, 2) for w in walls],
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
