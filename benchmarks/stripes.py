"""What spreading one hot queue over several physical queues ("stripes") buys: drain throughput
of async no-op jobs spread round robin over 1, 2 and 4 queues, each served by the same
``awa_worker --burst --processes P`` with ``C`` slots per process (embedded PostgreSQL 18
unless DATABASE_URL).

    .venv/dj52/bin/python benchmarks/stripes.py [--jobs 50000] [--processes 2]
        [--concurrency 512] [--stripes 1 2 4] [--rounds 3]

Rounds interleave the stripe counts (1, 2, 4, 1, 2, 4, ...) so that the machine's drift falls on
each alike. Each round verifies that every job completed exactly once, and measures the time
from the first claim to the last completion on the database clock. Prints JSON: the median
jobs/s per stripe count and each round's figure.
"""

from __future__ import annotations

import argparse
import json
import statistics

from common import drain, with_server


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=50_000)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=512)
    parser.add_argument("--stripes", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with_server("bench-stripes", lambda: run(args))


def run(args: argparse.Namespace) -> None:
    rounds: dict[int, list[float]] = {n: [] for n in args.stripes}
    for _ in range(args.rounds):
        for n in args.stripes:
            rounds[n].append(_round(args, n))
    print(
        json.dumps(
            {
                "jobs": args.jobs,
                "processes": args.processes,
                "concurrency": args.concurrency,
                "median_jobs_per_s": {n: round(statistics.median(r)) for n, r in rounds.items()},
                "rounds": {n: [round(x) for x in r] for n, r in rounds.items()},
            },
            indent=2,
        )
    )


def _round(args: argparse.Namespace, stripes: int) -> float:
    from django.db import connection, transaction

    import awa_django
    from benchmarks import benchjobs

    queues = [f"stripe{i}" for i in range(stripes)]
    handles = [benchjobs.anoop.using(queue=q) for q in queues]
    first = 0
    for offset in range(0, args.jobs, 10_000):
        requests = [
            handles[i % stripes].prepare(i) for i in range(offset, min(offset + 10_000, args.jobs))
        ]
        with transaction.atomic():
            sent = awa_django.enqueue_many(requests)
        first = first or min(job.id for job in sent)
    with connection.cursor() as cursor:
        cursor.execute("CHECKPOINT")
    # The process's slots are the same whatever the stripes: C in all, C per stripe at most.
    extra: list[str] = []
    for queue in queues[1:]:
        extra += ["--queue", f"{queue}={args.concurrency}"]
    extra += ["--concurrency", str(args.concurrency)]
    rate, _ = drain(
        queues[0],
        args.jobs,
        first,
        processes=args.processes,
        concurrency=args.concurrency,
        extra=tuple(extra),
    )
    return rate


if __name__ == "__main__":
    main()
