"""One worker process: dispatch, execution, heartbeats, wake-ups, graceful drain.

Lifecycle: register in ``awa.runtime_instances`` → one dispatcher per queue claims batches
sized to its free execution slots (``CONCURRENCY`` slots per process, shared by its queues,
each queue capped: awa_django/worker/slots.py) → async handlers run as tasks on the event
loop, sync ones on daemon threads, a claim's jobs handed over together
(awa_django/worker/threads.py) → outcomes go to the completion batcher → SIGTERM/SIGINT stop
claiming, let in-flight jobs finish for up to ``SHUTDOWN_TIMEOUT`` while heartbeats go on,
flush completions and exit 0. A second signal exits at once; whatever it leaves open is rescued
later, never lost.

A worker started without ``--queue`` serves every queue that exists in the database, and finds
new ones every ``RUNTIME_REFRESH_INTERVAL`` (at once when a wake-up names a queue it does not
serve yet): a job that can be enqueued is run.

Faults (docs/worker.md, "Faults"):

* every background loop survives any error that is not a lost connection: it logs it (with the
  job id when there is one), fails only the offending item with a readable error and carries
  on. A loop that ends anyway makes the process exit with status 70 at once, so a supervisor
  restarts it: it never runs half-alive;
* a handler ends its job whatever it raises (``BaseException`` included) or returns;
* a handler told to stop (past its hard deadline, cancelled, or rescued) that is still running
  ``ABANDON_AFTER`` seconds later is abandoned: its slot is freed for other jobs and its
  attempt is left to the database (rescue or cancel closes it). When more handlers are stuck
  than the process has slots, it drains and exits with status 75 to be restarted.

Coordination times (deadlines, heartbeats, staleness) live on the database clock; this module
measures only local durations with the event loop's monotonic clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
import time
import uuid
from typing import Any

import psycopg

from awa_django._version import __version__
from awa_django.connection_budget import connection_budget, own_connections
from awa_django.db.links import RECONNECT_BACKOFF_MAX, Link, first_line, is_connection_lost
from awa_django.jobs import kind_flow_limits, registered_kinds
from awa_django.limits import QUEUE_NAME_RE
from awa_django.maintenance.cron import sync_schedules
from awa_django.maintenance.leader import Maintenance, MaintenanceSettings
from awa_django.maintenance.thread import MaintenanceThread
from awa_django.sql import notify_channel, query
from awa_django.telemetry.metrics import active_metrics
from awa_django.telemetry.tracing import active_tracing
from awa_django.worker.attempts import EXIT_STUCK_HANDLERS, Attempts, Running
from awa_django.worker.batcher import CompletionBatcher
from awa_django.worker.config import QueueConfig, WorkerConfig
from awa_django.worker.declarations import declarations, live_seconds
from awa_django.worker.dispatch import Dispatcher
from awa_django.worker.family import FAMILY_ENV, Family
from awa_django.worker.finalizations import safe_str
from awa_django.worker.flow import Permits
from awa_django.worker.guards import (
    EXIT_LOOP_FAILED,
    LoopWatchdog,
    exit_when_database_replaced,
    hard_exit,
)
from awa_django.worker.heartbeats import Heartbeats
from awa_django.worker.slots import Slots
from awa_django.worker.sweep import sweep_session
from awa_django.worker.wakeups import FamilyWakeups, HandOffs

__all__ = ["EXIT_LOOP_FAILED", "EXIT_STUCK_HANDLERS", "WorkerRuntime"]

log = logging.getLogger("awa_django.worker")

_TICK = 0.5


class WorkerRuntime:
    """Runs one worker process until it is told to stop (or, in burst mode, runs out of work).

    It owns the process's connections (``claim_link``, ``finalize_link``, ``control_link``,
    ``sweep_link``),
    its execution ``slots``, flow ``permits`` and completion ``batcher``, and composes the
    parts that use them: the ``dispatcher`` (claims), the in-flight ``attempts``, their
    ``heartbeats``, and the family's wake-ups (``wakeups``, ``hand_offs``). It runs their
    loops, the runtime row, queue discovery, and the graceful stop.
    """

    def __init__(
        self,
        config: WorkerConfig,
        *,
        instance_id: uuid.UUID | None = None,
        handle_signals: bool = True,
    ) -> None:
        """``handle_signals=False`` leaves SIGTERM/SIGINT to the caller, which must then call
        :meth:`signal_received` (a runtime on another thread than the main one, under the
        autoreloader)."""
        self.config = config
        self.instance_id = instance_id or uuid.uuid4()
        name = str(self.instance_id)
        alias = config.settings.DATABASE_ALIAS
        self.permits = Permits()
        self.claim_link = Link(alias, "claim", name, on_connect=self.permits.on_connect)
        self.finalize_link = Link(alias, "finalize", name)
        self.control_link = Link(alias, "heartbeat", name)
        # The sweep of idle queues, queue discovery and the burst check: statements that may be
        # slow, never on the heartbeat connection (a late heartbeat gets a live job rescued).
        self.sweep_link = Link(alias, "sweep", name, on_connect=sweep_session)
        self._metrics = active_metrics()  # None unless OpenTelemetry metrics are on
        self._tracing = active_tracing()  # None unless OpenTelemetry traces are on
        self.batcher = CompletionBatcher(
            self.finalize_link,
            batch_size=config.settings.COMPLETION_BATCH_SIZE,
            flush_interval=config.settings.COMPLETION_FLUSH_INTERVAL,
            give_up=self._shutdown_overdue,
            metrics=self._metrics,
        )
        self.queues: dict[str, QueueConfig] = {}
        self._declare_failed = False
        self._declared: str | None = None  # the last report the database took
        self._declare_ticks = 0
        self.slots = Slots(config.concurrency, config.settings.CLAIM_BATCH_SIZE)
        self.stopping = False
        self.exit_code = 0
        self.signals = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._handle_signals = handle_signals
        self._rediscover = asyncio.Event()
        self._reregister = asyncio.Event()
        # Which process of an ``awa_worker --processes N`` family answers NOTIFY (family.py).
        self.family = Family(os.environ.get(FAMILY_ENV), stale_after=4 * _TICK)
        self._build_parts()
        self._stop = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop_deadline: float | None = None
        self._watchdog = LoopWatchdog(
            limit=max(config.settings.HEARTBEAT_STALENESS, 10.0), interval=_TICK
        )
        self._signal_handler = self._on_signal
        self._maintenance: MaintenanceThread | None = None

    def _build_parts(self) -> None:
        """The parts of the process, each given what it needs in its constructor."""
        config = self.config
        self.attempts = Attempts(
            config,
            instance_id=self.instance_id,
            runtime=self,
            slots=self.slots,
            permits=self.permits,
            batcher=self.batcher,
            control_link=self.control_link,
            metrics=self._metrics,
            tracing=self._tracing,
            permits_returned=self._permits_returned,
            stopping=self.is_stopping,
            restart=self._restart,
        )
        self.heartbeats = Heartbeats(config, self.attempts, self.control_link)
        self.hand_offs = HandOffs(self.control_link, stopping=self.is_stopping)
        self.dispatcher = Dispatcher(
            config,
            instance_id=self.instance_id,
            slots=self.slots,
            permits=self.permits,
            claim_link=self.claim_link,
            sweep_link=self.sweep_link,
            family=self.family,
            metrics=self._metrics,
            start_batch=self.attempts.start_batch,
            hand_off=self.hand_offs.send,
            stopping=self.is_stopping,
        )
        self.wakeups = FamilyWakeups(
            config,
            family=self.family,
            dispatcher=self.dispatcher,
            slots=self.slots,
            hand_off=self.hand_offs.send,
            rediscover=self._rediscover.set,
        )

    @property
    def inflight(self) -> dict[tuple[int, int], Running]:
        """The attempts running now, by ``(job_id, run_lease)``."""
        return self.attempts.inflight

    @property
    def claimed(self) -> int:
        """Attempts this process claimed."""
        return self.dispatcher.claimed

    # -- lifecycle ---------------------------------------------------------------------------

    async def run(self) -> int:
        """Serve until stopped; return the process exit code (0 after a graceful drain)."""
        loop = self._loop = asyncio.get_running_loop()
        await self._start(loop)
        batcher, dispatch, background = self._start_loops(loop)
        await self._stop.wait()
        await self._shut_down(loop, batcher, dispatch, background)
        self._watchdog.close()
        if self.attempts.left_running():
            # Handlers that will not end would keep the interpreter from exiting (asyncio.run
            # waits for tasks, the interpreter for executor threads): leave now.
            hard_exit(self.exit_code)
        return self.exit_code

    async def _start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Bind the parts to ``loop``, take the configured queues, and write what a worker
        writes when it starts (runtime row, flow limits, schedules)."""
        self.attempts.bind(loop)
        await self.attempts.async_orm.start()
        self.hand_offs.bind(loop)
        for queue in self.config.queues:
            self.queues[queue.name] = queue
            self.dispatcher.add(queue)
        if self._handle_signals:
            self._install_signals()
        self._watchdog.start()
        exit_when_database_replaced()
        self._tick()
        if self.config.discover:
            await self._discover(start=False)
        await self._register()
        await self._sync_flow_limits()
        if not self.config.maintenance:
            await self._sync_schedules()  # with maintenance, Maintenance syncs them
        await self._check_connection_budget()
        log.info(
            "awa worker %s started: pid %s, %d job(s) at once, queues %s%s",
            self.instance_id,
            os.getpid(),
            self.config.concurrency,
            ", ".join(f"{q.name}={q.concurrency}" for q in self.queues.values()),
            " and any other queue that appears" if self.config.discover else "",
        )

    def _start_loops(
        self, loop: asyncio.AbstractEventLoop
    ) -> tuple[asyncio.Task[Any], asyncio.Task[Any], list[asyncio.Task[Any]]]:
        """Start the background loops: (the batcher's, the dispatcher's, the others)."""
        batcher = self._watch(loop.create_task(self.batcher.run(), name="awa-batcher"))
        background = [
            self._watch(loop.create_task(self.heartbeats.run(), name="awa-heartbeat")),
            self._watch(loop.create_task(self._refresh_loop(), name="awa-refresh")),
        ]
        if self.config.discover:
            background.append(
                self._watch(loop.create_task(self._discover_loop(), name="awa-discover"))
            )
        if self.config.settings.NOTIFY:
            background.append(self._watch(loop.create_task(self._listen_loop(), name="awa-listen")))
        if self.config.burst:
            background.append(self._watch(loop.create_task(self._burst_loop(), name="awa-burst")))
        background.append(self._watch(loop.create_task(self._lock_watch(), name="awa-locks")))
        if self.config.maintenance:
            # On a thread of its own (awa_django/maintenance/thread.py): saturated handlers do
            # not delay its turns.
            self._maintenance = MaintenanceThread(
                Maintenance(MaintenanceSettings.from_settings(), self.instance_id),
                self._maintenance_ended,
            )
            self._maintenance.start()
        dispatch = self._watch(loop.create_task(self.dispatcher.run(), name="awa-dispatch"))
        background.append(self._watch(loop.create_task(self.dispatcher.sweep(), name="awa-sweep")))
        return batcher, dispatch, background

    async def _shut_down(
        self,
        loop: asyncio.AbstractEventLoop,
        batcher: asyncio.Task[Any],
        dispatch: asyncio.Task[Any],
        background: list[asyncio.Task[Any]],
    ) -> None:
        """The graceful stop: no more claims, drain the attempts, flush their outcomes, end
        the other loops, remove the runtime row, close the connections."""
        attempts = self.attempts
        log.info(
            "awa worker %s stopping: %d job(s) in flight", self.instance_id, len(attempts.inflight)
        )
        self.dispatcher.stop()
        await asyncio.gather(dispatch, return_exceptions=True)
        await attempts.drain()
        self._stop_deadline = loop.time() + self.config.settings.SHUTDOWN_TIMEOUT
        self.batcher.close()
        await batcher
        for task in background:
            task.cancel()
        await asyncio.gather(*background, return_exceptions=True)
        if self._maintenance is not None:
            await asyncio.to_thread(self._maintenance.stop)
        await self._deregister()
        for link in (self.claim_link, self.finalize_link, self.control_link, self.sweep_link):
            await link.close()
        attempts.close()
        log.info(
            "awa worker %s stopped: %d claimed, %d finished, %d stale, %d abandoned",
            self.instance_id,
            self.claimed,
            attempts.finished,
            self.batcher.stale,
            attempts.abandoned_total,
        )

    def stop(self) -> None:
        """Begin a graceful stop (what SIGTERM does)."""
        self.stopping = True
        self.family.release()  # another process of the family answers NOTIFY from now on
        self._stop.set()
        # Past this, the watchdog ends the process (a handler holding the loop, say).
        self._watchdog.stopping(2 * self.config.settings.SHUTDOWN_TIMEOUT + 10.0, self.exit_code)

    def _restart(self, code: int) -> None:
        """Drain, then exit with ``code``, so that the process is restarted (too many stuck
        handlers: ``Attempts``)."""
        self.exit_code = code
        self.stop()

    def request_stop(self) -> None:
        """Begin a graceful stop from any thread (a no-op before the runtime runs or after its
        loop ended)."""
        loop = self._loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop is closed
                loop.call_soon_threadsafe(self.stop)

    def _tick(self) -> None:
        self._watchdog.tick()
        self.family.beat()  # the leader tells the family it is not frozen
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_later(_TICK, self._tick)

    def signal_received(self, signum: int) -> None:
        """SIGTERM or SIGINT reached the process (for callers that handle signals themselves):
        the first one drains, a second one exits at once. Safe from a signal handler."""
        self._on_signal(signum)

    def _install_signals(self) -> None:
        """SIGTERM and SIGINT through ``signal.signal``, not the event loop: the handler then
        runs even while a handler blocks the loop, so a second signal always exits at once."""
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._signal_handler)

    def _check_signals(self) -> None:
        """Put back SIGTERM/SIGINT handling if handler code replaced it."""
        if not self._handle_signals:
            return
        for signum in (signal.SIGTERM, signal.SIGINT):
            if signal.getsignal(signum) is not self._signal_handler:
                log.warning(
                    "awa worker %s: %s handling was replaced (by handler code?); restored",
                    self.instance_id,
                    signal.Signals(signum).name,
                )
                signal.signal(signum, self._signal_handler)

    def is_stopping(self) -> bool:
        """Whether a graceful stop has begun."""
        return self.stopping

    def _shutdown_overdue(self) -> bool:
        loop = self._loop
        return (
            self._stop_deadline is not None
            and loop is not None
            and loop.time() > self._stop_deadline
        )

    def _watch(self, task: asyncio.Task[Any]) -> asyncio.Task[Any]:
        """Make a background loop fatal if it ends on its own: never run half-alive."""
        task.add_done_callback(self._loop_ended)
        return task

    def _loop_ended(self, task: asyncio.Task[Any]) -> None:
        if self.stopping and (task.cancelled() or task.exception() is None):
            return
        exc = None if task.cancelled() else task.exception()
        log.critical(
            "awa worker %s: background loop %s ended unexpectedly (%s); exiting with status "
            "%d so that the process is restarted; its attempts will be rescued",
            self.instance_id,
            task.get_name(),
            "cancelled"
            if task.cancelled()
            else "returned"
            if exc is None
            else f"{type(exc).__name__}: {safe_str(exc)}",
            EXIT_LOOP_FAILED,
            exc_info=exc,
        )
        hard_exit(EXIT_LOOP_FAILED)

    def _maintenance_ended(self, error: BaseException | None) -> None:
        """The maintenance thread's loop ended on its own (on that thread): exit, as for any
        background loop."""
        log.critical(
            "awa worker %s: the maintenance loop ended unexpectedly (%s); exiting with status "
            "%d so that the process is restarted; its attempts will be rescued",
            self.instance_id,
            "returned" if error is None else f"{type(error).__name__}: {safe_str(error)}",
            EXIT_LOOP_FAILED,
            exc_info=error,
        )
        hard_exit(EXIT_LOOP_FAILED)

    def _on_signal(self, signum: int, frame: object = None) -> None:
        """The SIGTERM/SIGINT handler (runs in the main thread, between bytecodes)."""
        self.signals += 1
        if self.signals > 1:
            log.warning(
                "awa worker %s: second signal, exiting at once with %d job(s) in flight "
                "(they will be rescued)",
                self.instance_id,
                len(self.inflight),
            )
            hard_exit(128 + signum)
        self._watchdog.stopping(2 * self.config.settings.SHUTDOWN_TIMEOUT + 10.0, self.exit_code)
        loop = self._loop
        if loop is not None:
            loop.call_soon_threadsafe(self._begin_stop, signum)

    def _begin_stop(self, signum: int) -> None:
        log.info(
            "awa worker %s: %s received, draining (up to %.0f s)",
            self.instance_id,
            signal.Signals(signum).name,
            self.config.settings.SHUTDOWN_TIMEOUT,
        )
        self.stop()

    async def _sync_schedules(self) -> None:
        """Sync the periodic schedules declared in this process's code (a failure is logged;
        the next process to start, or this one's maintenance, syncs them)."""
        try:
            await self.control_link.run(sync_schedules, give_up=lambda: self.stopping)
        except Exception as exc:
            log.warning("awa worker: could not sync periodic schedules (%s)", first_line(exc))

    async def _sync_flow_limits(self) -> None:
        """Write the queues' flow limits from ``AWA["QUEUES"]`` and the job kinds' from
        ``@job`` and ``AWA["KINDS"]`` (docs/flow.md): operator overrides stay; a failure is
        logged (the limits in the database stay in force)."""
        limits = {
            name: queue.flow_limits()
            for name, queue in self.config.settings.QUEUES.items()
            if queue.has_flow_limits
        }
        kinds = kind_flow_limits()

        async def sync(conn: psycopg.AsyncConnection[Any]) -> int:
            changed = 0
            for name, value in (("flow_sync", limits), ("flow_kind_sync", kinds)):
                cursor = await conn.execute(query(name), [json.dumps(value)])
                row = await cursor.fetchone()
                changed += int(row[0]) if row else 0
            return changed

        try:
            changed = await self.control_link.run(sync, give_up=lambda: self.stopping)
        except Exception as exc:
            log.warning("awa worker: could not write the queues' flow limits (%s)", first_line(exc))
            return
        if changed:
            log.info(
                "awa worker: flow limits from settings written (%d change(s)): queues %s, kinds %s",
                changed,
                json.dumps(limits, sort_keys=True),
                json.dumps(kinds, sort_keys=True),
            )

    async def _register(self) -> None:
        queues = json.dumps({q.name: q.concurrency for q in self.queues.values()})

        async def upsert(conn: psycopg.AsyncConnection[Any]) -> None:
            await conn.execute(
                query("runtime_upsert"),
                [
                    self.instance_id,
                    socket.gethostname(),
                    os.getpid(),
                    queues,
                    self.config.concurrency,
                    __version__,
                ],
            )

        await self.control_link.run(upsert, give_up=lambda: self.stopping)
        await self._declare()

    async def _declare(self) -> None:
        """Report what this process declares (docs/descriptors.md): at start, when it
        changes, and every tenth runtime refresh (the database writes only what changed). The
        queues are those it started with, not those it discovers later. A failure is logged
        once and never stops the worker."""
        cfg = self.config.settings
        try:
            items = json.dumps(
                declarations(registered_kinds(), [q.name for q in self.config.queues], cfg)
            )
        except Exception as exc:
            self._declare_warn(exc)
            return
        self._declare_ticks += 1
        if items == self._declared and self._declare_ticks % 10:
            return
        seconds = live_seconds(cfg)

        async def report(conn: psycopg.AsyncConnection[Any]) -> None:
            await conn.execute(query("descriptors_report"), [self.instance_id, seconds, items])

        try:
            await self.control_link.run(report, give_up=lambda: self.stopping)
        except Exception as exc:
            self._declare_warn(exc)
            self._declared = None
        else:
            self._declare_failed = False
            self._declared = items

    def _declare_warn(self, exc: Exception) -> None:
        if not self._declare_failed:
            log.warning(
                "awa worker: could not report its queues and kinds (%s); the admin shows them "
                "as stale until it can",
                first_line(exc),
            )
        self._declare_failed = True

    async def _check_connection_budget(self) -> None:
        """Warn when this fleet could exhaust the server's max_connections: ``--processes``
        processes of :func:`~awa_django.connection_budget.connection_budget` connections each."""
        processes = self.config.processes
        listen, maintenance = self.config.settings.NOTIFY, self.config.maintenance
        own = own_connections(listen=listen, maintenance=maintenance)
        needed = connection_budget(
            processes, self.config.concurrency, listen=listen, maintenance=maintenance
        )

        async def limits(conn: psycopg.AsyncConnection[Any]) -> tuple[int, int]:
            cursor = await conn.execute(
                query("connection_budget"), {"mine": f"awa:worker:{self.instance_id}"}
            )
            row = await cursor.fetchone()
            return (int(row[0]), int(row[1])) if row else (0, 0)

        try:
            maximum, in_use = await self.control_link.run(limits, give_up=lambda: self.stopping)
        except Exception as exc:
            log.warning("awa worker: could not read max_connections (%s)", first_line(exc))
            return
        if needed > maximum - in_use:
            log.warning(
                "awa worker: %d process(es) x (%d handler threads + %d) may need %d connections, "
                "but the server allows %d (max_connections less its reserved slots) and %d "
                "others are in use; lower the concurrency or raise max_connections",
                processes,
                self.config.concurrency,
                own,
                needed,
                maximum,
                in_use,
            )

    async def _deregister(self) -> None:
        async def remove(conn: psycopg.AsyncConnection[Any]) -> None:
            await conn.execute(query("runtime_remove"), [self.instance_id])

        try:
            await self.control_link.run(remove, give_up=lambda: True)
        except Exception as exc:
            log.warning(
                "awa worker %s: could not remove its runtime row (%s); it expires on its own",
                self.instance_id,
                first_line(exc),
            )

    # -- dispatch and execution --------------------------------------------------------------

    async def _discover(self, *, start: bool = True) -> bool:
        """Serve every queue of the database this worker does not serve yet (``start``: with
        a dispatcher of its own at once); return whether it found any. Only for workers
        started without ``--queue``."""

        async def known(conn: psycopg.AsyncConnection[Any]) -> list[str]:
            cursor = await conn.execute(query("queues_known"))
            return [row[0] for row in await cursor.fetchall()]

        names = await self.sweep_link.run(known, give_up=lambda: self.stopping)
        found = [n for n in names if n not in self.queues and QUEUE_NAME_RE.fullmatch(n)]
        if self.stopping:
            return False
        for name in found:
            queue = self.config.queue_config(name)
            self.queues[name] = queue
            self.dispatcher.add(queue, due=start)
            if start:
                log.info("awa worker %s: now serving queue %s", self.instance_id, name)
        return bool(found)

    def _permits_returned(self, queue: str) -> None:
        """An attempt holding permits ended: its queue's dispatcher hands them back with its
        next claim; once dispatchers have stopped (a graceful stop), a task does it."""
        if not self.stopping:
            self.dispatcher.permits_returned(queue)
            return
        loop = self._loop
        if loop is not None and not loop.is_closed():
            task = loop.create_task(self._release_permits())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _release_permits(self) -> None:
        keys = self.permits.release_batch()
        serial = self.permits.serial_release_batch()
        if not keys and not serial:
            return

        async def release(conn: psycopg.AsyncConnection[Any]) -> None:
            if keys:
                await conn.execute(query("flow_release"), [keys])
            if serial:
                await conn.execute(query("serial_release"), [serial])

        try:
            await self.claim_link.run(release, give_up=lambda: True)
        except Exception as exc:  # the session's end frees them (the leader hands keys on)
            log.warning(
                "awa worker: could not hand back permits or serial keys (%s)", first_line(exc)
            )

    # -- heartbeats, wake-ups, runtime row ---------------------------------------------------

    def request_flush(self) -> None:
        """Write progress now (``JobContext.flush_progress``); thread-safe."""
        loop = self._loop
        if loop is not None:
            loop.call_soon_threadsafe(self.heartbeats.beat_now)

    async def _refresh_loop(self) -> None:
        """Every ``RUNTIME_REFRESH_INTERVAL``, or at once when new queues were found: refresh
        the runtime row and put back signal handling (on the heartbeat connection: the
        leader takes a worker whose row goes stale for gone)."""
        interval = self.config.settings.RUNTIME_REFRESH_INTERVAL
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._reregister.wait(), interval)
            self._reregister.clear()
            try:
                self._check_signals()
                await self._register()
            except Exception as exc:
                log.warning("awa worker: could not refresh the runtime row (%s)", first_line(exc))

    async def _discover_loop(self) -> None:
        """Without ``--queue``: every ``RUNTIME_REFRESH_INTERVAL``, find new queues (at once
        when a wake-up names a queue this worker does not serve yet, at most once per
        ``POLL_INTERVAL``), on the sweep's connection; new queues are written to the runtime
        row at once."""
        loop = asyncio.get_running_loop()
        interval = self.config.settings.RUNTIME_REFRESH_INTERVAL
        due = loop.time() + interval
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._rediscover.wait(), max(0.0, due - loop.time()))
            self._rediscover.clear()
            if loop.time() >= due:
                due = loop.time() + interval
            try:
                if await self._discover():
                    self._reregister.set()
            except Exception as exc:
                log.warning("awa worker: could not look for new queues (%s)", first_line(exc))
            await asyncio.sleep(self.config.settings.POLL_INTERVAL)

    async def _listen_loop(self) -> None:
        delay = 0.05
        listen = Link(self.config.settings.DATABASE_ALIAS, "listen", str(self.instance_id))
        jobs, cancel = notify_channel("jobs"), notify_channel("cancel")
        while True:
            try:
                conn = await listen.connection()
                await conn.execute(query("listen_jobs"))
                await conn.execute(query("listen_cancel"))
                delay = 0.05
                self.dispatcher.wake_all()  # catch up on anything missed while disconnected
                if self.config.discover:
                    self._rediscover.set()
                async for note in conn.notifies():
                    if note.channel == jobs:
                        self.wakeups.on_note(note.payload)
                    elif note.channel == cancel:
                        self.attempts.on_cancel_note(note.payload)
            except asyncio.CancelledError:
                await listen.close()
                raise
            except Exception as exc:
                lost = is_connection_lost(exc, listen.conn)
                await listen.discard()
                log.log(
                    logging.WARNING if lost else logging.ERROR,
                    "awa worker: listen connection %s (%s); reconnecting in %.2f s",
                    "lost" if lost else "failed",
                    first_line(exc),
                    delay,
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, RECONNECT_BACKOFF_MAX)

    async def _lock_watch(self) -> None:
        """While this process holds permits or serial keys, make sure every ``POLL_INTERVAL``
        that its claim connection lives (a ping when no claim used it meanwhile). The locks are
        that session's: after a database restart or a terminated backend they are gone, and a
        process whose slots are all busy makes no claim that would find out. So they are taken
        back at once, and one another session took meanwhile is logged, instead of when a
        handler next ends (docs/flow.md)."""
        interval = self.config.settings.POLL_INTERVAL

        async def ping(conn: psycopg.AsyncConnection[Any]) -> None:
            await conn.execute(query("ping"))

        while not self.stopping:
            await asyncio.sleep(interval)
            if not (self.permits.held_keys() or self.permits.serial_held_keys()):
                continue
            if time.monotonic() - self.claim_link.last_ok < interval:
                continue
            try:
                await self.claim_link.run(ping, give_up=lambda: self.stopping)
            except Exception as exc:
                log.warning("awa worker: claim connection check failed (%s)", first_line(exc))

    async def _burst_loop(self) -> None:
        async def idle(conn: psycopg.AsyncConnection[Any]) -> bool:
            cursor = await conn.execute(query("queues_idle"), [list(self.queues)])
            row = await cursor.fetchone()
            return bool(row and row[0])

        while not self.stopping:
            await asyncio.sleep(self.config.settings.POLL_INTERVAL)
            if self.inflight or self.batcher.pending:
                continue
            try:
                done = await self.sweep_link.run(idle)
            except Exception as exc:
                log.warning("awa worker: burst check failed (%s)", first_line(exc))
                continue
            if done:
                log.info("awa worker %s: burst mode, nothing left to do", self.instance_id)
                self.stop()
