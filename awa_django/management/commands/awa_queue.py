"""``manage.py awa_queue pause|resume|drain|stats|limit QUEUE``, ``awa_queue limit --kind KIND``
and ``awa_queue limits``: queue control and fleet-wide flow limits of queues and job kinds
(thin)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from awa_django.conf import awa_settings
from awa_django.exceptions import InvalidOptionError
from awa_django.jobs import registered_kinds
from awa_django.limits import (
    FLOW_BURST_RANGE,
    FLOW_CONCURRENCY_RANGE,
    FLOW_RATE_MAX,
    FLOW_RATE_MIN,
    check_kind_name,
)
from awa_django.management.commands._cli import (
    database_errors,
    integer,
    number,
    operator_name,
    queue_name,
)
from awa_django.operator import (
    KindLimits,
    QueueLimits,
    clear_kind_limits,
    clear_queue_limits,
    kind_limits,
    queue_drain,
    queue_limits,
    queue_pause,
    queue_stats,
    set_kind_limits,
    set_queue_limits,
)
from awa_django.telemetry.logs import one_line

_LIMIT_OPTIONS = ("global_concurrency", "rate", "burst", "clear", "kind")


class Command(BaseCommand):
    help = (
        "Pause, resume or drain a queue, or show its statistics; set or clear a queue's or "
        "(with --kind) a job kind's fleet-wide flow limits (limit), or list them all (limits). "
        "docs/flow.md."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "action", choices=["pause", "resume", "drain", "stats", "limit", "limits"]
        )
        parser.add_argument("queue", nargs="?", type=queue_name, help="the queue (not for limits)")
        parser.add_argument(
            "--global-concurrency",
            type=integer("the global concurrency", *FLOW_CONCURRENCY_RANGE),
            help="limit: the most attempts running at once across every worker (by weight)",
        )
        parser.add_argument(
            "--rate",
            type=number("the rate limit", FLOW_RATE_MAX, FLOW_RATE_MIN),
            help="limit: the most jobs started per second across every worker",
        )
        parser.add_argument(
            "--burst",
            type=integer("the burst", *FLOW_BURST_RANGE),
            help="limit: jobs the rate lets through at once (with --rate)",
        )
        parser.add_argument(
            "--clear",
            action="store_true",
            help="limit: drop the operator's limits; the queue's AWA['QUEUES'] settings apply "
            "(for a kind: its @job options and AWA['KINDS'])",
        )
        parser.add_argument(
            "--kind",
            help="limit: the job kind to limit across every queue, instead of a queue",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        queue, action = options["queue"], options["action"]
        given = [f"--{o.replace('_', '-')}" for o in _LIMIT_OPTIONS if options[o]]
        if action != "limit" and given:
            raise CommandError(f"{', '.join(given)} only apply to limit")
        if action == "limits":
            if queue is not None:
                raise CommandError("limits takes no queue name (see `awa_queue limit QUEUE`)")
            with database_errors():
                self._list(queue_limits(), kind_limits())
            return
        if action == "limit" and options["kind"] is not None:
            if queue is not None:
                raise CommandError(
                    "limit --kind takes no queue name: a kind's limits hold in every queue"
                )
            with database_errors():
                self._limit_kind(
                    self._known_kind(options["kind"]), options, options["verbosity"] >= 1
                )
            return
        if queue is None:
            raise CommandError(f"{action} needs a queue name")
        loud = options["verbosity"] >= 1
        with database_errors():
            if action == "limit":
                self._limit(queue, options, loud)
            elif action in ("pause", "resume"):
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
                    self.stdout.write(f"{field}: {getattr(stats, field)}")

    def _limit(self, queue: str, options: dict[str, Any], loud: bool) -> None:
        concurrency, rate, burst = options["global_concurrency"], options["rate"], options["burst"]
        if options["clear"]:
            if concurrency is not None or rate is not None or burst is not None:
                raise CommandError("--clear takes no limits: it drops the operator's limits")
            now = clear_queue_limits(queue, actor=operator_name("awa_queue"))
        else:
            if burst is not None and rate is None:
                raise CommandError("--burst needs --rate")
            if concurrency is None and rate is None:
                raise CommandError(
                    "limit needs --global-concurrency, --rate (with --burst), or --clear"
                )
            now = set_queue_limits(
                queue,
                global_concurrency=concurrency,
                rate_limit=rate,
                rate_burst=burst,
                actor=operator_name("awa_queue"),
            )
        if loud:
            shown = "no flow limits" if now is None else now.summary()
            self.stdout.write(self.style.SUCCESS(f"queue {queue} flow limits: {shown}"))

    def _known_kind(self, kind: str) -> str:
        """``kind`` if it is a valid kind name that this project knows: registered by ``@job``,
        named in ``AWA["KINDS"]``, or already limited (its row in the database)."""
        try:
            check_kind_name(kind, "--kind")
        except InvalidOptionError as exc:
            raise CommandError(str(exc)) from None
        if kind in registered_kinds() or kind in awa_settings.KINDS:
            return kind
        with database_errors():
            if any(k.kind == kind for k in kind_limits()):
                return kind
        raise CommandError(
            f"unknown job kind {kind!r}: not registered by @job in this project, not named in "
            "AWA['KINDS'] and not limited yet (a kind enqueued only by name: add it to "
            "AWA['KINDS'])"
        )

    def _limit_kind(self, kind: str, options: dict[str, Any], loud: bool) -> None:
        concurrency, rate, burst = options["global_concurrency"], options["rate"], options["burst"]
        actor = operator_name("awa_queue")
        now: KindLimits | None
        if options["clear"]:
            if concurrency is not None or rate is not None or burst is not None:
                raise CommandError("--clear takes no limits: it drops the operator's limits")
            now = clear_kind_limits(kind, actor=actor)
        else:
            if burst is not None and rate is None:
                raise CommandError("--burst needs --rate")
            if concurrency is None and rate is None:
                raise CommandError(
                    "limit needs --global-concurrency, --rate (with --burst), or --clear"
                )
            now = set_kind_limits(
                kind,
                global_concurrency=concurrency,
                rate_limit=rate,
                rate_burst=burst,
                actor=actor,
            )
        if loud:
            shown = "no flow limits" if now is None else now.summary()
            self.stdout.write(self.style.SUCCESS(f"kind {one_line(kind)} flow limits: {shown}"))

    def _list(self, rows: list[QueueLimits], kinds: list[KindLimits]) -> None:
        if not rows:
            self.stdout.write("no queue has flow limits")
        # Names and actors written by raw SQL may hold anything: one_line escapes control
        # characters, so no value starts a line of its own or drives the terminal.
        for q in rows:
            self.stdout.write(
                f"{q.queue}\t{q.summary()}\tby {one_line(q.updated_by or '?')} at "
                f"{q.updated_at:%Y-%m-%d %H:%M:%S%z}"
            )
        # A queue name holds no ':', so "kind:" never starts a queue's line.
        for k in kinds:
            self.stdout.write(
                f"kind:{one_line(k.kind)}\t{k.summary()}\tby {one_line(k.updated_by or '?')} "
                f"at {k.updated_at:%Y-%m-%d %H:%M:%S%z}"
            )
