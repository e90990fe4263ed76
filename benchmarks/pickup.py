"""Pickup latency of an idle ``awa_worker`` (embedded PostgreSQL 18 unless DATABASE_URL).

    .venv/dj52/bin/python benchmarks/pickup.py [--jobs 500] [--rate 50]

A worker runs idle; jobs are enqueued one per committed transaction at a fixed rate. Latency is
measured on the database clock from the job's insert (``clock_timestamp()`` in the enqueue
function, just before its commit) to its claim (the claim statement's ``now()``, just before
the handler starts). Prints p50/p95/p99 in milliseconds as JSON.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

from common import ROOT, with_server


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=500)
    parser.add_argument("--rate", type=float, default=50.0, help="jobs per second offered")
    args = parser.parse_args()

    with_server("bench", lambda: run(args))


def run(args: argparse.Namespace) -> None:
    from django.db import connection

    from benchmarks import benchjobs

    benchjobs.anoop.enqueue(-1)  # lanes exist before the worker starts
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "django",
            "awa_worker",
            "--no-maintenance",
            "--queue",
            "bench-async=16",
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        with connection.cursor() as cursor:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:  # wait until the worker has taken the first job
                cursor.execute("SELECT count(*) FROM awa.claims")
                row = cursor.fetchone()
                if row and row[0]:
                    break
                time.sleep(0.05)
        interval = 1.0 / args.rate
        next_at = time.perf_counter()
        ids = []
        for i in range(args.jobs):
            ids.append(benchjobs.anoop.enqueue(i).id)  # autocommit: one transaction each
            next_at += interval
            time.sleep(max(0.0, next_at - time.perf_counter()))
        with connection.cursor() as cursor:
            for _ in range(600):
                cursor.execute("SELECT count(*) FROM awa.claims WHERE job_id = ANY(%s)", [ids])
                row = cursor.fetchone()
                if row and row[0] == len(ids):
                    break
                time.sleep(0.05)
            cursor.execute(
                "SELECT percentile_cont(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP (ORDER BY ms), "
                "count(*) FROM (SELECT extract(epoch FROM c.claimed_at - r.created_at) * 1000 "
                "AS ms "
                "FROM awa.claims c JOIN awa.ready_entries r ON r.job_id = c.job_id "
                "AND r.lane_id = c.lane_id AND r.lane_seq = c.lane_seq "
                "WHERE c.job_id = ANY(%s)) x",
                [ids],
            )
            (p50, p95, p99), n = cursor.fetchone()
    finally:
        worker.terminate()
        worker.wait(30)
    print(
        json.dumps(
            {
                "jobs": n,
                "rate_per_s": args.rate,
                "pickup_p50_ms": round(p50, 2),
                "pickup_p95_ms": round(p95, 2),
                "pickup_p99_ms": round(p99, 2),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
