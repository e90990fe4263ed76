"""``manage.py awa_queue pause|resume|drain|stats QUEUE``: queue control (thin)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from awa_django.management.commands._cli import database_errors, queue_name
from awa_django.operator import queue_drain, queue_pause, queue_stats


class Command(BaseCommand):
    help = "Pause, resume or drain a queue, or show its statistics."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("action", choices=["pause", "resume", "drain", "stats"])
        parser.add_argument("queue", type=queue_name)

    def handle(self, *args: Any, **options: Any) -> None:
        queue, action = options["queue"], options["action"]
        loud = options["verbosity"] >= 1
        with database_errors():
            if action in ("pause", "resume"):
                queue_pause(queue, action == "pause")
                if loud:
                    done = "paused" if action == "pause" else "resumed"
                    self.stdout.write(self.style.SUCCESS(f"queue {queue} {done}"))
            elif action == "drain":
                count = queue_drain(queue)
                if loud:
                    self.stdout.write(
                        self.style.SUCCESS(f"queue {queue}: cancelled {count} waiting job(s)")
                    )
            else:
                stats = {s.queue: s for s in queue_stats()}.get(queue)
                if stats is None:
                    raise CommandError(f"unknown queue {queue!r} (nothing was ever enqueued to it)")
                for field in stats.__dataclass_fields__:
                    shown = (
                        stats.shown(field) if field in stats.estimated else getattr(stats, field)
                    )
                    self.stdout.write(f"{field}: {shown}")
