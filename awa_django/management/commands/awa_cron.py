"""``manage.py awa_cron list|trigger|pause|resume``: periodic schedules (thin)."""

from __future__ import annotations

import getpass
import json
from datetime import datetime
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from awa_django.management.commands._cli import database_errors, text
from awa_django.operator import ScheduleStatus, schedule_pause, schedule_trigger, schedules


def _when(value: datetime | None) -> str:
    return "-" if value is None else f"{value:%Y-%m-%d %H:%M:%S%z}"


class Command(BaseCommand):
    help = (
        "List the periodic schedules (next and last fire, last job's state), trigger one now, "
        "or pause or resume one. Schedules themselves are declared in code (docs/periodic.md)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("action", choices=["list", "trigger", "pause", "resume"])
        parser.add_argument(
            "name", nargs="?", type=text("a schedule name"), help="the schedule (not for list)"
        )
        parser.add_argument("--json", action="store_true", help="list as JSON")

    def handle(self, *args: Any, **options: Any) -> None:
        action, name = options["action"], options["name"]
        if action == "list" and name is not None:
            raise CommandError("list takes no schedule name")
        if action != "list" and name is None:
            raise CommandError(f"{action} needs a schedule name (see `awa_cron list`)")
        if options["json"] and action != "list":
            raise CommandError("--json only applies to list")
        loud = options["verbosity"] >= 1
        with database_errors():
            if action == "list":
                self._list(schedules(), options["json"])
            elif action == "trigger":
                job = schedule_trigger(name)
                if job is None:
                    raise CommandError(f"unknown schedule {name!r}")
                if loud:
                    self.stdout.write(self.style.SUCCESS(f"schedule {name}: enqueued job {job}"))
            else:
                paused = action == "pause"
                if not schedule_pause(name, paused, by=_operator() if paused else None):
                    raise CommandError(f"unknown schedule {name!r}")
                if loud:
                    done = "paused" if paused else "resumed"
                    self.stdout.write(self.style.SUCCESS(f"schedule {name} {done}"))

    def _list(self, rows: list[ScheduleStatus], as_json: bool) -> None:
        if as_json:
            self.stdout.write(
                json.dumps(
                    [
                        {
                            "name": s.name,
                            "kind": s.kind,
                            "cron": s.cron_expr,
                            "timezone": s.timezone,
                            "enabled": s.enabled,
                            "next_fire_at": s.next_fire_at and s.next_fire_at.isoformat(),
                            "last_fire_at": s.last_fire_at and s.last_fire_at.isoformat(),
                            "last_job_id": s.last_job_id,
                            "last_job_state": s.last_job_state and str(s.last_job_state),
                            "paused_by": s.paused_by,
                        }
                        for s in rows
                    ],
                    indent=2,
                )
            )
            return
        for s in rows:
            state = "enabled" if s.enabled else f"paused by {s.paused_by or '?'}"
            last = "-" if s.last_job_id is None else f"job {s.last_job_id} ({s.last_job_state})"
            self.stdout.write(
                f"{s.name}\t{s.cron_expr} {s.timezone}\t{state}\tnext {_when(s.next_fire_at)}\t"
                f"last {_when(s.last_fire_at)}\t{last}"
            )


def _operator() -> str:
    try:
        return f"awa_cron ({getpass.getuser()})"
    except Exception:  # no user name in this environment
        return "awa_cron"
