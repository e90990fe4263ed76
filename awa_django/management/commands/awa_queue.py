"""``manage.py awa_queue pause|resume|drain|stats QUEUE``: queue control (thin)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from awa_django import services
from awa_django.exceptions import ValidationError


class Command(BaseCommand):
    help = "Pause, resume or drain a queue, or show its statistics."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("action", choices=["pause", "resume", "drain", "stats"])
        parser.add_argument("queue")

    def handle(self, *args: Any, **options: Any) -> None:
        queue, action = options["queue"], options["action"]
        try:
            if action in ("pause", "resume"):
                services.queue_pause(queue, action == "pause")
                self.stdout.write(f"queue {queue} {'paused' if action == 'pause' else 'resumed'}")
            elif action == "drain":
                count = services.queue_drain(queue)
                self.stdout.write(f"queue {queue}: cancelled {count} waiting job(s)")
            else:
                stats = {s.queue: s for s in services.queue_stats()}.get(queue)
                if stats is None:
                    raise CommandError(f"unknown queue {queue!r}")
                for field in stats.__dataclass_fields__:
                    self.stdout.write(f"{field}: {getattr(stats, field)}")
        except ValidationError as exc:
            raise CommandError(str(exc)) from exc
