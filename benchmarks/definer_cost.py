"""What running the hot-path functions as their owner costs: SECURITY DEFINER with a fixed
search_path against the same functions run with the caller's privileges, interleaved.

    .venv/dj52/bin/python benchmarks/definer_cost.py [--calls 2000] [--batch-jobs 20000]
        [--rounds 7]

One PostgreSQL 18 (fsync off), two databases migrated by the working tree: ``definer`` as
migrated, and ``invoker``, where ``awa.enqueue_one_v2``, ``awa.claim_v3`` and
``awa.finalize_v2`` are altered back to SECURITY INVOKER without their search_path (the only
difference). Every round runs the same work on both, in alternating order (ABBA...):

* ``enqueue``: ``--calls`` one-job transactions of ``awa.enqueue_one_v2`` (the Python
  producer's single enqueue, the case where a per-call cost weighs most);
* ``claim+finalize x1``: ``--calls`` jobs claimed and finalized one at a time (a low-rate queue:
  one ``awa.claim_v3`` and one ``awa.finalize_v2`` per job);
* ``claim+finalize x256``: ``--batch-jobs`` jobs claimed 256 per call and finalized in batches,
  as a busy worker does.

It reports, per scenario and side, the median over rounds of the client's wall time and of the
server backend's CPU time (user+system from ``/proc``) per call or job, and the median of the
rounds' ratios definer/invoker: the two sides of a round run back to back, so a ratio compares
them at about the same speed of a machine whose speed drifts between rounds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if __name__ == "__main__":
    sys.path[:0] = [str(ROOT), str(ROOT / "scripts"), str(ROOT / "benchmarks")]

#: The functions the invoker side runs with the caller's privileges.
HOT = ("enqueue_one_v2", "claim_v3", "finalize_v2")
SCENARIOS = ("enqueue", "claim+finalize x1", "claim+finalize x256")
ARGS = '{"args": [], "kwargs": {}}'


class Bench:
    """One side: an autocommit connection and its backend's CPU clock (write_cost.Side)."""

    def __init__(self, label: str, alias: str) -> None:
        from write_cost import Side  # type: ignore[import-not-found,unused-ignore]

        self.side = Side(label, alias)
        self.label = label
        self.results: dict[str, list[tuple[float, float]]] = {s: [] for s in SCENARIOS}

    def measure(self, scenario: str, n: int, run: Callable[[], None]) -> None:
        t0, c0 = time.perf_counter(), self.side.cpu()
        run()
        wall, cpu = time.perf_counter() - t0, self.side.cpu() - c0
        self.results[scenario].append((wall / n * 1e6, cpu / n * 1e6))

    def enqueue(self, calls: int) -> None:
        conn = self.side.conn
        statement = "SELECT job_id FROM awa.enqueue_one_v2('bench.definer', 'definer', 0, %s, 25)"

        def run() -> None:
            for _ in range(calls):
                conn.execute(statement, [ARGS])

        self.measure("enqueue", calls, run)

    def drain(self, scenario: str, n: int, per_claim: int) -> None:
        from awa_django.db import storage
        from awa_django.db.storage import Finalization

        conn = self.side.conn

        def run() -> None:
            done = 0
            while done < n:
                claimed = storage.claim(conn, "definer", min(per_claim, n - done))
                if not claimed:
                    raise SystemExit(f"{self.label}: nothing left to claim after {done} jobs")
                items = [Finalization(c.job_id, c.run_lease, c.claim_slot, "completed")
                         for c in claimed]  # fmt: skip
                if storage.finalize(conn, items):
                    raise SystemExit(f"{self.label}: a finalization was refused as stale")
                done += len(claimed)

        self.measure(scenario, n, run)

    def round(self, calls: int, batch_jobs: int) -> None:
        self.enqueue(calls)
        self.drain("claim+finalize x1", calls, 1)
        batch = json.dumps([{"kind": "bench.definer", "queue": "definer"}] * 500)
        for _ in range(batch_jobs // 500):
            self.side.conn.execute("SELECT count(*) FROM awa.enqueue_v1(%s::jsonb)", [batch])
        self.drain("claim+finalize x256", batch_jobs // 500 * 500, 256)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--calls", type=int, default=2_000, help="one-job calls per round")
    parser.add_argument("--batch-jobs", type=int, default=20_000, help="batched jobs per round")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()

    import pgserver  # type: ignore[import-not-found,unused-ignore]
    import psycopg
    from write_cost import setup_django  # type: ignore[import-not-found,unused-ignore]

    url, stop = pgserver.start(
        ROOT / ".pgdata" / "bench-definer", database="awa_definer", ephemeral=True, fsync=False
    )
    try:
        with psycopg.connect(url, autocommit=True) as admin:
            admin.execute("DROP DATABASE IF EXISTS awa_invoker")
            admin.execute("CREATE DATABASE awa_invoker")
        setup_django(url, url.rsplit("/", 1)[0] + "/awa_invoker")
        from django.core.management import call_command

        for alias in ("default", "after"):
            call_command("migrate", "awa_django", verbosity=0, database=alias)
        sides = [Bench("definer", "default"), Bench("invoker", "after")]
        for name in HOT:
            sides[1].side.conn.execute(
                f"ALTER FUNCTION awa.{name} SECURITY INVOKER RESET search_path"
            )
        for bench in sides:  # warm up: plans, caches, some history in both
            bench.round(args.calls, args.batch_jobs)
            bench.results = {s: [] for s in SCENARIOS}
            bench.side.conn.execute("VACUUM ANALYZE")
        started = time.perf_counter()
        for r in range(args.rounds):
            for bench in sides if r % 2 == 0 else sides[::-1]:
                bench.round(args.calls, args.batch_jobs)
        print(f"{args.rounds} rounds in {time.perf_counter() - started:.0f} s; per call or job: "
              "medians over rounds of client wall time / server CPU (us), and the median of "
              "each round's definer/invoker ratio (both sides ran back to back)")  # fmt: skip
        for scenario in SCENARIOS:
            for bench in sides:
                walls = [w for w, _ in bench.results[scenario]]
                cpus = [c for _, c in bench.results[scenario]]
                print(
                    f"  {scenario:20} {bench.label:8} {statistics.median(walls):7.1f} / "
                    f"{statistics.median(cpus):6.1f}   (wall per round: "
                    f"{', '.join(f'{w:.0f}' for w in walls)})"
                )
            pairs = list(zip(sides[0].results[scenario], sides[1].results[scenario], strict=True))
            wall = statistics.median(d[0] / i[0] for d, i in pairs)
            cpu = statistics.median(d[1] / i[1] for d, i in pairs if i[1] > 0)
            print(f"  {scenario:20} definer/invoker: wall {wall:.3f}, server CPU {cpu:.3f}")
        for bench in sides:
            bench.side.conn.close()
    finally:
        stop()


if __name__ == "__main__":
    main()
