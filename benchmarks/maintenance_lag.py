"""How late maintenance runs while the workers are saturated (embedded PostgreSQL 18 unless
DATABASE_URL).

    .venv/dj52/bin/python benchmarks/maintenance_lag.py [--jobs 600000] [--processes 2]
        [--concurrency 512] [--seconds 60]

A backlog of ``--jobs`` no-op jobs (half sync, half async handlers) is drained by one
``awa_worker --processes P --concurrency C``, whose elected leader also does maintenance in one
of those processes. Meanwhile, every half second, a probe job is enqueued to run one second
later (``run_after``, so the leader has to promote it), and once a second a stale attempt is
planted (a claim of a probe job whose worker never ran it: the leader has to rescue it after
``HEARTBEAT_STALENESS``). Measured, on the database clock:

* ``promotion``: from a probe's ``run_at`` to its claim (promotion, then a claim);
* ``rescue``: from the moment a planted attempt became stale to its rescue (its retry row).

Prints the median, p95 and worst of each as JSON, and how many jobs per second were drained.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import threading
import time
import uuid
from datetime import timedelta

from common import ROOT, with_server

STALENESS = 2.0


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=600_000)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=512)
    parser.add_argument("--seconds", type=float, default=60.0, help="how long to probe")
    args = parser.parse_args()
    with_server("maintenance-lag", lambda: run(args))


def quantiles(values: list[float]) -> dict[str, float | int | None]:
    if not values:
        return {"n": 0, "p50": None, "p95": None, "max": None}
    values = sorted(values)
    return {
        "n": len(values),
        "p50": round(statistics.median(values), 3),
        "p95": round(values[min(len(values) - 1, int(len(values) * 0.95))], 3),
        "max": round(values[-1], 3),
    }


def run(args: argparse.Namespace) -> None:
    import os

    import psycopg
    from django.db import transaction

    import awa_django
    from benchmarks import benchjobs

    url = os.environ["DATABASE_URL"]
    for first in range(0, args.jobs, 20_000):
        n = min(20_000, args.jobs - first)
        with transaction.atomic():
            awa_django.enqueue_many(
                [(benchjobs.noop if i % 2 else benchjobs.anoop).prepare(i) for i in range(n)]
            )
    env = {
        **os.environ,
        "AWA_BENCH_SETTINGS": json.dumps(
            {"HEARTBEAT_STALENESS": STALENESS, "HEARTBEAT_INTERVAL": 0.5}
        ),
    }
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "django",
            "awa_worker",
            "--processes",
            str(args.processes),
            "--concurrency",
            str(args.concurrency),
            # Not the orphans' queue: their attempts are planted, never run.
            *("--queue", "bench", "--queue", "bench-async", "--queue", "probe"),
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    probes: list[int] = []
    planted: list[tuple[int, int]] = []
    stop = threading.Event()

    def probe() -> None:
        with psycopg.connect(url, autocommit=True) as conn:
            while not stop.is_set():
                probes.append(benchjobs.probe.using(run_after=timedelta(seconds=1)).enqueue(0).id)
                if len(probes) % 2 == 0:
                    # A stale attempt: claimed by a worker id that never runs it.
                    benchjobs.orphan.enqueue(0)
                    rows = conn.execute(
                        "SELECT job_id, run_lease FROM awa.claim_v3('orphans', 1, %s)",
                        [uuid.uuid4()],
                    ).fetchall()
                    planted.extend((j, lease) for j, lease in rows if j is not None)
                stop.wait(0.5)

    began = time.monotonic()
    thread = threading.Thread(target=probe)
    thread.start()
    time.sleep(args.seconds)
    stop.set()
    thread.join()
    time.sleep(STALENESS + 5)
    with psycopg.connect(url, autocommit=True) as conn:
        done = conn.execute(
            "SELECT count(*) FROM awa.done_entries WHERE kind LIKE 'benchmarks.benchjobs.%%noop'"
        ).fetchone()
        promotion = [
            float(r[0])
            for r in conn.execute(
                "SELECT extract(epoch FROM c.claimed_at - r.run_at) FROM awa.claims c "
                "JOIN awa.ready_entries r ON r.job_id = c.job_id AND r.lane_id = c.lane_id "
                "AND r.lane_seq = c.lane_seq WHERE c.job_id = ANY(%s)",
                [probes],
            )
        ]
        rescue = [
            float(r[0])
            for r in conn.execute(
                "SELECT extract(epoch FROM z.closed_at - (c.claimed_at "
                "+ make_interval(secs => %s))) FROM awa.claims c JOIN awa.claim_closures z "
                "USING (claim_slot, job_id, run_lease) WHERE (c.job_id, c.run_lease) "
                "IN (SELECT * FROM unnest(%s::bigint[], %s::bigint[]))",
                [STALENESS, [j for j, _ in planted], [lease for _, lease in planted]],
            )
        ]
    worker.terminate()
    worker.wait(120)
    elapsed = time.monotonic() - began
    print(
        json.dumps(
            {
                "jobs": args.jobs,
                "processes": args.processes,
                "concurrency": args.concurrency,
                "drained_per_s": round((done[0] if done else 0) / elapsed),
                "promotion_lag_s": quantiles(promotion),
                "rescue_lag_s": quantiles(rescue),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
