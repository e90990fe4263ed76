"""PgQueuer with its asyncpg driver (its documented default) or its psycopg driver:
``Queries.enqueue`` (scalar or list form); ``PgQueuer.run`` in each worker process.
PgQueuer 1.x refuses sync entrypoints (``EntrypointExecutor`` raises ``TypeError``: "Sync
entrypoints are no longer supported"), so it has no sync runs; default-settings runs call
``PgQueuer.run()`` bare (batch_size=10, no max_concurrent_tasks cap, 30 s dequeue timeout)."""

from __future__ import annotations

import asyncio
import signal
from typing import Any

from benchmarks.peers.sql import ahandle
from benchmarks.peers.systems.base import Params, database_url, dist_version, worker_argv

ENTRYPOINT = "peer"
BATCH_SIZE = 10  # QueueManager.run's default dequeue batch


async def _driver(kind: str) -> Any:
    from pgqueuer import AsyncpgDriver, PsycopgDriver

    if kind == "asyncpg":
        import asyncpg

        return AsyncpgDriver(await asyncpg.connect(database_url()))
    import psycopg

    return PsycopgDriver(await psycopg.AsyncConnection.connect(database_url(), autocommit=True))


async def _close(driver: Any) -> None:
    """Close the connection under a driver (the drivers expose no close of their own)."""
    connection = getattr(driver, "_connection", None) or getattr(driver, "connection", None)
    if connection is not None:
        await connection.close()


class PgqueuerProducer:
    def __init__(self, kind: str) -> None:
        self.kind = kind

    async def open(self) -> PgqueuerProducer:
        from pgqueuer import Queries

        self.driver = await _driver(self.kind)
        self.queries = Queries(self.driver)
        return self

    async def one(self, key: int) -> None:
        await self.queries.enqueue(ENTRYPOINT, str(key).encode())

    async def many(self, keys: list[int]) -> None:
        await self.queries.enqueue(
            [ENTRYPOINT] * len(keys), [str(key).encode() for key in keys], [0] * len(keys)
        )

    async def close(self) -> None:
        await _close(self.driver)


class PgqueuerSystem:
    def __init__(self, name: str) -> None:
        self.name = name
        self.sql_prefix = "pgqueuer"
        self.handlers = ("async",)
        self.kind = name.removeprefix("pgqueuer_")

    def version(self) -> str:
        driver = "asyncpg" if self.kind == "asyncpg" else "psycopg"
        return f"{dist_version('pgqueuer')} ({driver} {dist_version(driver)})"

    def config(self, params: Params) -> dict[str, Any]:
        return {
            "driver": f"{'AsyncpgDriver' if self.kind == 'asyncpg' else 'PsycopgDriver'}",
            "enqueue_single": "Queries.enqueue(entrypoint, payload) (autocommit)",
            "enqueue_bulk": "Queries.enqueue([...], [...], [...]) with 1,000 jobs",
            "worker": f"{params.processes} x PgQueuer.run() (defaults: batch_size=10, "
            "max_concurrent_tasks=None, dequeue_timeout=30 s)"
            if params.defaults
            else f"{params.processes} x PgQueuer.run(batch_size={BATCH_SIZE}, "
            f"max_concurrent_tasks={params.concurrency})",
            "handlers": "async def (entrypoint)",
        }

    async def install(self) -> None:
        from pgqueuer import Queries

        driver = await _driver(self.kind)
        try:
            await Queries(driver).install()
        finally:
            await _close(driver)

    async def producer(self) -> PgqueuerProducer:
        return await PgqueuerProducer(self.kind).open()

    def worker_commands(self, params: Params) -> list[list[str]]:
        return [worker_argv(self.name, params)] * params.processes

    async def run_worker(self, concurrency: int | None) -> None:
        from pgqueuer import Job, PgQueuer

        pgq = PgQueuer(await _driver(self.kind))

        @pgq.entrypoint(ENTRYPOINT)
        async def peer(job: Job) -> None:
            await ahandle(int(job.payload or b"0"))

        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, pgq.shutdown.set)
        if concurrency is None:
            await pgq.run()
        else:
            await pgq.run(batch_size=BATCH_SIZE, max_concurrent_tasks=concurrency)


def make(name: str) -> PgqueuerSystem:
    return PgqueuerSystem(name)
