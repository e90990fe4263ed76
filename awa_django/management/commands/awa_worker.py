"""``manage.py awa_worker``: run workers (thin: parse options, call the runtime)."""

from __future__ import annotations

import asyncio
import logging
import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from awa_django.conf import get_awa_settings
from awa_django.jobs import autodiscover_jobs
from awa_django.worker.config import build_config, parse_queue_option
from awa_django.worker.runtime import WorkerRuntime
from awa_django.worker.supervisor import Supervisor, child_command


class Command(BaseCommand):
    help = "Run awa_django workers: claim jobs, run them, write their outcomes."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--queue",
            action="append",
            default=[],
            metavar="NAME[=CONCURRENCY]",
            help="Serve this queue (repeatable). Default: every queue a registered kind uses.",
        )
        parser.add_argument(
            "--concurrency",
            type=int,
            default=None,
            help="Jobs run at once per queue (default AWA['CONCURRENCY']).",
        )
        parser.add_argument(
            "--processes",
            type=int,
            default=None,
            help="Worker processes under one supervisor (default AWA['PROCESSES']).",
        )
        parser.add_argument(
            "--burst",
            action="store_true",
            help="Exit 0 once the queues have nothing available or running.",
        )
        parser.add_argument(
            "--no-maintenance",
            action="store_true",
            help="Do not take part in the maintenance leader election.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        cfg = get_awa_settings()
        autodiscover_jobs()
        try:
            queues = [parse_queue_option(value) for value in options["queue"]]
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        if options["concurrency"] is not None and options["concurrency"] < 1:
            raise CommandError("--concurrency must be at least 1")
        processes = options["processes"] if options["processes"] is not None else cfg.PROCESSES
        if processes < 1:
            raise CommandError("--processes must be at least 1")
        if processes > 1:
            code = Supervisor(child_command(sys.orig_argv), processes, burst=options["burst"]).run()
            if code:
                sys.exit(code)
            return
        config = build_config(
            queues=queues or None,
            concurrency=options["concurrency"],
            burst=options["burst"],
            maintenance=not options["no_maintenance"],
        )
        if not logging.getLogger("awa_django").handlers and not logging.getLogger().handlers:
            logging.basicConfig(
                level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
            )
        code = asyncio.run(WorkerRuntime(config).run())
        if code:
            sys.exit(code)
