"""``manage.py awa_dlq list|retry|purge``: the dead letter queue (thin)."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from awa_django import operations, services
from awa_django.exceptions import ValidationError


class Command(BaseCommand):
    help = (
        "List, retry or purge dead-lettered jobs. retry and purge act on the given ids, or on "
        "everything matching --queue/--kind; with no filter at all they need --all."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("action", choices=["list", "retry", "purge"])
        parser.add_argument("ids", nargs="*", type=int, help="job ids (retry, purge)")
        parser.add_argument("--queue", help="only jobs of this queue")
        parser.add_argument("--kind", help="only jobs of this kind")
        parser.add_argument("--limit", type=int, default=100, help="at most this many (list)")
        parser.add_argument("--all", action="store_true", help="act on the whole DLQ")
        parser.add_argument("--to-queue", help="retry into another queue")
        parser.add_argument("--priority", type=int, help="retry with another priority")
        parser.add_argument("--json", action="store_true", help="list as JSON")

    def handle(self, *args: Any, **options: Any) -> None:
        action = options["action"]
        if not 1 <= options["limit"] <= 100_000:
            raise CommandError("--limit must be between 1 and 100000")
        if action == "list":
            try:
                entries = services.dlq_list(
                    queue=options["queue"], kind=options["kind"], limit=options["limit"]
                )
            except ValidationError as exc:
                raise CommandError(str(exc)) from exc
            if options["json"]:
                rows = [
                    {
                        "id": e.job_id,
                        "queue": e.queue,
                        "kind": e.kind,
                        "attempt": e.attempt,
                        "reason": e.reason,
                        "dlq_at": e.dlq_at.isoformat(),
                    }
                    for e in entries
                ]
                self.stdout.write(json.dumps(rows, indent=2))
            else:
                for e in entries:
                    self.stdout.write(
                        f"{e.job_id}\t{e.queue}\t{e.kind}\tattempt {e.attempt}\t"
                        f"{e.dlq_at:%Y-%m-%d %H:%M:%S}\t{e.reason}"
                    )
                self.stdout.write(f"{len(entries)} job(s)")
            return
        ids = list(options["ids"])
        filtered = options["queue"] is not None or options["kind"] is not None
        if ids and filtered:
            raise CommandError("give job ids or --queue/--kind filters, not both")
        if not ids:
            if not filtered and not options["all"]:
                raise CommandError(
                    f"{action} of the whole DLQ needs --all (or ids, --queue, --kind)"
                )
            ids = [
                e.job_id
                for e in services.dlq_list(
                    queue=options["queue"], kind=options["kind"], limit=10_000
                )
            ]
        try:
            if action == "retry":
                done = operations.dlq_retry(
                    ids, queue=options["to_queue"], priority=options["priority"]
                )
            else:
                done = operations.dlq_purge(ids)
        except ValidationError as exc:
            raise CommandError(str(exc)) from exc
        verb = "retried" if action == "retry" else "purged"
        self.stdout.write(f"{verb} {len(done)} job(s)")
        missing = sorted(set(ids) - set(done))
        if missing:
            self.stderr.write(f"not in the DLQ: {', '.join(map(str, missing[:20]))}")
