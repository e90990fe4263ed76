"""One peer worker process: ``python -m benchmarks.peers.worker SYSTEM --concurrency N``.

Runs until SIGTERM. The environment carries ``DATABASE_URL``, ``BENCH_MODE`` and
``BENCH_LEDGER_URL`` (see ``sql.ahandle``).
"""

from __future__ import annotations

import argparse
import asyncio
from typing import cast

from benchmarks.peers import systems
from benchmarks.peers.systems.base import PeerSystem


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("system", choices=systems.NAMES)
    parser.add_argument("--concurrency", type=int, required=True)
    args = parser.parse_args()
    system = cast(PeerSystem, systems.get(args.system))
    asyncio.run(system.run_worker(args.concurrency))


if __name__ == "__main__":
    main()
