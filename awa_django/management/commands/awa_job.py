"""``manage.py awa_job show|retry|cancel ID``: inspect or act on one job (thin)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from awa_django.management.commands._cli import database_errors, job_id
from awa_django.operator import cancel, dlq_retry, job_show


class Command(BaseCommand):
    help = "Show one job, retry it from the dead letter queue, or cancel it."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("action", choices=["show", "retry", "cancel"])
        parser.add_argument("job_id", type=job_id)

    def handle(self, *args: Any, **options: Any) -> None:
        with database_errors():
            self._handle(options["job_id"], options["action"], options["verbosity"])

    def _handle(self, job_id: int, action: str, verbosity: int) -> None:
        job = job_show(job_id)
        if job is None:
            raise CommandError(f"job {job_id} not found (unknown, or aged out of history)")
        if action == "show":
            self.stdout.write(json.dumps(dataclasses.asdict(job), indent=2, default=str))
        elif action == "retry":
            if not job.in_dlq:
                raise CommandError(
                    f"job {job_id} is {job.state}, not in the dead letter queue; only "
                    "dead-lettered jobs can be retried"
                )
            dlq_retry([job_id])
            if verbosity >= 1:
                self.stdout.write(self.style.SUCCESS(f"job {job_id} retried"))
        else:
            previous = cancel(job_id, reason="cancelled with awa_job")
            if previous is None:
                raise CommandError(f"job {job_id} is {job.state}: nothing to cancel")
            if verbosity >= 1:
                self.stdout.write(self.style.SUCCESS(f"job {job_id} cancelled (was {previous})"))
