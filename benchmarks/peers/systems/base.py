"""What every system under test provides to the scenario driver."""

from __future__ import annotations

import dataclasses
import importlib.metadata
import os
import sys
from typing import Any, Protocol

__all__ = ["Params", "PeerSystem", "Producer", "System", "dist_version", "worker_argv"]


@dataclasses.dataclass(frozen=True)
class Params:
    """Worker shape shared by every system: OS processes and jobs in flight per process."""

    processes: int
    concurrency: int


class Producer(Protocol):
    """Enqueues jobs through a system's public API. Each ``one`` is its own committed
    transaction; ``many`` is the system's bulk path (one call, one transaction)."""

    async def one(self, key: int) -> None: ...

    async def many(self, keys: list[int]) -> None: ...

    async def close(self) -> None: ...


class System(Protocol):
    """A queue under test. Jobs carry one integer ``key``; handlers run ``sql.(a)handle``."""

    name: str
    sql_prefix: str  # of its queries in queries.sql: <prefix>_window, <prefix>_count

    def version(self) -> str: ...

    def config(self, params: Params) -> dict[str, Any]:
        """Every setting the benchmark uses, for the JSON report."""
        ...

    async def install(self) -> None:
        """Install the schema into ``DATABASE_URL`` with the system's own path."""
        ...

    async def producer(self) -> Producer: ...

    def worker_commands(self, params: Params) -> list[list[str]]:
        """argv of the worker processes to start (they inherit the environment)."""
        ...


class PeerSystem(System, Protocol):
    """A peer whose worker process is ``benchmarks.peers.worker`` (awa_django and
    django-tasks-db use their own management commands instead)."""

    async def run_worker(self, concurrency: int) -> None:
        """Serve the benchmark's queue with ``concurrency`` jobs in flight until SIGTERM."""
        ...


def dist_version(dist: str) -> str:
    return importlib.metadata.version(dist)


def worker_argv(name: str, concurrency: int) -> list[str]:
    """A peer worker process: ``python -m benchmarks.peers.worker NAME``."""
    return [
        sys.executable,
        "-m",
        "benchmarks.peers.worker",
        name,
        "--concurrency",
        str(concurrency),
    ]


def database_url() -> str:
    return os.environ["DATABASE_URL"]
