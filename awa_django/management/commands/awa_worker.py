"""``manage.py awa_worker``: run workers (thin: parse options, call the runtime)."""

from __future__ import annotations

import asyncio
import logging
import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from awa_django.conf import get_awa_settings
from awa_django.jobs import autodiscover_jobs
from awa_django.worker.config import MAX_PROCESSES, MAX_SLOTS, build_config, parse_queue_option
from awa_django.worker.guards import EXIT_LOOP_FAILED, hard_exit
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
        if options["concurrency"] is not None and not 1 <= options["concurrency"] <= MAX_SLOTS:
            raise CommandError(f"--concurrency must be between 1 and {MAX_SLOTS}")
        processes = options["processes"] if options["processes"] is not None else cfg.PROCESSES
        if not 1 <= processes <= MAX_PROCESSES:
            raise CommandError(f"--processes must be between 1 and {MAX_PROCESSES}")
        if processes > 1:
            code = Supervisor(
                child_command(sys.orig_argv),
                processes,
                burst=options["burst"],
                stop_timeout=2 * cfg.SHUTDOWN_TIMEOUT + 15.0,
            ).run()
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
        try:
            code = asyncio.run(WorkerRuntime(config).run())
        except BaseException as exc:
            # Handler code can end the shared event loop (loop.stop(), SystemExit raised from a
            # loop callback, cancelling the worker's own tasks): never a silent exit.
            logging.getLogger("awa_django.worker").critical(
                "awa worker: the event loop ended abnormally (%s: %s); exiting with status %d so "
                "that the process is restarted; its attempts will be rescued",
                type(exc).__name__,
                exc,
                EXIT_LOOP_FAILED,
                exc_info=exc,
            )
            hard_exit(EXIT_LOOP_FAILED)
        if code:
            sys.exit(code)
