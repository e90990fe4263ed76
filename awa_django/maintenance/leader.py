"""Leader election and the maintenance loop.

Every worker (unless ``--no-maintenance``) and every ``awa_maintenance`` process competes for a
session-level advisory lock on a dedicated connection. The holder is the leader: it promotes due
deferred jobs, rescues abandoned attempts, rotates and prunes the rings, expires old DLQ
rows, runtime rows, orphaned attempt state and old callback receipts, and deletes the keys of
unique jobs that no longer block duplicates. If the leader dies or loses its connection,
Postgres frees the lock and another process takes over from durable state on its next election
attempt. Each task is one short, bounded statement; a failing task is logged and retried on its
next interval, never in a hot loop. Only a lost connection costs leadership: a deadlock, a lock
or statement timeout, or any other error of a task (a bug included) is logged and the leader
carries on, so transient trouble never causes leader churn.

A leader whose process stops running while its connection lives on (SIGSTOP, a blocked event
loop, a network partition that keeps TCP open) stops refreshing its runtime row: once that row is
older than ``max(HEARTBEAT_STALENESS, 3 * RUNTIME_REFRESH_INTERVAL)``, the next election attempt
of another process terminates the stale leader's backend (``awa.leader_takeover_v1``), which
frees the lock, and takes over. Maintenance statements run with a 5 s lock timeout and a 60 s
statement timeout, so a lock held elsewhere fails one task, never freezes the leader.

Periodic jobs (awa_django.maintenance.cron): every process syncs the schedules declared in its
code when it starts; the leader fires due ones every ``CRON_EVAL_INTERVAL``, exactly once per
fire time.

Ring rotation is decided on the database clock (``awa.rotate_v3``): each ring rotates once its
current slot is its interval old, whoever the leader is, so a new leader or ``awa_maintenance
--once`` from cron keeps the cadence instead of rotating every ring at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import socket
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg

from awa_django._version import __version__
from awa_django.conf import AwaSettings, get_awa_settings
from awa_django.db.links import (
    RECONNECT_BACKOFF_MAX,
    Link,
    first_line,
    is_connection_lost,
    is_transient,
)
from awa_django.maintenance.cron import CronFirer, sync_schedules
from awa_django.sql import RING_SLOTS, query
from awa_django.telemetry.logs import job_fields
from awa_django.telemetry.metrics import QueueSnapshot, active_metrics

__all__ = ["Maintenance", "MaintenanceSettings"]

log = logging.getLogger("awa_django.maintenance")

#: Keys of unique jobs the sweep reads per statement, and statements per run.
UNIQUE_SWEEP_PAGE = 500
UNIQUE_SWEEP_PAGES = 20


@dataclasses.dataclass(frozen=True, slots=True)
class MaintenanceSettings:
    """The leader's schedule: the validated ``AWA`` settings (intervals in seconds), what is
    derived from them, and two constants that are not settings."""

    awa: AwaSettings
    #: How often runtime rows of processes gone for good are deleted.
    cleanup_interval: float = 60.0
    #: How long a prune waits for the lock on a slot before it tries again later.
    lock_timeout_ms: int = 50
    #: How often the queue charts' roll-up looks for minutes to add (each is added once, about
    #: 10 s after it ends: awa.queue_minutes_record_v1).
    minutes_interval: float = 15.0

    @classmethod
    def from_settings(cls) -> MaintenanceSettings:
        return cls(get_awa_settings())

    @property
    def queue_rotate_interval(self) -> float:
        # Terminal history lives in the sealed slots of the queue ring (all but the current one).
        return float(self.awa.HISTORY_RETENTION) / (RING_SLOTS["queue"] - 1)

    @property
    def outage_hold_back(self) -> float:
        # How long a leader elected after an outage holds back (Maintenance.settled): the
        # staleness bound, and at least what a live worker may take to show itself again: a
        # reconnect (its back-off, twice for a slow connect), then a heartbeat and a refresh
        # of its runtime row.
        awa = self.awa
        slowest = max(float(awa.HEARTBEAT_INTERVAL), float(awa.RUNTIME_REFRESH_INTERVAL))
        return max(self.leader_staleness, 2 * RECONNECT_BACKOFF_MAX + slowest)

    @property
    def leader_staleness(self) -> float:
        # A leader's runtime row is refreshed every RUNTIME_REFRESH_INTERVAL: one this stale
        # belongs to a process that is not running (attempts are rescued at the same bound).
        return max(
            float(self.awa.HEARTBEAT_STALENESS), 3 * float(self.awa.RUNTIME_REFRESH_INTERVAL)
        )


#: The heartbeat staleness a leader that is not ``settled`` rescues at: none (about a century).
_NO_STALENESS = 3e9

MaintenanceTask = Callable[[psycopg.AsyncConnection[Any]], Awaitable[None]]


class Maintenance:
    """Competes for leadership and, while leader, runs every task on its interval."""

    def __init__(
        self,
        settings: MaintenanceSettings,
        instance_id: uuid.UUID,
        *,
        register: bool = False,
    ) -> None:
        self.settings = settings
        self.instance_id = instance_id
        self.register = register
        self.link = Link(
            settings.awa.DATABASE_ALIAS, "leader", str(instance_id), on_connect=_leader_session
        )
        self._foreign_warned_at = -1e9
        #: Whether this process's database role may run maintenance (None: not asked yet).
        self.allowed: bool | None = None
        self.leader = False
        #: time.monotonic() until which this leader holds back (see ``settled``).
        self.held_back_until = 0.0
        # time.monotonic() when this process last lost its connection to the database.
        self._lost_at = -1e9
        self.counters: dict[str, int] = {}
        s = settings
        self.tasks: list[tuple[str, float, MaintenanceTask]] = [
            ("promote", s.awa.PROMOTE_INTERVAL, self._promote),
            ("rescue", s.awa.RESCUE_INTERVAL, self._rescue),
            ("prune", s.awa.PRUNE_INTERVAL, self._prune),
            ("rotate", min(s.awa.PRUNE_INTERVAL, s.awa.CLAIM_ROTATE_INTERVAL), self._rotate),
            ("retention", s.cleanup_interval, self._retention),
            ("minutes", s.minutes_interval, self._record_minutes),
            ("counts", s.minutes_interval, self._fold_counts),
            ("unique", s.awa.UNIQUE_SWEEP_INTERVAL, self._sweep_unique),
            ("cron", s.awa.CRON_EVAL_INTERVAL, self._cron),
        ]
        self.cron = CronFirer()
        #: Whether this process synced its declared schedules (once, at start; retried).
        self.synced = False
        self._sync_retry_at = 0.0
        self._sync_warned_at = -1e9
        # A one-shot run (run_once): its hold-back is one pass, not a time.
        self._one_shot = False
        if register:
            self.tasks.append(("runtime", s.awa.RUNTIME_REFRESH_INTERVAL, self._upsert_runtime))
        self.metrics = active_metrics()  # None unless OpenTelemetry metrics are on
        if self.metrics is not None:
            self.metrics.watch(self)
            self.tasks.append(("metrics", s.awa.RUNTIME_REFRESH_INTERVAL, self._read_gauges))
        self._due: dict[str, float] = {}
        #: How late each task last started after it was due, in seconds (its lag).
        self.lag: dict[str, float] = {}
        self._lag_warned_at = -1e9
        # Where the sweep of unique keys goes on from (in memory: a new leader starts over).
        self._unique_after: tuple[Any, Any] = (None, None)

    async def deregister(self) -> None:
        """Remove this process's runtime row (clean exit of awa_maintenance)."""
        if not self.register:
            return
        with contextlib.suppress(Exception):
            conn = await self.link.connection()
            await conn.execute(query("runtime_remove"), [self.instance_id])
        await self.link.close()

    def is_leader(self) -> bool:
        """Whether this process holds the maintenance lock (tasks may lose it)."""
        return self.leader

    def count(self, name: str, n: int = 1) -> None:
        self.counters[name] = self.counters.get(name, 0) + n

    async def run(self) -> None:
        """Run until cancelled. Leadership is given up when the task is cancelled."""
        loop = asyncio.get_running_loop()
        try:
            while True:
                try:
                    await self._tick(loop)
                except Exception:
                    # Never let the loop die (a bug in this module, say): log, pause, go on.
                    log.exception("awa maintenance: a maintenance pass failed; carrying on")
                    await asyncio.sleep(self.settings.awa.LEADER_ELECTION_INTERVAL)
        finally:
            await self.link.close()

    async def _tick(self, loop: asyncio.AbstractEventLoop) -> None:
        if not self.synced and loop.time() >= self._sync_retry_at:
            await self.sync()
            if not self.synced:  # retried at the election's pace, not on every pass
                self._sync_retry_at = loop.time() + self.settings.awa.LEADER_ELECTION_INTERVAL
        if not self.leader:
            await self._elect()
            if not self.leader:
                await asyncio.sleep(self.settings.awa.LEADER_ELECTION_INTERVAL)
                return
        for name, interval, task in self.tasks:
            now = loop.time()
            due = self._due.get(name)
            if due is not None and now < due:
                continue
            self._note_lag(name, interval, 0.0 if due is None else now - due)
            self._due[name] = now + interval
            await self._run_task(name, task)
            if not self.is_leader():
                return
        if self.leader:
            await asyncio.sleep(max(0.0, min(self._due.values()) - loop.time()))

    def _note_lag(self, name: str, interval: float, late: float) -> None:
        """Record how late task ``name`` starts; log when promotion or rescue runs more than
        a second (and five intervals) late, at most once a minute."""
        self.lag[name] = late
        if name not in ("promote", "rescue") or late <= max(1.0, 5 * interval):
            return
        now = time.monotonic()
        if now - self._lag_warned_at < 60.0:
            return
        self._lag_warned_at = now
        log.warning(
            "awa maintenance: %s ran %.1f s late (every %.2f s is due): the leader's process "
            "was paused (SIGSTOP, a VM or container freeze) or is short of CPU; if this "
            "repeats, run `awa_maintenance` on its own, or fewer handlers beside it",
            name,
            late,
            interval,
        )

    async def run_once(self) -> None:
        """One pass of every task (``awa_maintenance --once``), if leadership can be had. The
        process's runtime row is removed at the end either way."""
        self._one_shot = True
        try:
            await self.sync()
            await self._elect()
            if not self.leader:
                if self.allowed:
                    log.info("awa maintenance: another process is the leader; nothing to do")
                return
            for name, _, task in self.tasks:
                await self._run_task(name, task)
        finally:
            await self.deregister()
            await self.link.close()
            self.leader = False

    async def _hold_back(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Just elected: hold back (``settled``) for ``outage_hold_back`` after an outage: when
        this process lost its connection within that time, or the database restarted within
        it while processes seen before the restart may still live (``awa.leader_grace_v1``).
        Then every worker's heartbeats and runtime row may be stale only because none could
        reach the database, and the workers need that long to reconnect, heartbeat and take
        their permits and keys back. A leader elected otherwise (a process that starts, or
        takes over from a leader that died or froze) holds back nothing."""
        now = time.monotonic()
        hold = self.settings.outage_hold_back
        until = now + hold if now - self._lost_at < hold else 0.0
        try:
            cursor = await conn.execute(query("leader_grace"), [hold])
            row = await cursor.fetchone()
        except Exception as exc:
            if is_connection_lost(exc, self.link.conn):
                await self._discard()
                self._lose()
            log.warning(
                "awa maintenance: could not ask whether the database restarted (%s); holding "
                "back as after an outage",
                first_line(exc),
            )
            row = (hold,)
        if row and row[0]:
            until = max(until, now + float(row[0]))
        self.held_back_until = until
        if until > now:
            log.info(
                "awa maintenance: the database restarted or was out of reach moments ago; %s "
                "rescues no attempt for a stale heartbeat, ends no worker's session and hands "
                "on no serial key, while live workers reconnect",
                "this pass" if self._one_shot else f"for {until - now:.0f} s this leader",
            )

    def settled(self) -> bool:
        """Whether this leader takes workers that do not show themselves for dead. Not right
        after an outage (``_hold_back``): then a leader reaps no session, hands
        on no serial key whose lock is free, and rescues no attempt for a stale heartbeat
        (deadlines and callback timeouts it rescues at once)."""
        return time.monotonic() >= self.held_back_until

    async def _discard(self) -> None:
        """The connection was lost: drop it, and remember when (``_hold_back``)."""
        self._lost_at = time.monotonic()
        await self.link.discard()

    async def sync(self) -> None:
        """Sync the schedules declared in this process's code (``sync_schedules``); a failure
        is logged, and retried at the next pass until it works."""
        try:
            await sync_schedules(await self.link.connection())
        except Exception as exc:
            if is_connection_lost(exc, self.link.conn):
                await self._discard()
            # Retried at every election while the database is out of reach: said once a minute.
            now = time.monotonic()
            if now - self._sync_warned_at >= 60.0:
                self._sync_warned_at = now
                log.warning(
                    "awa maintenance: could not sync periodic schedules (%s); retrying",
                    first_line(exc),
                )
            return
        self.synced = True

    async def _upsert_runtime(self, conn: psycopg.AsyncConnection[Any]) -> None:
        # A maintenance-only process (awa_maintenance) shows in runtime_instances too.
        await conn.execute(
            query("runtime_upsert"),
            [self.instance_id, socket.gethostname(), os.getpid(), "{}", 0, __version__],
        )

    async def _elect(self) -> None:
        try:
            conn = await self.link.connection()
            if self.register:
                await self._upsert_runtime(conn)
            if not await self._allowed(conn):
                return
            cursor = await conn.execute(query("leader_try"))
            row = await cursor.fetchone()
        except Exception as exc:
            if is_connection_lost(exc, self.link.conn):
                await self._discard()
            log.warning("awa maintenance: election failed (%s)", first_line(exc))
            return
        if not (row and row[0]):
            await self._check_holder(conn)
            return
        self.leader = True
        self._due.clear()
        log.info("awa maintenance: %s is now the leader", self.instance_id)
        try:
            await conn.execute(query("leader_mark"), [self.instance_id])
        except Exception as exc:
            if is_connection_lost(exc, self.link.conn):
                await self._discard()
                self._lose()
                return
            log.warning("awa maintenance: could not mark the leader (%s)", first_line(exc))
        await self._hold_back(conn)

    async def _allowed(self, conn: psycopg.AsyncConnection[Any]) -> bool:
        """Whether this process's role may run the maintenance functions (asked at each
        election: grants can change). A role that may not (a worker role, docs/roles.md) never
        stands: as leader it would fail every task while no other process could take over.
        Said once in the log, and again whenever the answer changes."""
        cursor = await conn.execute(query("leader_allowed"))
        row = await cursor.fetchone()
        allowed = bool(row and row[0])
        if not allowed and self.allowed is not False:
            log.warning(
                "awa maintenance: this database role may not run maintenance (no EXECUTE on "
                "awa.promote_v1: manage.py awa_roles grants it to the maintenance role); this "
                "process does not stand for leader (docs/roles.md)"
            )
        self.allowed = allowed
        return allowed

    async def _check_holder(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Another process holds the leader lock: end it if it is an awa process that stopped
        refreshing its runtime row (frozen, wedged, partitioned) while its connection lives on,
        so that leadership moves instead of maintenance stopping for the whole cluster."""
        try:
            cursor = await conn.execute(query("leader_takeover"), [self.settings.leader_staleness])
            rows = await cursor.fetchall()
        except Exception as exc:
            if is_connection_lost(exc, self.link.conn):
                await self._discard()
            log.warning("awa maintenance: could not check the leader (%s)", first_line(exc))
            return
        loop = asyncio.get_running_loop()
        for pid, instance, seen_ago, action in rows:
            if action in ("terminated", "not_permitted"):
                log.warning(
                    "awa maintenance: the leader %s (backend pid %s) has not been seen for %s; %s",
                    instance,
                    pid,
                    "ever" if seen_ago is None else f"{float(seen_ago):.1f} s",
                    "its connection was terminated so that a live process takes over"
                    if action == "terminated"
                    else "its connection could not be terminated (pg_signal_backend is needed); "
                    "maintenance waits for it",
                )
            elif action == "foreign" and loop.time() - self._foreign_warned_at > 60:
                self._foreign_warned_at = loop.time()
                log.warning(
                    "awa maintenance: the leader lock is held by a session that is not an awa "
                    "process (backend pid %s, application_name %r); maintenance waits for it",
                    pid,
                    instance,
                )

    def _lose(self) -> None:
        if self.leader:
            log.warning("awa maintenance: %s lost leadership (connection lost)", self.instance_id)
        self.leader = False

    async def _run_task(self, name: str, task: MaintenanceTask) -> None:
        try:
            conn = await self.link.connection()
            await task(conn)
        except Exception as exc:
            if is_connection_lost(exc, self.link.conn):
                # The session lock went with the connection: another process may lead now.
                await self._discard()
                self._lose()
            elif is_transient(exc):
                # Deadlock, lock or statement timeout: the statement failed, not the leader.
                log.warning(
                    "awa maintenance: %s failed, retried next time: %s", name, first_line(exc)
                )
            else:
                log.error(
                    "awa maintenance: %s failed, retried next time: %s: %s",
                    name,
                    type(exc).__name__,
                    first_line(exc),
                    exc_info=exc,
                )

    async def _promote(self, conn: psycopg.AsyncConnection[Any]) -> None:
        while True:
            cursor = await conn.execute(query("promote"), [4096])
            row = await cursor.fetchone()
            moved = int(row[0]) if row else 0
            self.count("promoted", moved)
            if moved < 4096:
                return

    async def _rescue(self, conn: psycopg.AsyncConnection[Any]) -> None:
        settled = self.settled()
        # Not settled: a staleness no heartbeat reaches, so only deadlines and callback
        # timeouts are rescued (see ``settled``).
        staleness = self.settings.awa.HEARTBEAT_STALENESS if settled else _NO_STALENESS
        cursor = await conn.execute(
            query("rescue"), [staleness, 500, self.settings.awa.RETRY_BACKOFF_BASE]
        )
        rows = await cursor.fetchall()
        if rows:
            self.count("rescued", len(rows))
            known = await _jobs_brief(conn, [int(row[0]) for row in rows])
            if self.metrics is not None:
                pairs = [(known[r[0]][1], known[r[0]][0]) for r in rows if r[0] in known]
                self.metrics.count("rescued", pairs)
                # And where each rescue sent its job: retried, or failed for good.
                for fate in ("retried", "dead_lettered", "failed"):
                    self.metrics.count(
                        fate,
                        [(known[r[0]][1], known[r[0]][0]) for r in rows
                         if r[0] in known and known[r[0]][3] == fate],
                    )  # fmt: skip
            for job_id, lease, reason in rows:
                kind, queue, attempt, _fate = known.get(job_id, (None, None, None, None))
                log.warning(
                    "awa maintenance: rescued job %s attempt lease %s: %s",
                    job_id,
                    lease,
                    reason,
                    extra=job_fields(
                        job_id, kind=kind, queue=queue, attempt=attempt, run_lease=lease
                    ),
                )

        if not settled:
            return
        # Global-concurrency permits held by sessions of workers that are gone (docs/flow.md).
        await self._reap_permits(conn)
        # Serial keys nobody will hand on: their run lock is free (its worker died, or the job
        # it was handed to was cancelled) while jobs wait for them (docs/flow.md).
        cursor = await conn.execute(query("serial_sweep"), [1000])
        handed = [row[0] for row in await cursor.fetchall()]
        if handed:
            self.count("serial_handed_on", len(handed))
            log.info(
                "awa maintenance: handed %d serial key(s) on to their oldest waiting job: %s",
                len(handed),
                ", ".join(str(job_id) for job_id in handed[:20]) + ("..." * (len(handed) > 20)),
            )

    async def _reap_permits(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Terminate the sessions holding permits or serial keys of workers whose runtime
        rows went stale (frozen processes); run only once ``settled`` (``_rescue``)."""
        staleness = self.settings.leader_staleness
        cursor = await conn.execute(query("flow_reap"), [staleness])
        for pid, instance, action in await cursor.fetchall():
            self.count("permits_reaped" if action == "terminated" else "permits_not_reaped")
            log.warning(
                "awa maintenance: %s backend %s of %s, which holds global-concurrency permits "
                "or serial keys but has not refreshed its runtime row for %.0f s%s",
                "terminated" if action == "terminated" else "could not terminate",
                pid,
                instance,
                staleness,
                ""
                if action == "terminated"
                else " (not permitted: grant pg_signal_backend to the maintenance role)",
            )

    async def _read_gauges(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """The leader's snapshot for the metrics' gauges: depth and lag per queue
        (``awa.queue_lag_v1``) and live workers; a scrape reads it, never the database."""
        assert self.metrics is not None
        cursor = await conn.execute(query("queue_lag"))
        queues = {
            str(queue): (int(depth or 0), None if lag is None else float(lag))
            for queue, depth, lag, _paused in await cursor.fetchall()
        }
        cursor = await conn.execute(query("workers_alive"), [self.settings.leader_staleness])
        row = await cursor.fetchone()
        cursor = await conn.execute(query("workflow_counts"))
        flows = {(str(k), str(s)): int(n) for k, s, n in await cursor.fetchall()}
        self.metrics.snapshot = QueueSnapshot(
            queues, int(row[0]) if row else 0, time.monotonic(), flows
        )

    async def _rotate(self, conn: psycopg.AsyncConnection[Any]) -> None:
        s = self.settings
        for ring, interval in (
            ("claim", s.awa.CLAIM_ROTATE_INTERVAL),
            ("lease", s.awa.CLAIM_ROTATE_INTERVAL),
            ("queue", s.queue_rotate_interval),
        ):
            cursor = await conn.execute(query("rotate"), [ring, interval])
            row = await cursor.fetchone()
            outcome = row[0] if row else "?"
            self.count(f"rotate_{ring}_{outcome}")
            log.debug("awa maintenance: rotate %s ring: %s", ring, outcome)

    async def _prune(self, conn: psycopg.AsyncConnection[Any]) -> None:
        for ring in ("claim", "lease", "queue"):
            cursor = await conn.execute(query("prune"), [ring, self.settings.lock_timeout_ms])
            row = await cursor.fetchone()
            outcome = row[0] if row else "?"
            self.count(f"prune_{ring}_{outcome.split(':')[0]}")
            log.debug("awa maintenance: prune %s ring: %s", ring, outcome)

    async def _cron(self, conn: psycopg.AsyncConnection[Any]) -> None:
        self.count("cron_fired", await self.cron.evaluate(conn))

    async def _retention(self, conn: psycopg.AsyncConnection[Any]) -> None:
        cursor = await conn.execute(query("dlq_expire"), [self.settings.awa.DLQ_RETENTION, 1000])
        row = await cursor.fetchone()
        self.count("dlq_expired", int(row[0]) if row else 0)
        # Finished workflows, 1,000 a statement, until none is left (at most 100 statements a
        # run, so that the other retention tasks are not held back).
        for _ in range(100):
            cursor = await conn.execute(
                query("workflows_prune"), [self.settings.awa.WORKFLOW_RETENTION, 1000]
            )
            row = await cursor.fetchone()
            pruned = int(row[0]) if row else 0
            self.count("workflows_pruned", pruned)
            if pruned < 1000:
                break
        cursor = await conn.execute(query("cleanup"), [self.settings.awa.RUNTIME_RETENTION])
        row = await cursor.fetchone()
        self.count("cleaned", int(row[0]) if row else 0)
        cursor = await conn.execute(
            query("descriptors_prune"), [self.settings.awa.DESCRIPTOR_RETENTION]
        )
        row = await cursor.fetchone()
        self.count("descriptors_pruned", int(row[0]) if row else 0)
        # Receipts of the callback receiver are kept while a replay of their request could still
        # pass its timestamp window (docs/callbacks.md, "Replays").
        keep = 2 * self.settings.awa.CALLBACK_TIMESTAMP_TOLERANCE + 60
        while True:
            cursor = await conn.execute(query("callback_receipts_prune"), [keep, 1000])
            row = await cursor.fetchone()
            pruned = int(row[0]) if row else 0
            self.count("callback_receipts_pruned", pruned)
            if pruned < 1000:
                break

    async def _record_minutes(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Roll the minutes that ended into ``awa.queue_minutes`` (the admin's queue charts)."""
        cursor = await conn.execute(query("queue_minutes_record"))
        row = await cursor.fetchone()
        self.count("minutes_recorded", int(row[0]) if row else 0)

    async def _fold_counts(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Fold the terminal-count deltas into their running totals (``awa.done_counts``), so
        that exact history counts stay a few index probes at any history size."""
        cursor = await conn.execute(query("done_counts_fold"))
        row = await cursor.fetchone()
        self.count("counts_folded", int(row[0]) if row else 0)

    async def _sweep_unique(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Delete keys of unique jobs that no longer block duplicates, a bounded number of
        pages per run (a key that still blocks is kept and looked at again next round)."""
        for _ in range(UNIQUE_SWEEP_PAGES):
            after_taken, after_key = self._unique_after
            cursor = await conn.execute(
                query("unique_sweep"), [after_taken, after_key, UNIQUE_SWEEP_PAGE]
            )
            row = await cursor.fetchone()
            if row is None:  # pragma: no cover - the function always returns a row
                return
            deleted, next_taken, next_key = row
            self.count("unique_released", int(deleted))
            self._unique_after = (next_taken, next_key)
            if next_taken is None:
                return


async def _jobs_brief(
    conn: psycopg.AsyncConnection[Any], ids: list[int]
) -> dict[int, tuple[str, str, int, str | None]]:
    """``{job_id: (kind, queue, attempt, fate)}`` of a few rescued jobs (fate: ``retried``,
    ``dead_lettered`` or ``failed``); empty when the look-up fails (it only adds detail to log
    lines and metrics: a lost connection shows up on the next task)."""
    try:
        cursor = await conn.execute(query("jobs_brief"), {"ids": ids})
        return {
            int(i): (kind, queue, int(a), fate)
            for i, kind, queue, a, fate in await cursor.fetchall()
        }
    except Exception as exc:
        log.debug("awa maintenance: could not look up rescued jobs (%s)", first_line(exc))
        return {}


async def _leader_session(conn: psycopg.AsyncConnection[Any]) -> None:
    """Bound every maintenance statement on the leader's connection (lock and statement
    timeouts): a lock holder elsewhere fails one task, logged, never freezes maintenance."""
    await conn.execute(query("leader_session"))
