"""``manage.py awa_job show|retry|cancel ID``: inspect or act on one job (thin)."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from awa_django import operations, services
from awa_django.limits import MAX_BIGINT


class Command(BaseCommand):
    help = "Show one job, retry it from the dead letter queue, or cancel it."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("action", choices=["show", "retry", "cancel"])
        parser.add_argument("job_id", type=int)

    def handle(self, *args: Any, **options: Any) -> None:
        job_id, action = options["job_id"], options["action"]
        if not 1 <= job_id <= MAX_BIGINT:
            raise CommandError(f"job {job_id} not found (job ids are from 1 to {MAX_BIGINT})")
        job = services.job_show(job_id)
        if job is None:
            raise CommandError(f"job {job_id} not found (unknown, or aged out of history)")
        if action == "show":
            self.stdout.write(json.dumps(job, indent=2, default=str))
        elif action == "retry":
            if not job["in_dlq"]:
                raise CommandError(
                    f"job {job_id} is {job['state']}, not in the dead letter queue; only "
                    "dead-lettered jobs can be retried"
                )
            operations.dlq_retry([job_id])
            self.stdout.write(f"job {job_id} retried")
        else:
            previous = operations.cancel(job_id, reason="cancelled with awa_job")
            if previous is None:
                raise CommandError(f"job {job_id} is {job['state']}: nothing to cancel")
            self.stdout.write(f"job {job_id} cancelled (was {previous})")
