"""``manage.py awa_job show|retry|cancel ID`` and ``awa_job list``: inspect or act on jobs
(thin)."""

from __future__ import annotations

import dataclasses
import getpass
import json
import socket
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from awa_django.management.commands._cli import database_errors, integer, job_id, queue_name, text
from awa_django.operator import (
    JobSummary,
    cancel,
    dlq_retry,
    history_retry,
    job_list,
    job_show,
    workflow_of,
)
from awa_django.operator.rows import cursor
from awa_django.sql import query
from awa_django.states import JobState

#: Most jobs ``list`` shows.
MAX_LIST = 100_000


def _by() -> str:
    """Who runs this command, for ``awa:retried_by``: user@host."""
    try:
        user = getpass.getuser()
    except Exception:  # no user name (a container without an entry in /etc/passwd)
        user = "unknown"
    return f"{user}@{socket.gethostname()} (awa_job)"[:255]


def _callback_wait(job_id: int) -> dict[str, Any] | None:
    """The callback a waiting job waits for: its id (what the external system sends back),
    when the job parked, when the wait times out, and whether resolving resumes the handler."""
    with cursor(None) as c:
        c.execute(query("job_callback_wait"), [job_id])
        row = c.fetchone()
        if row is None:  # resolved or timed out meanwhile
            return None
        return {d.name: v for d, v in zip(c.description, row, strict=True)}


class Command(BaseCommand):
    help = (
        "Show one job, retry it (from the dead letter queue, or a failed or cancelled job from "
        "history), cancel it, or list jobs with filters."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("action", choices=["show", "retry", "cancel", "list"])
        parser.add_argument("job_id", nargs="?", type=job_id, help="the job (show, retry, cancel)")
        parser.add_argument(
            "--by",
            type=text("--by"),
            help="who asks (retry from history; default: user@host)",
        )
        parser.add_argument("--state", choices=JobState.values, help="list: only this state")
        parser.add_argument("--queue", type=queue_name, help="list: only this queue")
        parser.add_argument("--kind", type=text("--kind"), help="list: only this kind")
        parser.add_argument("--tag", type=text("--tag"), help="list: only jobs with this tag")
        parser.add_argument("--dlq", action="store_true", help="list: only dead-lettered jobs")
        parser.add_argument(
            "--limit",
            type=integer("the limit", 1, MAX_LIST),
            default=100,
            help=f"list: at most this many, newest first (default 100, at most {MAX_LIST})",
        )
        parser.add_argument("--json", action="store_true", help="list as JSON")

    def handle(self, *args: Any, **options: Any) -> None:
        action = options["action"]
        if action == "list":
            if options["job_id"] is not None:
                raise CommandError("list takes no job id (filter with --queue, --kind, ...)")
            with database_errors():
                self._list(options)
            return
        if options["job_id"] is None:
            raise CommandError(f"{action} needs a job id")
        for name in ("state", "queue", "kind", "tag"):
            if options[name] is not None:
                raise CommandError(f"--{name} is for list only")
        with database_errors():
            self._handle(options["job_id"], action, options)

    def _list(self, options: dict[str, Any]) -> None:
        jobs = job_list(
            state=options["state"],
            queue=options["queue"],
            kind=options["kind"],
            tag=options["tag"],
            in_dlq=True if options["dlq"] else None,
            limit=options["limit"],
        )
        if options["json"]:
            rows = [dataclasses.asdict(j) for j in jobs]
            self.stdout.write(json.dumps(rows, indent=2, default=str))
            return
        for j in jobs:
            self.stdout.write(_line(j))
        if len(jobs) == options["limit"]:
            self.stderr.write(f"(stopped at --limit {options['limit']}; there may be more)")

    def _handle(self, job_id: int, action: str, options: dict[str, Any]) -> None:
        verbosity = options["verbosity"]
        job = job_show(job_id)
        if job is None:
            raise CommandError(f"job {job_id} not found (unknown, or aged out of history)")
        if action == "show":
            shown = dataclasses.asdict(job)
            if job.state == JobState.WAITING_EXTERNAL:
                shown["callback"] = _callback_wait(job_id)
            step = workflow_of(job_id)
            if step is not None:  # a step of a workflow or batch (docs/workflows.md)
                shown["workflow"] = dataclasses.asdict(step)
            self.stdout.write(json.dumps(shown, indent=2, default=str))
        elif action == "retry":
            if job.in_dlq:
                dlq_retry([job_id])
                if verbosity >= 1:
                    self.stdout.write(self.style.SUCCESS(f"job {job_id} retried"))
                return
            if job.state not in (JobState.FAILED, JobState.CANCELLED):
                raise CommandError(
                    f"job {job_id} is {job.state}: not in the dead letter queue, nor failed or "
                    "cancelled in history; nothing to retry"
                )
            [done] = history_retry([job_id], by=options["by"] or _by())
            if done.outcome == "retried":
                if verbosity >= 1:
                    self.stdout.write(
                        self.style.SUCCESS(f"job {job_id} retried as job {done.retry_job_id}")
                    )
            elif done.outcome == "already_retried":
                raise CommandError(
                    f"job {job_id} was already retried from history, as job {done.retry_job_id}"
                )
            elif done.outcome == "refused":
                raise CommandError(
                    f"job {job_id} is unique and job {done.retry_job_id} holds its key: not retried"
                )
            else:
                raise CommandError(f"job {job_id} could not be retried ({done.outcome})")
        else:
            previous = cancel(job_id, reason="cancelled with awa_job")
            if previous is None:
                raise CommandError(f"job {job_id} is {job.state}: nothing to cancel")
            if verbosity >= 1:
                self.stdout.write(self.style.SUCCESS(f"job {job_id} cancelled (was {previous})"))


def _line(job: JobSummary) -> str:
    state = f"{job.state} (DLQ)" if job.in_dlq else str(job.state)
    tags = f" tags {','.join(job.tags)}" if job.tags else ""
    when = job.finalized_at or job.run_at
    return (
        f"{job.id} {job.kind} queue {job.queue} {state} attempt {job.attempt}/"
        f"{job.max_attempts} priority {job.priority}{tags} {when.isoformat() if when else '-'}"
    )
