"""Procrastinate: ``defer_async`` / ``batch_defer_async`` on a ``PsycopgConnector``;
``App.run_worker_async`` (the public worker entry point) in each worker process. Sync runs use
a plain ``def`` task, which procrastinate runs through ``asgiref.sync_to_async`` (the event
loop's default thread pool); default-settings runs call ``run_worker_async()`` bare
(concurrency 1, 5 s poll fallback, LISTEN/NOTIFY on)."""

from __future__ import annotations

import functools
from typing import Any

import procrastinate

from benchmarks.peers.sql import ahandle, handle
from benchmarks.peers.systems.base import (
    Params,
    database_url,
    dist_version,
    handler_kind,
    worker_argv,
)

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

    @app.task(queue="peers", name="peer_sync")
    def peer_sync(key: int) -> None:
        handle(key)

    return app


def _task_name() -> str:
    return "peer_sync" if handler_kind() == "sync" else "peer"


class ProcrastinateProducer:
    async def open(self) -> ProcrastinateProducer:
        self.app = _app()
        await self.app.open_async()
        self.task = self.app.tasks[_task_name()]
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
    handlers = ("async", "sync")

    def version(self) -> str:
        return dist_version("procrastinate")

    def config(self, params: Params) -> dict[str, Any]:
        config: dict[str, Any] = {
            "enqueue_single": "Task.defer_async() (autocommit)",
            "enqueue_bulk": "Task.batch_defer_async(*1,000 kwargs)",
            "worker": f"{params.processes} x App.run_worker_async("
            f"concurrency={params.concurrency}, ...)",
            "worker_options": {k: v for k, v in WORKER_OPTIONS.items()},
            "handlers": "def (sync, via asgiref sync_to_async: the loop's default thread pool)"
            if params.handler == "sync"
            else "async def",
            "connector": "PsycopgConnector",
        }
        if params.defaults:
            config["worker"] = (
                f"{params.processes} x App.run_worker_async() (defaults: concurrency=1, every "
                "queue, listen_notify=True, fetch_job_polling_interval=5.0, delete_jobs=never)"
            )
            del config["worker_options"]
        return config

    async def install(self) -> None:
        app = _app()
        async with app.open_async():
            await app.schema_manager.apply_schema_async()

    async def producer(self) -> ProcrastinateProducer:
        return await ProcrastinateProducer().open()

    def worker_commands(self, params: Params) -> list[list[str]]:
        return [worker_argv(self.name, params)] * params.processes

    async def run_worker(self, concurrency: int | None) -> None:
        app = _app()
        async with app.open_async():
            if concurrency is None:
                await app.run_worker_async()
            else:
                await app.run_worker_async(concurrency=concurrency, **WORKER_OPTIONS)


def make(name: str) -> ProcrastinateSystem:
    return ProcrastinateSystem()
