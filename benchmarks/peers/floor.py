"""The floor: awa_django's own claim and finalize SQL driven by a bare loop.

    python -m benchmarks.peers.floor --concurrency N     (until SIGTERM)

Each process claims up to N jobs of queue ``peers`` with ``awa.claim_v3`` (the worker's claim,
through awa_django.db.storage.claim) and at once writes them ``completed`` with one
``awa.finalize_v2`` call: no handler, no event loop, no batching delay. What the worker reaches,
compared with this, is what its Python costs.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

from benchmarks.peers.systems.base import Params


class FloorWorkers:
    """Stands in for a system's workers in ``drive.scenario_drain_like``."""

    name = "awa_django"

    def worker_commands(self, params: Params) -> list[list[str]]:
        argv = [sys.executable, "-m", "benchmarks.peers.floor", "--concurrency"]
        return [[*argv, str(params.concurrency)]] * params.processes


def main() -> None:
    import psycopg

    from awa_django.db.storage import Finalization, claim, finalize

    parser = argparse.ArgumentParser()
    parser.add_argument("--concurrency", type=int, required=True)
    args = parser.parse_args()
    stopping = False

    def stop(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as conn:
        while not stopping:
            claimed = claim(conn, "peers", args.concurrency)
            if not claimed:
                time.sleep(0.001)
                continue
            finalize(
                conn,
                [Finalization(j.job_id, j.run_lease, j.claim_slot, "completed") for j in claimed],
            )


if __name__ == "__main__":
    main()
