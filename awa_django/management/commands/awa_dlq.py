"""``manage.py awa_dlq list|retry|purge``: the dead letter queue (thin)."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from awa_django.management.commands._cli import database_errors, integer, job_id, queue_name, text
from awa_django.operator import DlqEntry, dlq_list, dlq_purge, dlq_retry

#: Jobs one retry or purge transaction moves at most (a filter is worked through in batches).
BATCH = 1000
#: Most jobs ``list`` shows.
MAX_LIST = 100_000


class Command(BaseCommand):
    help = (
        "List, retry or purge dead-lettered jobs. retry and purge act on the given ids, or on "
        "everything matching --queue/--kind (in batches of 1,000, each its own transaction); "
        "with no filter at all they need --all."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("action", choices=["list", "retry", "purge"])
        parser.add_argument("ids", nargs="*", type=job_id, help="job ids (retry, purge)")
        parser.add_argument("--queue", type=queue_name, help="only jobs of this queue")
        parser.add_argument("--kind", type=text("--kind"), help="only jobs of this kind")
        parser.add_argument(
            "--limit",
            type=integer("the limit", 1, MAX_LIST),
            default=None,
            help=f"at most this many (list; default 100, at most {MAX_LIST})",
        )
        parser.add_argument("--all", action="store_true", help="act on the whole DLQ")
        parser.add_argument("--to-queue", type=queue_name, help="retry into another queue")
        parser.add_argument(
            "--priority",
            type=integer("the priority", -100, 100),
            help="retry with another priority (-100 to 100)",
        )
        parser.add_argument(
            "--unique-conflict",
            choices=["refuse", "run"],
            default=None,
            help="a unique job whose key another job holds: stay in the DLQ (refuse, the "
            "default) or retry without the key (run)",
        )
        parser.add_argument("--json", action="store_true", help="list as JSON")

    def handle(self, *args: Any, **options: Any) -> None:
        action = options["action"]
        self._refuse_options_of_other_actions(action, options)
        with database_errors():
            if action == "list":
                self._list(options)
            else:
                self._act(action, options)

    def _refuse_options_of_other_actions(self, action: str, options: dict[str, Any]) -> None:
        def given(name: str) -> bool:
            value = options.get(name)
            return value is not None and value is not False and value != []

        only = {
            "ids": ("retry", "purge"),
            "all": ("retry", "purge"),
            "limit": ("list",),
            "json": ("list",),
            "to_queue": ("retry",),
            "priority": ("retry",),
            "unique_conflict": ("retry",),
        }
        for name, actions in only.items():
            if given(name) and action not in actions:
                what = "job ids" if name == "ids" else "--" + name.replace("_", "-")
                raise CommandError(f"{what} only apply to {' and '.join(actions)}, not {action}")
        filtered = options["queue"] is not None or options["kind"] is not None
        if action == "list":
            return
        if options["ids"] and (filtered or options["all"]):
            raise CommandError("give job ids, or --queue/--kind filters, or --all; not several")
        if not options["ids"] and not filtered and not options["all"]:
            raise CommandError(f"{action} of the whole DLQ needs --all (or ids, --queue, --kind)")

    def _list(self, options: dict[str, Any]) -> None:
        limit = options["limit"] or 100
        entries = dlq_list(queue=options["queue"], kind=options["kind"], limit=limit)
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
            return
        for e in entries:
            self.stdout.write(
                f"{e.job_id}\t{e.queue}\t{e.kind}\tattempt {e.attempt}\t"
                f"{e.dlq_at:%Y-%m-%d %H:%M:%S}\t{e.reason}"
            )
        if options["verbosity"] >= 1:
            more = " (the limit; there may be more)" if len(entries) == limit else ""
            self.stdout.write(f"{len(entries)} job(s){more}")

    def _act(self, action: str, options: dict[str, Any]) -> None:
        verb = "retried" if action == "retry" else "purged"
        ids: list[int] = list(dict.fromkeys(options["ids"]))
        if ids:
            done = self._apply(action, ids, options)
            self._say(options, self.style.SUCCESS(f"{verb} {len(done)} job(s)"))
            missing = sorted(set(ids) - set(done))
            if missing:
                shown = ", ".join(map(str, missing[:20])) + (", ..." if len(missing) > 20 else "")
                why = (
                    "not in the DLQ, or a unique job whose key another job holds "
                    "(--unique-conflict run retries those anyway)"
                    if action == "retry"
                    else "not in the DLQ"
                )
                self.stderr.write(f"{len(missing)} {why}: {shown}", style_func=self.style.WARNING)
            return
        total, left = self._act_on_filter(action, options)
        self._say(options, self.style.SUCCESS(f"{verb} {total} job(s)"))
        if left:
            self.stderr.write(
                f"{'some' if left == BATCH else left} matching job(s) are still in the DLQ: they "
                f"were dead-lettered while this command ran; run it again to {action} them too",
                style_func=self.style.WARNING,
            )

    def _act_on_filter(self, action: str, options: dict[str, Any]) -> tuple[int, int]:
        """Retry or purge every entry matching the filter (or the whole DLQ with ``--all``)
        that was in the DLQ when the command began, ``BATCH`` per transaction. Entries
        dead-lettered meanwhile are left alone; returns (done, how many such were seen, at most
        ``BATCH``)."""
        verb = "retried" if action == "retry" else "purged"
        total = 0
        newest: DlqEntry | None = None

        def batch() -> tuple[list[int], int]:
            nonlocal newest
            entries = dlq_list(queue=options["queue"], kind=options["kind"], limit=BATCH)
            if newest is None and entries:
                newest = entries[0]  # newest first: the last entry there when we began
            bound = newest
            old = [
                e.job_id
                for e in entries
                if bound is not None and (e.dlq_at, e.job_id) <= (bound.dlq_at, bound.job_id)
            ]
            return old, len(entries) - len(old)

        while True:
            ids, newer = batch()
            if not ids:
                return total, newer
            done = self._apply(action, ids, options)
            total += len(done)
            if options["verbosity"] >= 2:
                self.stdout.write(f"{verb} {len(done)} job(s) ({total} so far)")
            if not done:  # nothing moved: another process took them; do not spin
                return total, newer

    def _apply(self, action: str, ids: list[int], options: dict[str, Any]) -> list[int]:
        if action == "retry":
            return dlq_retry(
                ids,
                queue=options["to_queue"],
                priority=options["priority"],
                on_unique_conflict=options["unique_conflict"] or "refuse",
            )
        return dlq_purge(ids)

    def _say(self, options: dict[str, Any], message: str) -> None:
        if options["verbosity"] >= 1:
            self.stdout.write(message)
