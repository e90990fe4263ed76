"""``manage.py awa_status [--json]``: queues, flow limits (of queues and job kinds), workers,
the leader, the rings (thin), and the declared queues and kinds with their stale and drift
flags and the kinds of available jobs no live worker declares (docs/descriptors.md).

Queues, workers and rings are read from ``AWA["READ_DATABASE_ALIAS"]`` (a streaming replica; by
default ``AWA["DATABASE_ALIAS"]``), with the replica's lag; flow limits from the primary (the
permits in use are in its lock table)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from awa_django.conf import awa_settings
from awa_django.management.commands._cli import database_errors
from awa_django.operator import (
    descriptors,
    kind_limits,
    queue_limits,
    queue_stats,
    replica_status,
    rings,
    undeclared_kinds,
    workers,
)
from awa_django.telemetry.logs import one_line


class Command(BaseCommand):
    help = (
        "Show queues (counts, lag, last-hour throughput), flow limits (limit, in use, rate), "
        "workers, the leader and ring state."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--json", action="store_true", help="machine-readable output")

    def handle(self, *args: Any, **options: Any) -> None:
        read = awa_settings.read_alias
        elsewhere = read if read != awa_settings.DATABASE_ALIAS else None
        with database_errors(elsewhere):
            queues = queue_stats(using=read)
            processes = workers(using=read)
            ring_states = rings(using=read)
            declared = descriptors(using=read)
            orphans = undeclared_kinds(using=read)
            replica = None if elsewhere is None else replica_status(using=read)
        with database_errors():
            limits = queue_limits()  # the primary's lock table holds the permits in use
            kinds = kind_limits()
        read_from = {
            "alias": read,
            "replica": bool(replica and replica.in_recovery),
            "lag_seconds": replica.lag_seconds if replica else None,
            "replay_paused": bool(replica and replica.replay_paused),
        }
        if options["json"]:
            self.stdout.write(
                json.dumps(
                    {
                        "read_from": read_from,
                        "queues": [dataclasses.asdict(q) for q in queues],
                        "flow_limits": [
                            {**dataclasses.asdict(q), "burst_in_force": q.burst_in_force}
                            for q in limits
                        ],
                        "kind_limits": [
                            {**dataclasses.asdict(k), "burst_in_force": k.burst_in_force}
                            for k in kinds
                        ],
                        "workers": [dataclasses.asdict(w) for w in processes],
                        "leader": next((w.instance_id for w in processes if w.is_leader), None),
                        "rings": [dataclasses.asdict(r) for r in ring_states],
                        "descriptors": [dataclasses.asdict(d) for d in declared],
                        "undeclared_kinds": [dataclasses.asdict(k) for k in orphans],
                    },
                    indent=2,
                    default=str,
                )
            )
            return
        if replica is not None and replica.in_recovery:
            behind = replica.lag_seconds
            self.stdout.write(
                f"read from the replica {read!r}: "
                f"{'lag unknown' if behind is None else f'{behind:.1f}s behind the primary'}"
                f"{' (WAL replay paused)' if replica.replay_paused else ''}"
            )
        self.stdout.write(self.style.MIGRATE_HEADING("queues:"))
        for q in queues:
            lag = "-" if q.lag_seconds is None else f"{q.lag_seconds:.1f}s"
            self.stdout.write(
                f"  {q.queue}: {'paused' if q.paused else 'active'}, {q.available} available, "
                f"{q.running} running, {q.waiting_external} waiting, {q.scheduled} scheduled, "
                f"{q.retryable} retryable, {q.completed} completed, "
                f"{q.failed} failed, {q.cancelled} cancelled, "
                f"{q.dlq} in DLQ; lag {lag}; {q.completed_last_hour} completed in the last hour"
            )
        self.stdout.write(self.style.MIGRATE_HEADING("flow limits:"))
        if not limits and not kinds:
            self.stdout.write("  none")
        for f in limits:  # names and actors from raw SQL: one line each, whatever they hold
            self.stdout.write(f"  {f.queue}: {f.summary()} (by {one_line(f.updated_by or '?')})")
        for k in kinds:
            self.stdout.write(
                f"  kind {one_line(k.kind)}: {k.summary()} (by {one_line(k.updated_by or '?')})"
            )
        self.stdout.write(self.style.MIGRATE_HEADING("workers:"))
        for w in processes:
            self.stdout.write(
                f"  {w.instance_id} {w.hostname} pid {w.pid}{' LEADER' if w.is_leader else ''} "
                f"queues {w.queues} seen {w.seen_seconds_ago:.0f}s ago"
            )
        self.stdout.write(self.style.MIGRATE_HEADING("rings:"))
        for r in ring_states:
            self.stdout.write(
                f"  {r.ring}: slot {r.current_slot} of {r.slot_count}, generation {r.generation}"
            )
        self.stdout.write(self.style.MIGRATE_HEADING("declared queues and kinds:"))
        if not declared:
            self.stdout.write("  none reported")
        for d in declared:  # texts from code or raw SQL: one line each, whatever they hold
            flags = ("STALE, " if d.stale else "") + ("DRIFT, " if d.drift else "")
            about = one_line(d.label or d.description or "")[:100]
            owner = f" owner {one_line(d.owner)}" if d.owner else ""
            self.stdout.write(
                f"  {d.what} {one_line(d.name)}: {flags}{d.live_workers} live worker(s)"
                f"{owner}{f': {about}' if about else ''}"
            )
        for orphan in orphans[:50]:
            self.stdout.write(
                self.style.WARNING(
                    f"  no worker serves {one_line(orphan.kind)}; {orphan.available:,} available"
                )
            )
        if len(orphans) > 50:
            self.stdout.write(
                self.style.WARNING(f"  ... and {len(orphans) - 50:,} more kinds (see --json)")
            )
