"""Chancy: ``Chancy.push`` / ``push_many``; a ``Worker`` per process serving one queue with
the ``AsyncExecutor`` (LISTEN/NOTIFY wake-ups, 1 s poll fallback, eager polling). Sync runs
use a plain ``def`` job on the ``ThreadedExecutor`` (a thread pool of ``concurrency``
threads), the same poll settings; default-settings runs declare ``Queue("peers")`` bare: the
``ProcessExecutor`` with one process per CPU, a 5 s poll interval, no eager polling."""

from __future__ import annotations

import asyncio
import signal
from typing import Any

from benchmarks.peers.sql import ahandle, handle
from benchmarks.peers.systems.base import (
    Params,
    database_url,
    dist_version,
    handler_kind,
    worker_argv,
)

QUEUE = "peers"


async def peer(*, key: int) -> None:
    """The job body (module level, so Chancy can import it by path)."""
    await ahandle(key)


def peer_sync(*, key: int) -> None:
    """The same body, sync."""
    handle(key)


class ChancyProducer:
    async def open(self) -> ChancyProducer:
        from chancy import Chancy, Job

        self.chancy = Chancy(database_url())
        await self.chancy.__aenter__()
        self.job = Job.from_func(peer_sync if handler_kind() == "sync" else peer, queue=QUEUE)
        return self

    async def one(self, key: int) -> None:
        await self.chancy.push(self.job.with_kwargs(key=key))

    async def many(self, keys: list[int]) -> None:
        async for _ in self.chancy.push_many(
            [self.job.with_kwargs(key=key) for key in keys], batch_size=len(keys)
        ):
            pass

    async def close(self) -> None:
        await self.chancy.__aexit__(None, None, None)


class ChancySystem:
    name = "chancy"
    sql_prefix = "chancy"
    handlers = ("async", "sync")

    def version(self) -> str:
        return dist_version("chancy")

    @staticmethod
    def executor(handler: str) -> str:
        return "Threaded" if handler == "sync" else "Async"

    def queue(self, concurrency: int | None) -> Any:
        from chancy import Queue

        if concurrency is None:
            return Queue(QUEUE)  # every setting at its default
        kind = self.executor(handler_kind())
        return Queue(
            QUEUE,
            concurrency=concurrency,
            executor=f"chancy.executors.{'thread' if kind == 'Threaded' else 'asyncex'}."
            f"{kind}Executor",
            polling_interval=1,
            eager_polling=True,
        )

    def config(self, params: Params) -> dict[str, Any]:
        worker = (
            f"{params.processes} x Worker(chancy) serving Queue({QUEUE!r}) (defaults: "
            "ProcessExecutor, concurrency = CPU count, polling_interval=5, eager_polling=False)"
            if params.defaults
            else f"{params.processes} x Worker(chancy) serving Queue({QUEUE!r}, "
            f"concurrency={params.concurrency}, executor={self.executor(params.handler)}"
            "Executor, polling_interval=1, eager_polling=True)"
        )
        return {
            "enqueue_single": "Chancy.push(job) (own transaction)",
            "enqueue_bulk": "Chancy.push_many(1,000 jobs, batch_size=1000)",
            "worker": worker,
            "handlers": "def (sync)" if params.handler == "sync" else "async def",
            "plugins": "defaults",
        }

    async def install(self) -> None:
        from chancy import Chancy

        async with Chancy(database_url()) as chancy:
            await chancy.migrate()

    async def producer(self) -> ChancyProducer:
        return await ChancyProducer().open()

    def worker_commands(self, params: Params) -> list[list[str]]:
        return [worker_argv(self.name, params)] * params.processes

    async def run_worker(self, concurrency: int | None) -> None:
        from chancy import Chancy, Worker

        async with Chancy(database_url()) as chancy:
            await chancy.declare(self.queue(concurrency), upsert=True)
            async with Worker(chancy, register_signal_handlers=False) as worker:
                stop = asyncio.Event()
                loop = asyncio.get_running_loop()
                for signum in (signal.SIGTERM, signal.SIGINT):
                    loop.add_signal_handler(signum, stop.set)
                await stop.wait()
                await worker.stop(timeout=5)


def make(name: str) -> ChancySystem:
    return ChancySystem()
