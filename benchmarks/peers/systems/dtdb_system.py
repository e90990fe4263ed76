"""django-tasks-db, the reference django.tasks database backend: ``Task.enqueue`` on Django's
connection, ``manage.py db_worker`` (one task at a time per process, by design). Its tasks
are sync only (every run is a sync run); default-settings runs start ``db_worker`` bare
(queue ``default``, 1 s poll interval, a random start-up delay)."""

from __future__ import annotations

import sys
from typing import Any

from benchmarks.peers.systems.base import Params, dist_version
from benchmarks.peers.systems.django_base import DjangoProducer, migrate


class DtdbProducer(DjangoProducer):
    def __init__(self) -> None:
        super().__init__()
        from benchmarks.peers.systems import dtdb_tasks

        self.task = dtdb_tasks.peer

    async def one(self, key: int) -> None:
        self.task.enqueue(key)  # autocommit: one committed transaction per task

    async def many(self, keys: list[int]) -> None:
        from django.db import transaction

        # django.tasks has no bulk API: a batch is N enqueue() calls in one transaction.
        with transaction.atomic():
            for key in keys:
                self.task.enqueue(key)


class DtdbSystem:
    name = "django_tasks_db"
    sql_prefix = "django_tasks_db"
    handlers = ("sync",)

    def version(self) -> str:
        return dist_version("django-tasks-db")

    def config(self, params: Params) -> dict[str, Any]:
        return {
            "enqueue_single": "Task.enqueue() in autocommit",
            "enqueue_bulk": "no bulk API: 1,000 Task.enqueue() calls per transaction.atomic()",
            "worker": f"{params.processes} x manage.py db_worker (defaults: --queue-name "
            "default, --interval 1, start-up delay on)"
            if params.defaults
            else f"{params.processes} x manage.py db_worker --queue-name default "
            "--interval 0.05 --no-startup-delay",
            "concurrency": "1 per process (db_worker runs one task at a time; no knob)",
            "handlers": "def (sync)",
            "django_tasks": dist_version("django-tasks"),
        }

    async def install(self) -> None:
        migrate()

    async def producer(self) -> DtdbProducer:
        return DtdbProducer()

    def worker_commands(self, params: Params) -> list[list[str]]:
        if params.defaults:
            return [[sys.executable, "-m", "django", "db_worker"]] * params.processes
        command = [
            sys.executable,
            "-m",
            "django",
            "db_worker",
            "--queue-name",
            "default",
            "--interval",
            "0.05",
            "--no-startup-delay",
        ]
        return [command] * params.processes


def make(name: str) -> DtdbSystem:
    return DtdbSystem()
