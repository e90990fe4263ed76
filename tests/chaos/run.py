"""The chaos driver: ``python -m tests.chaos.run --seed N [--duration S] [--soak] [--runs K]``.

Each run gets a fresh database on the chaos cluster (``.pgdata/chaos/data``, or the server of
``DATABASE_URL``, where PostgreSQL restarts are skipped), K ``awa_worker`` processes supervised by
the driver, producer threads, an operator thread, the fault injector, an observer and a callback
resolver; then every invariant of tests/chaos/check.py is checked (see tests/chaos/driver.py).

Default (CI): 2 runs of 45 s, seeds N and N+1, 3 producers, 48 spread queues, a fault every 1-3 s.
``--soak``: one run of 150 s (3.3 times CI's jobs and faults), 200 spread queues. ``--runs K``:
K runs with seeds N, N+1, ... The exit status is 1 when any run found a violation, and the
command that reproduces it is printed. Worker logs are in ``.pgdata/chaos/runs/seed-N/``; the
database of a run with violations is kept (``chaos_N``), as is every run's with ``--keep``.
``--break NAME`` (tests/chaos/sabotage.py) runs a deliberately broken harness: the run must then
report violations of that invariant.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import signal
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DEFAULT_SEED = 1


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m tests.chaos.run", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED, help="seed of the first run")
    parser.add_argument("--duration", type=float, help="seconds of faults per run")
    parser.add_argument(
        "--soak", action="store_true", help="the soak profile: longer, harder runs (150 s)"
    )
    parser.add_argument("--runs", type=int, help="runs, with seeds seed, seed+1, ...")
    parser.add_argument("--producers", type=int, help="producer threads per run")
    parser.add_argument("--queues", type=int, help="spread queues plain jobs go to")
    parser.add_argument(
        "--keep", action="store_true", help="keep every run's database (default: failed runs')"
    )
    parser.add_argument(
        "--break",
        dest="sabotage",
        metavar="NAME[,NAME]",
        help="break the harness on purpose (tests/chaos/sabotage.py; 'all' for every one): "
        "the run must report violations",
    )
    return parser.parse_args(argv)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    # SIGTERM unwinds like Ctrl-C, so that every run's workers and the cluster are stopped.
    signal.signal(signal.SIGTERM, _interrupt)
    runs = args.runs or (1 if args.soak else 2)
    sys.path.insert(0, str(REPO))
    if args.sabotage:
        os.environ["AWA_CHAOS_BREAK"] = args.sabotage
    if args.soak:  # read by tests/chaos/settings.py, here and in the workers
        os.environ["AWA_CHAOS_HISTORY_RETENTION"] = "60"
    from tests.chaos.cluster import Cluster

    cluster = Cluster(REPO / ".pgdata" / "chaos" / "data")
    base_url = cluster.start()
    if not cluster.restartable:
        print("chaos: DATABASE_URL is set: using that server; PostgreSQL restarts are skipped")
    # Django reads DATABASE_URL once, at set-up; each run then points it at its own database.
    os.environ.setdefault("DATABASE_URL", base_url)
    os.environ["DJANGO_SETTINGS_MODULE"] = "tests.chaos.settings"
    import django

    django.setup()
    from tests.chaos.driver import CI, SOAK, ChaosRun, report
    from tests.chaos.sabotage import enabled

    enabled()  # refuses unknown names before anything starts
    base = SOAK if args.soak else CI
    profile = dataclasses.replace(
        base,
        duration=args.duration or base.duration,
        producers=args.producers or base.producers,
        queues=args.queues or base.queues,
    )
    duration = profile.duration
    failed: list[int] = []
    try:
        for index in range(runs):
            seed = args.seed + index
            started = time.monotonic()
            print(f"chaos: run {index + 1}/{runs}, seed {seed}, {duration:.0f} s", flush=True)
            chaos = ChaosRun(cluster, seed, index, profile)
            violations, data = chaos.execute()
            report(chaos, violations, data, time.monotonic() - started)
            if violations:
                failed.append(seed)
            elif not args.keep:
                cluster.drop_database(chaos.db_name)
    finally:
        cluster.stop()
    if failed:
        print("\nchaos: violations found; reproduce with:")
        extra = " --soak" if args.soak else ""
        extra += f" --break {args.sabotage}" if args.sabotage else ""
        for seed in failed:
            print(
                f"  python -m tests.chaos.run --seed {seed} --duration {duration:.0f} --runs 1"
                + extra
            )
        return 1
    print(f"\nchaos: {runs} run(s), no violation")
    return 0


if __name__ == "__main__":
    sys.exit(main())
