"""Shared plumbing of the benchmark scripts: one embedded server, bulk enqueue, a drain round."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]

# Durability untouched (fsync, synchronous_commit and full_page_writes stay on); sizes as in
# ../shared/reference/floor.md so figures compare.
SERVER_SETTINGS = {
    "shared_buffers": "1GB",
    "max_wal_size": "16GB",
    "checkpoint_timeout": "30min",
    "wal_buffers": "64MB",
}


def with_server(name: str, body: Callable[[], None], **settings: str) -> None:
    """Run ``body`` with Django set up on a fresh embedded server (or DATABASE_URL's)."""
    import pgserver

    url, stop = pgserver.start(
        ROOT / ".pgdata" / name,
        database="awa_bench",
        ephemeral=True,
        settings={**SERVER_SETTINGS, **settings},
    )
    os.environ["DATABASE_URL"] = url
    os.environ["DJANGO_SETTINGS_MODULE"] = "benchmarks.bench_settings"
    try:
        import django

        django.setup()
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
        body()
    finally:
        stop()


def enqueue(handle: Any, count: int) -> int:
    """Enqueue ``count`` jobs of ``handle`` with enqueue_many; return the lowest new job id."""
    from django.db import connection, transaction

    import awa_django

    first = 0
    for offset in range(0, count, 10_000):
        requests = [handle.prepare(i) for i in range(offset, min(offset + 10_000, count))]
        with transaction.atomic():
            handles = awa_django.enqueue_many(requests)
        first = first or handles[0].id
    with connection.cursor() as cursor:
        cursor.execute("CHECKPOINT")
    return first


def drain(
    queue: str,
    count: int,
    first_id: int,
    *,
    processes: int,
    concurrency: int | None,
    extra: tuple[str, ...] = (),
) -> tuple[float, float]:
    """Run ``awa_worker --burst`` until the queue is empty; verify ``count`` completions.

    ``concurrency`` None runs the worker as a new user would: no ``--queue`` (every queue, the
    default ``AWA["CONCURRENCY"]``). Returns (jobs/s from first claim to last completion on the
    database clock, wall seconds).
    """
    from django.db import connection

    command = [
        sys.executable,
        "-m",
        "django",
        "awa_worker",
        "--burst",
        "--no-maintenance",
        "--processes",
        str(processes),
    ]
    if concurrency is not None:
        command += ["--queue", f"{queue}={concurrency}"]
    command += extra
    start = time.perf_counter()
    subprocess.run(
        command, cwd=ROOT, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    wall = time.perf_counter() - start
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*), count(DISTINCT d.job_id), "
            "extract(epoch FROM max(d.finalized_at) - min(c.claimed_at)) "
            "FROM awa.done_entries d JOIN awa.claims c "
            "ON c.job_id = d.job_id AND c.run_lease = d.run_lease "
            "WHERE d.job_id >= %s AND d.state = 'completed'",
            [first_id],
        )
        done, distinct, seconds = cursor.fetchone()
    if done != count or distinct != count:
        raise SystemExit(f"expected {count} completions, found {done} ({distinct} distinct)")
    return count / float(seconds), wall
