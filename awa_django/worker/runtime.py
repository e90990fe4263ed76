"""One worker process: dispatch, execution, heartbeats, wake-ups, graceful drain.

Lifecycle: register in ``awa.runtime_instances`` → one dispatcher per queue claims batches
sized to its free execution slots → async handlers run as tasks on the event loop, sync ones in
a thread pool (each wrapped in ``close_old_connections()``) → outcomes go to the completion
batcher → SIGTERM/SIGINT stop claiming, let in-flight jobs finish for up to
``SHUTDOWN_TIMEOUT`` while heartbeats go on, flush completions and exit 0. A second signal exits
at once; whatever it leaves open is rescued later, never lost.

Coordination times (deadlines, heartbeats, staleness) live on the database clock; this module
measures only local durations with the event loop's monotonic clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
import signal
import socket
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg
from django.db import close_old_connections

from awa_django.db.storage import ClaimedJob, Finalization, aclaim, aheartbeat
from awa_django.jobs import registered_kinds
from awa_django.maintenance.leader import Maintenance, MaintenanceSettings
from awa_django.sql import query
from awa_django.worker.batcher import CompletionBatcher
from awa_django.worker.config import QueueConfig, WorkerConfig
from awa_django.worker.context import JobContext
from awa_django.worker.executor import PreparedAttempt, outcome_of, prepare
from awa_django.worker.links import CONNECTION_ERRORS, Link

__all__ = ["WorkerRuntime"]

log = logging.getLogger("awa_django.worker")


class Running:
    """Book-keeping of one in-flight attempt."""

    __slots__ = ("attempt", "has_state", "queue", "started", "task", "timer")

    def __init__(self, attempt: PreparedAttempt, queue: QueueConfig, started: float) -> None:
        self.attempt = attempt
        self.queue = queue
        self.started = started
        self.has_state = False
        # A strong reference: the event loop keeps only weak ones to running tasks.
        self.task: asyncio.Future[Any] | None = None
        self.timer: asyncio.TimerHandle | None = None


class WorkerRuntime:
    """Runs one worker process until it is told to stop (or, in burst mode, runs out of work)."""

    def __init__(self, config: WorkerConfig, *, instance_id: uuid.UUID | None = None) -> None:
        self.config = config
        self.instance_id = instance_id or uuid.uuid4()
        name = str(self.instance_id)
        self.claim_link = Link(config.alias, "claim", name)
        self.finalize_link = Link(config.alias, "finalize", name)
        self.control_link = Link(config.alias, "heartbeat", name)
        self.batcher = CompletionBatcher(
            self.finalize_link,
            batch_size=config.completion_batch,
            flush_interval=config.completion_flush,
        )
        self.inflight: dict[tuple[int, int], Running] = {}
        self.running: dict[str, int] = {q.name: 0 for q in config.queues}
        self.low_water = {
            q.name: max(1, min(config.claim_batch, q.concurrency) // 4) for q in config.queues
        }
        self.stopping = False
        self.signals = 0
        self.claimed = 0
        self.finished = 0
        self._kinds = registered_kinds()
        self._pool = ThreadPoolExecutor(
            max_workers=max(1, config.total_concurrency), thread_name_prefix="awa-job"
        )
        self._wake: dict[str, asyncio.Event] = {}
        self._stop = asyncio.Event()
        self._flush = asyncio.Event()
        self._all_done = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None

    # -- lifecycle ---------------------------------------------------------------------------

    async def run(self) -> int:
        """Serve until stopped; return the process exit code (0 after a graceful drain)."""
        loop = self._loop = asyncio.get_running_loop()
        self._wake = {q.name: asyncio.Event() for q in self.config.queues}
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, self._on_signal, signum)
        await self._register()
        await self._check_connection_budget()
        log.info(
            "awa worker %s started: pid %s, queues %s",
            self.instance_id,
            os.getpid(),
            ", ".join(f"{q.name}={q.concurrency}" for q in self.config.queues),
        )
        batcher = loop.create_task(self.batcher.run(), name="awa-batcher")
        background = [
            loop.create_task(self._heartbeat_loop(), name="awa-heartbeat"),
            loop.create_task(self._refresh_loop(), name="awa-refresh"),
        ]
        if self.config.notify:
            background.append(loop.create_task(self._listen_loop(), name="awa-listen"))
        if self.config.burst:
            background.append(loop.create_task(self._burst_loop(), name="awa-burst"))
        if self.config.maintenance:
            maintenance = Maintenance(MaintenanceSettings.from_settings(), self.instance_id)
            background.append(loop.create_task(maintenance.run(), name="awa-maintenance"))
        dispatchers = [
            loop.create_task(self._dispatch(q), name=f"awa-dispatch-{q.name}")
            for q in self.config.queues
        ]
        await self._stop.wait()
        log.info(
            "awa worker %s stopping: %d job(s) in flight", self.instance_id, len(self.inflight)
        )
        for wake in self._wake.values():
            wake.set()
        await asyncio.gather(*dispatchers, return_exceptions=True)
        await self._drain()
        self.batcher.close()
        await batcher
        for task in background:
            task.cancel()
        await asyncio.gather(*background, return_exceptions=True)
        await self._deregister()
        for link in (self.claim_link, self.finalize_link, self.control_link):
            await link.close()
        self._pool.shutdown(wait=False, cancel_futures=True)
        log.info(
            "awa worker %s stopped: %d claimed, %d finished, %d stale",
            self.instance_id,
            self.claimed,
            self.finished,
            self.batcher.stale,
        )
        return 0

    def stop(self) -> None:
        """Begin a graceful stop (what SIGTERM does)."""
        self.stopping = True
        self._stop.set()

    def _on_signal(self, signum: int) -> None:
        self.signals += 1
        if self.signals > 1:
            log.warning(
                "awa worker %s: second signal, exiting at once with %d job(s) in flight "
                "(they will be rescued)",
                self.instance_id,
                len(self.inflight),
            )
            os._exit(128 + signum)
        log.info(
            "awa worker %s: %s received, draining (up to %.0f s)",
            self.instance_id,
            signal.Signals(signum).name,
            self.config.shutdown_timeout,
        )
        self.stop()

    async def _drain(self) -> None:
        if self.inflight:
            self._all_done.clear()
            try:
                await asyncio.wait_for(self._all_done.wait(), self.config.shutdown_timeout)
            except TimeoutError:
                log.warning(
                    "awa worker %s: %d job(s) still running after %.0f s; leaving them "
                    "to be rescued",
                    self.instance_id,
                    len(self.inflight),
                    self.config.shutdown_timeout,
                )
                for run in self.inflight.values():
                    run.attempt.ctx.cancel()

    async def _register(self) -> None:
        queues = json.dumps({q.name: q.concurrency for q in self.config.queues})

        async def upsert(conn: psycopg.AsyncConnection[Any]) -> None:
            from awa_django import __version__

            await conn.execute(
                query("runtime_upsert"),
                [
                    self.instance_id,
                    socket.gethostname(),
                    os.getpid(),
                    queues,
                    self.config.total_concurrency,
                    __version__,
                ],
            )

        await self.control_link.run(upsert, give_up=lambda: self.stopping)

    async def _check_connection_budget(self) -> None:
        """Warn when this fleet could exhaust the server's max_connections.

        Each process holds about five connections of its own, plus one Django connection per
        pool thread that runs a sync handler touching the ORM.
        """
        processes = int(os.environ.get("AWA_WORKER_PROCESSES", "1"))
        needed = processes * (5 + self.config.total_concurrency)

        async def limits(conn: psycopg.AsyncConnection[Any]) -> tuple[int, int]:
            cursor = await conn.execute(query("connection_budget"))
            row = await cursor.fetchone()
            return (int(row[0]), int(row[1])) if row else (0, 0)

        maximum, in_use = await self.control_link.run(limits, give_up=lambda: self.stopping)
        if needed > maximum - in_use:
            log.warning(
                "awa worker: %d process(es) x (%d handler threads + 5) may need %d connections, "
                "but the server allows %d and %d are in use; lower the concurrency or raise "
                "max_connections",
                processes,
                self.config.total_concurrency,
                needed,
                maximum,
                in_use,
            )

    async def _deregister(self) -> None:
        async def remove(conn: psycopg.AsyncConnection[Any]) -> None:
            await conn.execute(query("runtime_remove"), [self.instance_id])

        try:
            await self.control_link.run(remove, give_up=lambda: True)
        except CONNECTION_ERRORS:
            log.warning(
                "awa worker %s: could not remove its runtime row (the database is "
                "unreachable); it expires on its own",
                self.instance_id,
            )

    # -- dispatch and execution --------------------------------------------------------------

    async def _dispatch(self, queue: QueueConfig) -> None:
        wake = self._wake[queue.name]
        cfg = self.config
        while not self.stopping:
            free = queue.concurrency - self.running[queue.name]
            if free < self.low_water[queue.name] and self.running[queue.name] > 0:
                wake.clear()
                await wake.wait()
                continue
            want = min(free, cfg.claim_batch)
            wake.clear()  # before claiming, so a NOTIFY during the claim is not lost

            async def claim(
                conn: psycopg.AsyncConnection[Any], want: int = want
            ) -> list[ClaimedJob]:
                return await aclaim(
                    conn,
                    queue.name,
                    want,
                    self.instance_id,
                    aging_interval=cfg.aging_interval,
                    default_deadline=queue.deadline,
                )

            try:
                jobs = await self.claim_link.run(claim, give_up=lambda: self.stopping)
            except CONNECTION_ERRORS:
                return
            self.claimed += len(jobs)
            for job in jobs:
                self._start(job, queue)
            if len(jobs) < want and not self.stopping:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(wake.wait(), cfg.poll_interval)

    def _start(self, job: ClaimedJob, queue: QueueConfig) -> None:
        loop = self._loop
        assert loop is not None
        ctx = JobContext.for_job(job, runtime=self)
        attempt = prepare(job, ctx, self._kinds)
        run = Running(attempt, queue, loop.time())
        self.inflight[(job.job_id, job.run_lease)] = run
        self.running[queue.name] += 1
        if log.isEnabledFor(logging.DEBUG):
            log.debug("job %s %s attempt %s started", job.job_id, job.kind, job.attempt)
        if attempt.failure is not None:
            self._finish(run, None, None)
            return
        if job.timeout_secs is not None:
            # Past the hard deadline the handler is told to stop; rescue closes the attempt.
            run.timer = loop.call_later(job.timeout_secs, ctx.cancel)
        handle = attempt.handle
        assert handle is not None
        if handle.is_async:
            run.task = loop.create_task(self._run_async(run))
        else:
            future = loop.run_in_executor(self._pool, _run_sync, attempt)
            future.add_done_callback(functools.partial(self._sync_done, run))
            run.task = future

    async def _run_async(self, run: Running) -> None:
        attempt = run.attempt
        assert attempt.handle is not None
        try:
            value = await attempt.handle.func(*attempt.call_args(), **attempt.kwargs)
        except Exception as exc:
            self._finish(run, None, exc)
        else:
            self._finish(run, value, None)

    def _sync_done(self, run: Running, future: asyncio.Future[Any]) -> None:
        if future.cancelled():
            return
        value, exc = future.result()
        self._finish(run, value, exc)

    def _finish(self, run: Running, value: Any, exc: BaseException | None) -> None:
        attempt = run.attempt
        job = attempt.job
        ctx = attempt.ctx
        if run.timer is not None:
            run.timer.cancel()
        outcome = outcome_of(
            attempt,
            value=value,
            exc=exc,
            result_max_bytes=self.config.result_max_bytes,
            max_depth=self.config.json_max_depth,
            has_state=run.has_state,
            progress=ctx.progress if ctx.progress_set else None,
            backoff_base=self.config.backoff_base,
        )
        self.batcher.add(outcome)
        del self.inflight[(job.job_id, job.run_lease)]
        self.finished += 1
        name = run.queue.name
        self.running[name] -= 1
        if run.queue.concurrency - self.running[name] >= self.low_water[name] or self.stopping:
            self._wake[name].set()
        if not self.inflight:
            self._all_done.set()
        self._log_outcome(run, outcome)

    def _log_outcome(self, run: Running, outcome: Finalization) -> None:
        job = run.attempt.job
        assert self._loop is not None
        elapsed = (self._loop.time() - run.started) * 1000
        if outcome.outcome == "completed":
            if log.isEnabledFor(logging.DEBUG):
                log.debug(
                    "job %s %s attempt %s completed in %.1f ms",
                    job.job_id,
                    job.kind,
                    job.attempt,
                    elapsed,
                )
            return
        error = outcome.error or {}
        level = logging.INFO if outcome.outcome in ("retry", "snooze", "wait") else logging.WARNING
        log.log(
            level,
            "job %s %s attempt %s %s after %.1f ms: %s: %s",
            job.job_id,
            job.kind,
            job.attempt,
            outcome.outcome,
            elapsed,
            error.get("type", "-"),
            error.get("message", ""),
        )

    # -- heartbeats, wake-ups, runtime row ---------------------------------------------------

    def request_flush(self) -> None:
        """Write progress now (``JobContext.flush_progress``); thread-safe."""
        loop = self._loop
        if loop is not None:
            loop.call_soon_threadsafe(self._flush.set)

    async def _heartbeat_loop(self) -> None:
        interval = self.config.heartbeat_interval
        loop = asyncio.get_running_loop()
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._flush.wait(), interval)
            self._flush.clear()
            now = loop.time()
            items: list[tuple[int, int, Any]] = []
            for (job_id, lease), run in list(self.inflight.items()):
                dirty, progress = run.attempt.ctx.take_dirty_progress()
                # Short jobs never write attempt_state: only attempts running for a heartbeat
                # interval, or with progress to write, are refreshed.
                if dirty or now - run.started >= interval:
                    run.has_state = True
                    items.append((job_id, lease, progress if dirty else None))
            if not items:
                continue

            async def beat(
                conn: psycopg.AsyncConnection[Any], items: list[tuple[int, int, Any]] = items
            ) -> list[tuple[int, int]]:
                return await aheartbeat(conn, items)

            for key in await self.control_link.run(beat):
                gone = self.inflight.get(key)
                if gone is not None:
                    log.info(
                        "job %s attempt lease %s is no longer open (rescued or cancelled); "
                        "its handler is told to stop",
                        key[0],
                        key[1],
                    )
                    gone.attempt.ctx.cancel()

    async def _refresh_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.runtime_refresh)
            await self._register()

    async def _listen_loop(self) -> None:
        delay = 0.05
        listen = Link(self.config.alias, "listen", str(self.instance_id))
        while True:
            try:
                conn = await listen.connection()
                await conn.execute(query("listen_jobs"))
                await conn.execute(query("listen_cancel"))
                delay = 0.05
                for wake in self._wake.values():
                    wake.set()  # catch up on anything missed while disconnected
                async for note in conn.notifies():
                    if note.channel == "awa_jobs":
                        target = self._wake.get(note.payload)
                        if target is not None:
                            target.set()
                    elif note.channel == "awa_cancel":
                        self._on_cancel_note(note.payload)
            except CONNECTION_ERRORS as exc:
                await listen.discard()
                log.warning(
                    "awa worker: listen connection lost (%s); reconnecting in %.2f s",
                    type(exc).__name__,
                    delay,
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
            except asyncio.CancelledError:
                await listen.close()
                raise

    def _on_cancel_note(self, payload: str) -> None:
        try:
            data = json.loads(payload)
            key = (int(data["id"]), int(data["lease"]))
        except (ValueError, KeyError, TypeError):
            return
        run = self.inflight.get(key)
        if run is not None:
            run.attempt.ctx.cancel()

    async def _burst_loop(self) -> None:
        names = [q.name for q in self.config.queues]

        async def idle(conn: psycopg.AsyncConnection[Any]) -> bool:
            cursor = await conn.execute(query("queues_idle"), [names])
            row = await cursor.fetchone()
            return bool(row and row[0])

        while not self.stopping:
            await asyncio.sleep(self.config.poll_interval)
            if self.inflight or self.batcher.pending:
                continue
            if await self.control_link.run(idle):
                log.info("awa worker %s: burst mode, nothing left to do", self.instance_id)
                self.stop()


def _run_sync(attempt: PreparedAttempt) -> tuple[Any, BaseException | None]:
    """Run a sync handler in a pool thread, with fresh Django connections around it."""
    assert attempt.handle is not None
    close_old_connections()
    try:
        return attempt.handle.func(*attempt.call_args(), **attempt.kwargs), None
    except Exception as exc:
        return None, exc
    finally:
        close_old_connections()
