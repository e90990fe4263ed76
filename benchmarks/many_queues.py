"""One ``awa_worker`` serving many queues (embedded PostgreSQL 18 unless DATABASE_URL).

    .venv/dj52/bin/python benchmarks/many_queues.py [--queues 10000] [--idle 20] [--pickups 20]
        [--no-notify] [--shards 4]

One job is enqueued in each of ``--queues`` queues (a queue per tenant), then one worker starts
without ``--queue`` (it serves every queue) at the default settings (``--no-notify``: with
``AWA["NOTIFY"] = False``, so that only the sweep of idle queues finds a job; ``--shards``:
``AWA["ENQUEUE_SHARDS"]``, the lanes per queue). Measured:

* ``drain_s``: from the worker's start until every one of those jobs completed;
* ``idle_worker_cpu`` and ``idle_server_cpu``: once everything ran, the share of one core the
  worker process and its server backends use over ``--idle`` seconds (from /proc);
* ``pickup_ms``: the latency of a job enqueued, one at a time, in a random queue of them
  (median and worst of ``--pickups``), on the database clock from the job's insert to its claim.

Prints JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time

from common import ROOT, with_server

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--queues", type=int, default=10_000)
    parser.add_argument("--idle", type=float, default=20.0, help="seconds of idle to sample")
    parser.add_argument("--pickups", type=int, default=20)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--log", help="write the worker's output to this file")
    parser.add_argument("--no-notify", action="store_true", help="AWA['NOTIFY'] = False")
    parser.add_argument("--shards", type=int, default=4, help="AWA['ENQUEUE_SHARDS']")
    args = parser.parse_args()
    # Read by benchmarks/bench_settings.py, here and in the worker process.
    os.environ["AWA_BENCH_SETTINGS"] = json.dumps(
        {"NOTIFY": not args.no_notify, "ENQUEUE_SHARDS": args.shards}
    )
    with_server("many-queues", lambda: run(args), max_connections="100")


def cpu_seconds(pids: list[int]) -> float:
    """User plus system CPU seconds of ``pids`` so far (those that still exist)."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / CLOCK_TICKS


def scalar(sql: str, params: list[object] | None = None) -> object:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(sql, params or [])
        row = cursor.fetchone()
    return row[0] if row else None


def wait_until(predicate: object, timeout: float, what: str) -> float:
    began = time.monotonic()
    while not predicate():  # type: ignore[operator]
        if time.monotonic() - began > timeout:
            raise SystemExit(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.05)
    return time.monotonic() - began


def run(args: argparse.Namespace) -> None:
    from django.db import transaction

    import awa_django
    from benchmarks import benchjobs

    names = [f"tenant-{i}" for i in range(args.queues)]
    began = time.monotonic()
    ids: list[int] = []
    for first in range(0, len(names), 250):
        with transaction.atomic():
            handles = awa_django.enqueue_many(
                [benchjobs.anoop.using(queue=n).prepare(0) for n in names[first : first + 250]]
            )
        ids += [h.id for h in handles]
    enqueue_s = time.monotonic() - began
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "django",
            "awa_worker",
            "--concurrency",
            str(args.concurrency),
        ],
        cwd=ROOT,
        stdout=open(args.log, "w") if args.log else subprocess.DEVNULL,  # noqa: SIM115
        stderr=subprocess.STDOUT,
    )
    try:
        done = (
            "SELECT count(*) FROM awa.done_entries WHERE state = 'completed' AND job_id = ANY(%s)"
        )
        drain_s = wait_until(lambda: scalar(done, [ids]) == args.queues, 3600, "the drain")
        time.sleep(15.0)  # the last finalizations, confirmations and rotations
        backends = [
            int(pid)
            for (pid,) in _rows(
                "SELECT pid FROM pg_stat_activity WHERE application_name LIKE 'awa:worker:%%'"
            )
        ]
        worker_before, server_before = cpu_seconds([worker.pid]), cpu_seconds(backends)
        time.sleep(args.idle)
        worker_cpu = (cpu_seconds([worker.pid]) - worker_before) / args.idle
        server_cpu = (cpu_seconds(backends) - server_before) / args.idle
        latencies = []
        for _ in range(args.pickups):
            job = benchjobs.anoop.using(queue=random.choice(names)).enqueue(1)
            wait_until(
                lambda job_id=job.id: scalar(
                    "SELECT count(*) FROM awa.claims WHERE job_id = %s", [job_id]
                ),
                60,
                "a pickup",
            )
            latencies.append(
                float(
                    scalar(  # type: ignore[arg-type]
                        "SELECT extract(epoch FROM c.claimed_at - r.created_at) * 1000 "
                        "FROM awa.claims c JOIN awa.ready_entries r ON r.job_id = c.job_id "
                        "AND r.lane_id = c.lane_id AND r.lane_seq = c.lane_seq "
                        "WHERE c.job_id = %s",
                        [job.id],
                    )
                )
            )
            time.sleep(0.2)
    finally:
        worker.terminate()
        worker.wait(60)
    print(
        json.dumps(
            {
                "queues": args.queues,
                "notify": not args.no_notify,
                "shards": args.shards,
                "concurrency": args.concurrency,
                "enqueue_s": round(enqueue_s, 1),
                "drain_s": round(drain_s, 2),
                "idle_worker_cpu": round(worker_cpu, 3),
                "idle_server_cpu": round(server_cpu, 3),
                "pickup_ms_median": round(statistics.median(latencies), 2),
                "pickup_ms_max": round(max(latencies), 2),
                "pickup_ms": [round(x, 1) for x in latencies],
            },
            indent=2,
        )
    )


def _rows(sql: str) -> list[tuple[object, ...]]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(sql)
        return list(cursor.fetchall())


if __name__ == "__main__":
    main()
