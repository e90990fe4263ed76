"""``manage.py awa_health``: a liveness or readiness probe (thin; the checks live in
awa_django.telemetry.health).

Exit status 0 when every check passes, 1 with one line on stderr saying why when one fails (the
database unreachable included), 2 for bad arguments (argparse).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from awa_django.exceptions import JobValidationError
from awa_django.management.commands._cli import text
from awa_django.telemetry.health import MAX_STALE_AFTER, check_health, parse_lag_thresholds


def _seconds(value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds) or seconds <= 0 or seconds > MAX_STALE_AFTER:
        raise argparse.ArgumentTypeError(
            f"{value[:40]!r} is not a number of seconds above 0 and at most {MAX_STALE_AFTER:g}"
        )
    return seconds


def _lag(value: str) -> str:
    try:
        parse_lag_thresholds([value])
    except JobValidationError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return value


class Command(BaseCommand):
    help = (
        "Exit 0 when this host's worker is heartbeating, a maintenance leader exists and no "
        "queue lags past --max-lag; otherwise print one line saying why and exit 1. For "
        "liveness and readiness probes."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--max-lag",
            action="append",
            type=_lag,
            default=[],
            metavar="[QUEUE=]SECONDS",
            help="fail when a queue's oldest waiting job is older than this (repeatable: "
            "SECONDS for every queue, QUEUE=SECONDS for one; paused queues are left out)",
        )
        parser.add_argument(
            "--host",
            type=text("--host"),
            help="check the workers registered from this host name (default: this host)",
        )
        parser.add_argument(
            "--stale-after",
            type=_seconds,
            help="a worker or leader not seen for this many seconds is dead (default: "
            "max(HEARTBEAT_STALENESS, 3 x RUNTIME_REFRESH_INTERVAL))",
        )
        parser.add_argument(
            "--no-worker",
            action="store_true",
            help="skip the worker check (a host that runs no worker)",
        )
        parser.add_argument(
            "--no-leader",
            action="store_true",
            help="skip the leader check (maintenance runs from cron: awa_maintenance --once)",
        )
        parser.add_argument("--json", action="store_true", help="print the report as JSON")

    def handle(self, *args: Any, **options: Any) -> None:
        report = check_health(
            worker=not options["no_worker"],
            host=options["host"],
            leader=not options["no_leader"],
            max_lag=parse_lag_thresholds(options["max_lag"]),
            stale_after=options["stale_after"],
        )
        if options["json"]:
            self.stdout.write(json.dumps(report.as_dict(), indent=2))
        elif report.ok and options["verbosity"] >= 1:
            self.stdout.write(report.summary())
        if not report.ok:
            if not options["json"]:
                self.stderr.write(report.summary())
            sys.exit(1)
