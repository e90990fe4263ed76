"""What every system under test provides to the scenario driver."""

from __future__ import annotations

import dataclasses
import importlib.metadata
import os
import sys
from typing import Any, Protocol

__all__ = [
    "HANDLER_ENV",
    "Params",
    "PeerSystem",
    "Producer",
    "System",
    "dist_version",
    "handler_kind",
    "worker_argv",
]

#: ``async`` (the default) or ``sync``: which job body the producer enqueues and the workers
#: register. ``drive`` sets it from ``--handler``; worker processes inherit it.
HANDLER_ENV = "BENCH_HANDLER"


def handler_kind() -> str:
    """``async`` or ``sync``: the handler flavour of this run (see :data:`HANDLER_ENV`)."""
    kind = os.environ.get(HANDLER_ENV, "async")
    if kind not in ("async", "sync"):
        raise ValueError(f"{HANDLER_ENV}={kind!r}: expected async or sync")
    return kind


@dataclasses.dataclass(frozen=True)
class Params:
    """Worker shape shared by every system: OS processes and jobs in flight per process.

    ``handler`` is ``async`` or ``sync`` (the job body's flavour). With ``defaults`` the
    worker is started as the system ships: no concurrency, batch or polling knob set
    (``concurrency`` is then ignored).
    """

    processes: int
    concurrency: int
    handler: str = "async"
    defaults: bool = False


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
    handlers: tuple[str, ...]  # the handler flavours it runs: "async", "sync"

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

    async def run_worker(self, concurrency: int | None) -> None:
        """Serve the benchmark's queue with ``concurrency`` jobs in flight until SIGTERM
        (``None``: every worker setting at the system's default)."""
        ...


def dist_version(dist: str) -> str:
    return importlib.metadata.version(dist)


def worker_argv(name: str, params: Params) -> list[str]:
    """A peer worker process: ``python -m benchmarks.peers.worker NAME`` (``--defaults``
    leaves every worker setting at the system's default)."""
    argv = [sys.executable, "-m", "benchmarks.peers.worker", name]
    return (
        [*argv, "--defaults"]
        if params.defaults
        else [*argv, "--concurrency", str(params.concurrency)]
    )


def database_url() -> str:
    return os.environ["DATABASE_URL"]
