"""Procrastinate: ``defer_async`` / ``batch_defer_async`` on a ``PsycopgConnector``;
``App.run_worker_async`` (the public worker entry point) in each worker process."""

from __future__ import annotations

import functools
from typing import Any

import procrastinate

from benchmarks.peers.sql import ahandle
from benchmarks.peers.systems.base import Params, database_url, dist_version, worker_argv

# The throughput settings the harness adapters use: LISTEN/NOTIFY plus a 50 ms poll fallback,
# jobs kept after completion (the default), every other option at its default.
WORKER_OPTIONS: dict[str, Any] = {
    "queues": ["peers"],
    "listen_notify": True,
    "fetch_job_polling_interval": 0.05,
    "delete_jobs": "never",
    "install_signal_handlers": True,
}


@functools.cache
def _app() -> procrastinate.App:
    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=database_url()))

    @app.task(queue="peers", name="peer")
    async def peer(key: int) -> None:
        await ahandle(key)

    return app


class ProcrastinateProducer:
    async def open(self) -> ProcrastinateProducer:
        self.app = _app()
        await self.app.open_async()
        self.task = self.app.tasks["peer"]
        return self

    async def one(self, key: int) -> None:
        await self.task.defer_async(key=key)

    async def many(self, keys: list[int]) -> None:
        await self.task.batch_defer_async(*({"key": key} for key in keys))

    async def close(self) -> None:
        await self.app.close_async()


class ProcrastinateSystem:
    name = "procrastinate"
    sql_prefix = "procrastinate"

    def version(self) -> str:
        return dist_version("procrastinate")

    def config(self, params: Params) -> dict[str, Any]:
        return {
            "enqueue_single": "Task.defer_async() (autocommit)",
            "enqueue_bulk": "Task.batch_defer_async(*1,000 kwargs)",
            "worker": f"{params.processes} x App.run_worker_async("
            f"concurrency={params.concurrency}, ...)",
            "worker_options": {k: v for k, v in WORKER_OPTIONS.items()},
            "handlers": "async def",
            "connector": "PsycopgConnector",
        }

    async def install(self) -> None:
        app = _app()
        async with app.open_async():
            await app.schema_manager.apply_schema_async()

    async def producer(self) -> ProcrastinateProducer:
        return await ProcrastinateProducer().open()

    def worker_commands(self, params: Params) -> list[list[str]]:
        return [worker_argv(self.name, params.concurrency)] * params.processes

    async def run_worker(self, concurrency: int) -> None:
        app = _app()
        async with app.open_async():
            await app.run_worker_async(concurrency=concurrency, **WORKER_OPTIONS)


def make(name: str) -> ProcrastinateSystem:
    return ProcrastinateSystem()
