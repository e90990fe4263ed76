"""``manage.py demo_traffic``: place orders steadily and print what the queue is doing."""

from __future__ import annotations

import time
from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from django.db import connection

from shop.services import place_order


class Command(BaseCommand):
    help = "Place demo orders (some flaky, one fraudulent) and print queue counts until Ctrl-C."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--interval", type=float, default=0.5, help="seconds between orders")
        parser.add_argument("--orders", type=int, default=0, help="stop after N (0: never)")

    def handle(self, *args: Any, **options: Any) -> None:
        placed = 0
        next_report = time.monotonic()
        try:
            while not options["orders"] or placed < options["orders"]:
                placed += 1
                note = "fraud" if placed == 5 else "flaky" if placed % 7 == 0 else ""
                order = place_order(f"customer{placed}@example.com", note)
                if note:
                    self.stdout.write(f"placed order {order.id} ({note})")
                if time.monotonic() >= next_report:
                    self.report(placed)
                    next_report += 5.0
                time.sleep(options["interval"])
        except KeyboardInterrupt:
            pass
        self.report(placed)

    def report(self, placed: int) -> None:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT queue, available, running, retryable, completed, failed, dlq "
                "FROM awa.queue_counts_v1() ORDER BY queue"
            )
            rows = cursor.fetchall()
        parts = [
            f"{q}: {a} ready, {r} running, {rt} retrying, {c} done, {f} failed, {d} in DLQ"
            for q, a, r, rt, c, f, d in rows
        ]
        self.stdout.write(f"[{placed} orders] " + " | ".join(parts))
