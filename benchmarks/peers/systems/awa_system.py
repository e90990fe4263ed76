"""awa_django: enqueue through ``Job.enqueue``/``enqueue_many`` on Django's connection;
``manage.py awa_worker`` (maintenance on, as deployed) serves the queue. Sync runs use the
``def`` kind (``peer_sync``); default-settings runs start the plain ``awa_worker``, once per
process (no ``--queue``, so ``AWA["CONCURRENCY"]`` and queue discovery apply)."""

from __future__ import annotations

import sys
from typing import Any

from benchmarks.peers.systems.base import Params, dist_version, handler_kind
from benchmarks.peers.systems.django_base import DjangoProducer, migrate


class AwaProducer(DjangoProducer):
    def __init__(self) -> None:
        super().__init__()
        from benchmarks.peers.systems import awa_jobs

        self.job = awa_jobs.peer_sync if handler_kind() == "sync" else awa_jobs.peer

    async def one(self, key: int) -> None:
        self.job.enqueue(key)  # autocommit: one committed transaction per job

    async def many(self, keys: list[int]) -> None:
        from django.db import transaction

        import awa_django

        with transaction.atomic():
            awa_django.enqueue_many([self.job.prepare(key) for key in keys])


class AwaSystem:
    name = "awa_django"
    sql_prefix = "awa_django"
    handlers = ("async", "sync")

    def version(self) -> str:
        return dist_version("awa-django")

    def config(self, params: Params) -> dict[str, Any]:
        from awa_django.conf import DEFAULTS

        worker = (
            f"{params.processes} x manage.py awa_worker (no options: AWA['CONCURRENCY'] = "
            f"{DEFAULTS['CONCURRENCY']} jobs at once per process, every queue discovered, "
            "maintenance leader on)"
            if params.defaults
            else f"manage.py awa_worker --processes {params.processes} "
            f"--queue peers={params.concurrency} (maintenance leader on)"
        )
        return {
            "enqueue_single": "Job.enqueue() in autocommit (one transaction per job)",
            "enqueue_bulk": "awa_django.enqueue_many() in transaction.atomic() (COPY path)",
            "worker": worker,
            "handlers": "def (sync, in the worker's handler thread pool)"
            if params.handler == "sync"
            else "async def",
            "settings": "AWA defaults",
        }

    async def install(self) -> None:
        migrate()

    async def producer(self) -> AwaProducer:
        return AwaProducer()

    def worker_commands(self, params: Params) -> list[list[str]]:
        if params.defaults:
            return [[sys.executable, "-m", "django", "awa_worker"]] * params.processes
        return [
            [
                sys.executable,
                "-m",
                "django",
                "awa_worker",
                "--processes",
                str(params.processes),
                "--queue",
                f"peers={params.concurrency}",
            ]
        ]


def make(name: str) -> AwaSystem:
    return AwaSystem()
