"""Drain throughput of ``awa_worker`` (embedded PostgreSQL 18 unless DATABASE_URL).

    .venv/dj52/bin/python benchmarks/drain.py [--jobs 50000] [--processes 2] [--rounds 3]

Each round pre-enqueues N no-op jobs (async by default), then runs
``manage.py awa_worker --burst --processes P --queue Q=C`` and measures, on the database clock,
the time from the first claim to the last completion (and the wall time of the whole command,
start-up included). Every round verifies that all N jobs completed exactly once. Durability is
untouched (fsync and synchronous_commit on). Prints JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]

SERVER_SETTINGS = {
    "shared_buffers": "1GB",
    "max_wal_size": "16GB",
    "checkpoint_timeout": "30min",
    "wal_buffers": "64MB",
}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=50_000)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sync", action="store_true", help="sync no-op handlers (thread pool)")
    args = parser.parse_args()

    import pgserver

    url, stop = pgserver.start(
        ROOT / ".pgdata" / "bench", database="awa_bench", settings=SERVER_SETTINGS, ephemeral=True
    )
    os.environ["DATABASE_URL"] = url
    os.environ["DJANGO_SETTINGS_MODULE"] = "benchmarks.bench_settings"
    try:
        run(args)
    finally:
        stop()


def run(args: argparse.Namespace) -> None:
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection, transaction

    import awa_django
    from benchmarks import benchjobs

    call_command("migrate", verbosity=0)
    handle = benchjobs.noop if args.sync else benchjobs.anoop
    queue = handle.options.queue
    rates: list[float] = []
    walls: list[float] = []
    for _ in range(args.rounds):
        with connection.cursor() as cursor:
            cursor.execute("SELECT awa.prune_v1('claim'), awa.prune_v1('queue')")
        for offset in range(0, args.jobs, 10_000):
            requests = [handle.prepare(i) for i in range(offset, min(offset + 10_000, args.jobs))]
            with transaction.atomic():
                awa_django.enqueue_many(requests)
        with connection.cursor() as cursor:
            cursor.execute("SELECT max(job_id) FROM awa.ready_entries")
            row = cursor.fetchone()
            cursor.execute("CHECKPOINT")
        since = int(row[0]) - args.jobs if row and row[0] else 0
        command = [
            sys.executable,
            "-m",
            "django",
            "awa_worker",
            "--burst",
            "--no-maintenance",
            "--processes",
            str(args.processes),
            "--queue",
            f"{queue}={args.concurrency}",
        ]
        start = time.perf_counter()
        subprocess.run(
            command, cwd=ROOT, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        walls.append(time.perf_counter() - start)
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*), count(DISTINCT d.job_id), "
                "extract(epoch FROM max(d.finalized_at) - min(c.claimed_at)) "
                "FROM awa.done_entries d JOIN awa.claims c "
                "ON c.job_id = d.job_id AND c.run_lease = d.run_lease "
                "WHERE d.job_id > %s AND d.state = 'completed'",
                [since],
            )
            done, distinct, seconds = cursor.fetchone()
        if done != args.jobs or distinct != args.jobs:
            raise SystemExit(
                f"expected {args.jobs} completions, found {done} ({distinct} distinct)"
            )
        rates.append(args.jobs / float(seconds))
    print(
        json.dumps(
            {
                "jobs": args.jobs,
                "processes": args.processes,
                "concurrency": args.concurrency,
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
