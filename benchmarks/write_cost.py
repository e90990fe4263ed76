"""What a schema change costs the write path: server CPU per job, before and after, interleaved.

    .venv/dj52/bin/python benchmarks/write_cost.py [--before HEAD] [--jobs 20000]
        [--rounds 7] [--warmup 100000] [--open-workflow]

One PostgreSQL 18 (fsync off), two databases: one migrated by the awa_django of the git ref
``--before`` (default ``HEAD``, so: the working tree's change against the last commit; any
commit, branch or tag since the settled schema works), one by the working tree's. Both are
driven by the working tree's Python, so the ref's SQL must keep the signatures it calls. After
``--warmup`` jobs through each (so both have history and indexes of the same depth), every round
runs the same work on both, in alternating order (ABBA...): enqueue ``--jobs`` jobs
(``awa.enqueue_v1``, 500 per call), then claim (``awa.claim_v3``, 256 per call) and finalize them
all as completed (``awa.finalize_v2``), as a worker does (``--outcome retry``: as handler errors,
which the database sends to the deferred plane with its backoff). It reports the median server
CPU per job of each phase (the backend's user+system time from ``/proc``, so the client and other
processes do not count) and the ratio after/before.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if __name__ == "__main__":
    sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]


def migrate_at(ref: str, url: str) -> None:
    """Migrate the database at ``url`` with the awa_django of git ``ref`` (its own migrations and
    SQL files, from ``git archive``), in a subprocess."""
    import io
    import subprocess
    import tarfile
    import tempfile

    archive = subprocess.run(
        ["git", "archive", ref, "awa_django"], cwd=ROOT, check=True, capture_output=True
    ).stdout
    with tempfile.TemporaryDirectory() as tree:
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(tree, filter="data")
        env = {
            **os.environ,
            "DATABASE_URL": url,
            "DJANGO_SETTINGS_MODULE": "benchmarks.bench_settings",
            "PYTHONPATH": os.pathsep.join([tree, str(ROOT)]),
        }
        subprocess.run(
            [sys.executable, "-m", "django", "migrate", "awa_django", "--verbosity", "0"],
            cwd=ROOT,
            env=env,
            check=True,
        )


def setup_django(before_url: str, after_url: str) -> None:
    import django
    import environ
    from django.conf import settings

    env = environ.Env()
    settings.configure(
        SECRET_KEY="benchmarks-only",
        USE_TZ=True,
        DATABASES={"default": env.db_url_config(before_url), "after": env.db_url_config(after_url)},
        INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth", "awa_django"],
        DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
        AWA={},
    )
    django.setup()


def conninfo(alias: str) -> str:
    import psycopg
    from django.db import connections

    s = connections[alias].settings_dict
    return psycopg.conninfo.make_conninfo(
        dbname=s["NAME"],
        user=s["USER"] or None,
        password=s["PASSWORD"] or None,
        host=s["HOST"] or None,
        port=str(s["PORT"]) if s["PORT"] else None,
    )


class Side:
    """One database and one autocommit connection, with its backend's CPU clock."""

    def __init__(self, label: str, alias: str) -> None:
        import psycopg

        self.label = label
        self.conn = psycopg.connect(conninfo(alias), autocommit=True)
        self.conn.execute("SET default_transaction_isolation = 'read committed'")
        self.pid = self.conn.execute("SELECT pg_backend_pid()").fetchone()[0]  # type: ignore[index]
        self.enqueue_us: list[float] = []
        self.claim_finalize_us: list[float] = []
        self.claim_us: list[float] = []

    def cpu(self) -> float:
        fields = Path(f"/proc/{self.pid}/stat").read_text().split()
        return (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK")

    def cycle(self, jobs: int, outcome: str = "completed") -> tuple[float, float]:
        from awa_django.db import storage
        from awa_django.db.storage import Finalization

        batch = json.dumps([{"kind": "bench.write", "queue": "writecost"}] * 500)
        t0 = self.cpu()
        for _ in range(max(jobs // 500, 1)):
            self.conn.execute("SELECT count(*) FROM awa.enqueue_v1(%s::jsonb)", [batch])
        t1 = self.cpu()
        claiming = 0.0
        while True:
            c0 = self.cpu()
            claimed = storage.claim(self.conn, "writecost", 256)
            claiming += self.cpu() - c0
            if not claimed:
                break
            extra: dict[str, Any] = (
                {"error": {"message": "boom"}, "backoff_base": 1.0} if outcome == "retry" else {}
            )
            done = [
                Finalization(c.job_id, c.run_lease, c.claim_slot, outcome, **extra) for c in claimed
            ]
            if storage.finalize(self.conn, done):
                raise SystemExit(f"{self.label}: a finalization was refused as stale")
        t2 = self.cpu()
        n = max(jobs // 500, 1) * 500
        self.claim_us.append(claiming / n * 1e6)
        return (t1 - t0) / n * 1e6, (t2 - t1) / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--before", default="HEAD", help="the git ref whose SQL to compare with")
    parser.add_argument("--jobs", type=int, default=20_000, help="jobs per round and side")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument(
        "--outcome", choices=["completed", "retry"], default="completed", help="how jobs end"
    )
    parser.add_argument("--warmup", type=int, default=100_000, help="jobs through each side first")
    parser.add_argument(
        "--open-workflow",
        action="store_true",
        help="keep a workflow open on the after side (its finalizes then look for steps)",
    )
    args = parser.parse_args()

    import pgserver  # type: ignore[import-not-found,unused-ignore]

    url, stop = pgserver.start(
        ROOT / ".pgdata" / "bench-write-cost", database="awa_before", ephemeral=True, fsync=False
    )
    try:
        import psycopg

        with psycopg.connect(url, autocommit=True) as admin:
            admin.execute("DROP DATABASE IF EXISTS awa_after")
            admin.execute("CREATE DATABASE awa_after")
        setup_django(url, url.rsplit("/", 1)[0] + "/awa_after")
        from django.core.management import call_command

        migrate_at(args.before, url)
        call_command("migrate", "awa_django", verbosity=0, database="after")
        sides = [Side(f"before ({args.before})", "default"), Side("after (latest)", "after")]
        for side in sides:
            side.cycle(args.warmup, args.outcome)
            side.conn.execute("VACUUM ANALYZE")
        if args.open_workflow:  # a step that waits on a job of a queue nobody claims
            spec = {
                "name": "open",
                "steps": [
                    {"step": "a", "job": {"kind": "k", "queue": "elsewhere"}},
                    {"step": "b", "job": {"kind": "k", "queue": "elsewhere"}, "after": ["a"]},
                ],
            }
            sides[1].conn.execute(
                "SELECT count(*) FROM awa.workflow_enqueue_v1(%s::jsonb)", [json.dumps(spec)]
            )
        started = time.perf_counter()
        for r in range(args.rounds):
            for side in sides if r % 2 == 0 else sides[::-1]:
                enqueue_us, claim_finalize_us = side.cycle(args.jobs, args.outcome)
                side.enqueue_us.append(enqueue_us)
                side.claim_finalize_us.append(claim_finalize_us)
        print(
            f"{args.rounds} rounds of {args.jobs} jobs per side in "
            f"{time.perf_counter() - started:.0f} s; server CPU per job, median (all rounds):"
        )
        medians = {}
        for side in sides:
            medians[side.label] = (
                statistics.median(side.enqueue_us),
                statistics.median(side.claim_finalize_us),
            )
            print(
                f"  {side.label:28} enqueue {medians[side.label][0]:6.2f} us  "
                f"claim+finalize {medians[side.label][1]:6.2f} us "
                f"(claim {statistics.median(side.claim_us):5.2f} us)  "
                f"({', '.join(f'{x:.1f}' for x in side.claim_finalize_us)})"
            )
            side.conn.close()
        (b_enq, b_cf), (a_enq, a_cf) = medians.values()
        print(f"  after/before: enqueue {a_enq / b_enq:.3f}, claim+finalize {a_cf / b_cf:.3f}")
    finally:
        stop()


if __name__ == "__main__":
    main()
