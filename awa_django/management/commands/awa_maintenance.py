"""``manage.py awa_maintenance``: a maintenance-only process (thin: parse, call the service)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import uuid
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from awa_django.maintenance.leader import Maintenance, MaintenanceSettings
from awa_django.management.commands._cli import configure_logging
from awa_django.worker.guards import exit_when_database_replaced


class Command(BaseCommand):
    help = (
        "Compete for maintenance leadership and run promotion, rescue, ring rotation and prune "
        "and retention. --once runs one pass of every task and exits (for cron)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--once",
            action="store_true",
            help="Run one pass of every task (if leadership is free) and exit.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        configure_logging(options["verbosity"], self.stderr, self.style)
        exit_when_database_replaced()
        maintenance = Maintenance(MaintenanceSettings.from_settings(), uuid.uuid4(), register=True)
        if options["once"]:
            asyncio.run(maintenance.run_once())
            return
        asyncio.run(_serve(maintenance))


async def _serve(maintenance: Maintenance) -> None:
    loop = asyncio.get_running_loop()
    task = loop.create_task(maintenance.run())
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, task.cancel)
    with contextlib.suppress(asyncio.CancelledError):
        await task
    await maintenance.deregister()
