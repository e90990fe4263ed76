"""Steady load on one ``awa_worker`` process: throughput, end-to-end latency and worker memory.

    .venv/dj52/bin/python benchmarks/steady.py [--seconds 600] [--rate 2000]

A producer offers ``rate`` jobs/s (bulk enqueues every 100 ms, credit on real elapsed time) to
an async no-op queue served by one worker process (plus its maintenance leader, with the
default intervals). Every 10 s the worker's resident memory (VmRSS) is sampled. Reports the
completion rate, end-to-end latency (insert to finalization, database clock) and the RSS series.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from common import ROOT, with_server


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=600.0)
    parser.add_argument("--rate", type=float, default=2000.0)
    args = parser.parse_args()

    with_server("bench-steady", lambda: run(args), shared_buffers="1GB")


def run(args: argparse.Namespace) -> None:
    from django.db import connection, transaction

    import awa_django
    from benchmarks import benchjobs

    benchjobs.anoop.enqueue(-1)
    worker = subprocess.Popen(
        [sys.executable, "-m", "django", "awa_worker", "--queue", "bench-async=256"],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    samples: list[tuple[float, int]] = []
    sent = 0
    try:
        start = time.perf_counter()
        next_sample = start
        while (now := time.perf_counter()) - start < args.seconds:
            due = int((now - start) * args.rate) - sent
            if due > 0:
                with transaction.atomic():
                    awa_django.enqueue_many([benchjobs.anoop.prepare(i) for i in range(due)])
                sent += due
            if now >= next_sample:
                samples.append((round(now - start, 1), rss_kib(worker.pid)))
                next_sample += 10.0
            time.sleep(0.1)
        elapsed = time.perf_counter() - start
        time.sleep(2.0)
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*), percentile_cont(ARRAY[0.5, 0.95]) WITHIN GROUP (ORDER BY ms) "
                "FROM (SELECT extract(epoch FROM finalized_at - created_at) * 1000 AS ms "
                "FROM awa.terminal_jobs WHERE state = 'completed') x"
            )
            done, (p50, p95) = cursor.fetchone()
    finally:
        worker.terminate()
        worker.wait(60)
    print(
        json.dumps(
            {
                "seconds": round(elapsed, 1),
                "offered_per_s": args.rate,
                "sent": sent,
                "completed": done,
                "completed_per_s": round(done / elapsed),
                "steady_e2e_p50_ms": round(p50, 2),
                "steady_e2e_p95_ms": round(p95, 2),
                "worker_rss_kib": samples,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
