"""One peer worker process: ``python -m benchmarks.peers.worker SYSTEM --concurrency N``
(or ``--defaults``: every worker setting at the system's default).

Runs until SIGTERM. The environment carries ``DATABASE_URL``, ``BENCH_MODE``, ``BENCH_HANDLER`` and
``BENCH_LEDGER_URL`` (see ``sql.ahandle`` and ``systems.base.handler_kind``).
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
    shape = parser.add_mutually_exclusive_group(required=True)
    shape.add_argument("--concurrency", type=int)
    shape.add_argument("--defaults", action="store_true", help="the system's own defaults")
    args = parser.parse_args()
    system = cast(PeerSystem, systems.get(args.system))
    asyncio.run(system.run_worker(None if args.defaults else args.concurrency))


if __name__ == "__main__":
    main()
