"""The in-flight attempts of a worker process: start them, end each with an outcome whatever its
handler does, and give up on a handler that will not stop.

``Attempts`` is the part of ``WorkerRuntime`` (awa_django/worker/runtime.py) that owns the
in-flight attempts: it starts async handlers as tasks and sync ones on daemon threads, turns
whatever they return or raise (``BaseException`` included) into exactly one outcome for the
completion batcher, frees the slot once, and abandons a handler still running
``ABANDON_AFTER`` seconds after it was told to stop (docs/worker.md, "Faults").
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import logging
import threading
import types
import uuid
from collections.abc import Callable, Coroutine, Generator
from typing import Any

import psycopg
from django.db import close_old_connections, connections

from awa_django.context import JobContext, Runtime
from awa_django.db.links import Link, first_line
from awa_django.db.storage import ClaimedJob, Finalization
from awa_django.db.transactions import release_thread_connections
from awa_django.exceptions import TransactionLeftOpen
from awa_django.jobs import registered_kinds
from awa_django.sql import query
from awa_django.telemetry.logs import job_fields, job_log_fields, one_line, set_current_job
from awa_django.telemetry.metrics import Metrics
from awa_django.telemetry.tracing import Tracing, attach_span, detach_span
from awa_django.worker.async_orm import AsyncOrmConnections
from awa_django.worker.batcher import CompletionBatcher
from awa_django.worker.config import QueueConfig, WorkerConfig
from awa_django.worker.finalizations import error_info, outcome_of, refused, safe_str
from awa_django.worker.flow import Permits
from awa_django.worker.outcome_log import log_ended
from awa_django.worker.prepared import PreparedAttempt, prepare
from awa_django.worker.slots import Slots
from awa_django.worker.threads import HandlerThreads

__all__ = ["EXIT_STUCK_HANDLERS", "Attempts", "Running", "run_sync"]

log = logging.getLogger("awa_django.worker")

#: Too many handlers ignored being told to stop (EX_TEMPFAIL): restart the process.
EXIT_STUCK_HANDLERS = 75

_REGISTER_TIMEOUT = 30.0


class Running:
    """Book-keeping of one in-flight attempt."""

    __slots__ = (
        "abandoned",
        "attempt",
        "began",
        "cancel_sent",
        "done",
        "exc",
        "gone",
        "has_state",
        "queue",
        "span",
        "started",
        "stop_timer",
        "task",
        "thread",
        "timer",
        "value",
    )

    def __init__(self, attempt: PreparedAttempt, queue: QueueConfig, started: float) -> None:
        self.attempt = attempt
        self.queue = queue
        self.started = started
        self.has_state = False
        self.began = False  # an async handler's first step ran
        self.done = False
        self.abandoned = False
        self.cancel_sent = False
        # A heartbeat found the attempt closed elsewhere (rescued, cancelled): no more beats.
        self.gone = False
        # A strong reference: the event loop keeps only weak ones to running tasks.
        self.task: asyncio.Future[Any] | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.stop_timer: asyncio.TimerHandle | None = None
        # A sync handler's thread, and what its handler returned or raised.
        self.thread: threading.Thread | None = None
        self.value: Any = None
        self.exc: BaseException | None = None
        # The attempt's OpenTelemetry span, when traces are on.
        self.span: Any = None


class Attempts:
    """The in-flight attempts of a worker process (a part of ``WorkerRuntime``).

    ``runtime`` is what each attempt's ``JobContext`` knows of its worker (its id, and
    ``request_flush``). ``permits_returned(queue)`` is called when an attempt that held flow
    permits or a serial key ends; ``stopping()`` tells whether a graceful stop has begun;
    ``restart(code)`` drains the process and makes it exit with ``code`` (too many stuck
    handlers). ``bind`` (on the event loop) must be called before ``start_batch``.
    """

    def __init__(
        self,
        config: WorkerConfig,
        *,
        instance_id: uuid.UUID,
        runtime: Runtime,
        slots: Slots,
        permits: Permits,
        batcher: CompletionBatcher,
        control_link: Link,
        metrics: Metrics | None,
        tracing: Tracing | None,
        permits_returned: Callable[[str], None],
        stopping: Callable[[], bool],
        restart: Callable[[int], None],
    ) -> None:
        self.config = config
        self.instance_id = instance_id
        self.slots = slots
        self.permits = permits
        self.batcher = batcher
        self.control_link = control_link
        self.inflight: dict[tuple[int, int], Running] = {}
        self.abandoned: list[Running] = []
        self.abandoned_total = 0
        self.finished = 0
        #: The job kinds this process runs, by kind (the registry when the worker started).
        self.kinds = registered_kinds()
        self.pool: HandlerThreads[Running] = HandlerThreads(config.concurrency, run_sync)
        #: The Django connections async handlers use (through ``sync_to_async``).
        self.async_orm = AsyncOrmConnections()
        self._runtime = runtime
        self._metrics = metrics
        self._tracing = tracing
        self._permits_returned = permits_returned
        self._stopping = stopping
        self._restart = restart
        self._tasks: set[asyncio.Task[None]] = set()
        self._debug = log.isEnabledFor(logging.DEBUG)
        self._all_done = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """Run on ``loop`` (call from it): handlers' tasks, timers and sync handlers' ends."""
        self._loop = loop
        self._loop_thread = threading.get_ident()
        self.pool.bind(loop, self._sync_done)
        self._debug = log.isEnabledFor(logging.DEBUG)

    def left_running(self) -> bool:
        """Whether handlers are still running (in flight, or abandoned and not ended)."""
        return bool(self.inflight) or any(not r.done for r in self.abandoned)

    def close(self) -> None:
        """Shut the handler thread pool down: it takes no more work and drops what has not
        started; its threads are daemons, so a stuck handler never keeps the process alive."""
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.async_orm.stop()

    async def drain(self) -> None:
        """Wait for the in-flight attempts to end, for up to ``SHUTDOWN_TIMEOUT``; then tell the
        handlers still running to stop, and leave their attempts to be rescued."""
        if self.inflight:
            self._all_done.clear()
            try:
                await asyncio.wait_for(self._all_done.wait(), self.config.settings.SHUTDOWN_TIMEOUT)
            except TimeoutError:
                log.warning(
                    "awa worker %s: %d job(s) still running after %.0f s; leaving them "
                    "to be rescued",
                    self.instance_id,
                    len(self.inflight),
                    self.config.settings.SHUTDOWN_TIMEOUT,
                )
                for run in self.inflight.values():
                    run.attempt.ctx.cancel()

    def start_batch(self, jobs: list[ClaimedJob], queue: QueueConfig) -> None:
        """Start the attempts of one claim: their sync handlers go to the pool together, their
        async handlers to one task (``_run_async_batch``)."""
        sync: list[Running] = []
        aio: list[Running] = []
        for job in jobs:
            self._start(job, queue, sync, aio)
        if aio:
            self._spawn_async(aio, 0)
        if not sync:
            return
        try:
            self.pool.submit_many(sync)
        except BaseException as exc:
            for run in sync:
                self._finish(run, None, exc)

    def _make_ctx(self, job: ClaimedJob) -> JobContext:
        return JobContext.for_job(
            job,
            runtime=self._runtime,
            registrar=self._register_sync,
            aregistrar=self._register_async,
        )

    def _start(
        self, job: ClaimedJob, queue: QueueConfig, sync: list[Running], aio: list[Running]
    ) -> None:
        """Start one claimed attempt (a sync one is appended to ``sync``, for the pool, an async
        one to ``aio``); whatever goes wrong, it ends with an outcome."""
        loop = self._loop
        assert loop is not None
        try:
            attempt = prepare(job, None, self.kinds, make_ctx=self._make_ctx)
        except Exception as exc:
            attempt = PreparedAttempt(job, make_ctx=self._make_ctx)
            attempt.failure = refused(
                "awa_django.InvalidJob", f"job {job.job_id} could not be prepared: {safe_str(exc)}"
            )
        run = Running(attempt, queue, loop.time())
        if self._tracing is not None:
            with contextlib.suppress(Exception):  # a broken tracer must not lose the job
                run.span = self._tracing.start(job)
        self.inflight[(job.job_id, job.run_lease)] = run
        self.slots.start(queue.name, job.weight)
        if job.permits or job.serial_lock is not None:
            self.permits.hold(
                job.permits, f"job {job.job_id} (lease {job.run_lease})", job.serial_lock
            )
        if self._debug:
            log.debug(
                "job %s %s attempt %s started",
                job.job_id,
                one_line(job.kind),
                job.attempt,
                extra=job_log_fields(job),
            )
        if attempt.failure is not None:
            self._finish(run, None, None)
            return
        try:
            if job.timeout_secs is not None:
                # Past the hard deadline the handler is told to stop; rescue closes the attempt.
                run.timer = loop.call_later(
                    job.timeout_secs, self.tell_stop, run, "past its hard deadline"
                )
            handle = attempt.handle
            assert handle is not None
            if handle.takes_context:
                # Built here, on the event loop, before any thread can read it: only one
                # context per attempt (a stop and a pool thread must never build two).
                attempt.ctx  # noqa: B018
            if handle.is_async:
                aio.append(run)
            else:
                sync.append(run)
        except BaseException as exc:
            self._finish(run, None, exc)

    def _spawn_async(self, runs: list[Running], start: int) -> None:
        """Run ``runs[start:]`` in a new task (``_run_async_batch``)."""
        loop = self._loop
        assert loop is not None
        try:
            task = loop.create_task(self._run_async_batch(runs, start))
        except BaseException as exc:  # the loop is closing
            for run in runs[start:]:
                self._finish(run, None, exc)
            return
        # A strong reference (the event loop keeps only weak ones to running tasks).
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run_async_batch(self, runs: list[Running], start: int) -> None:
        """Run the async handlers ``runs[start:]`` in this one task, without a task per job.

        Each handler's first step runs here, in a context of its own (as a task of its own
        would), one after the other. A handler that returns or raises in its first step (one
        that awaits nothing that suspends: no-op and CPU-only handlers) is done without a task
        of its own. The first one that suspends keeps this task for the rest of its run, so it
        is always the current task of its handler from start to end (``asyncio.timeout``,
        task groups and cancellation see one task), and the jobs after it go to a new task
        at once. A handler that cancels its own task in its first step and returns: the jobs
        after it go to a new task too, so the cancellation reaches none of them.
        """
        task = asyncio.current_task()
        assert task is not None
        cancelling = task.cancelling()
        count = len(runs)
        for index in range(start, count):
            run = runs[index]
            if run.done:
                continue
            if run.abandoned:
                # Abandoned before its handler started: it never runs.
                run.cancel_sent = True
                self._finish(run, None, asyncio.CancelledError("abandoned before it started"))
                continue
            run.task = task
            run.began = True
            attempt = run.attempt
            handle = attempt.handle
            assert handle is not None
            set_current_job(attempt.job)  # copied into its context: JobFieldsFilter reads it
            context = contextvars.copy_context()
            if run.span is not None:
                context.run(attach_span, run.span)  # its own context: no detach needed
            try:
                coro = handle.func(*attempt.call_args(), **attempt.kwargs)
                step = context.run(coro.send, None)
            except StopIteration as stop:
                self._finish(run, stop.value, None)
                if task.cancelling() != cancelling and index + 1 < count:
                    self._spawn_async(runs, index + 1)
                    return
                continue
            except BaseException as exc:  # CancelledError and SystemExit included: it fails
                self._finish(run, None, exc)
                if task.cancelling() != cancelling and index + 1 < count:
                    self._spawn_async(runs, index + 1)
                    return
                continue
            # It suspended: this task is its own from here on; the rest go to a new one.
            if index + 1 < count:
                self._spawn_async(runs, index + 1)
            try:
                value = await _resume(coro, context, step)
            except BaseException as exc:
                self._finish(run, None, exc)
            else:
                self._finish(run, value, None)
            return

    def _sync_done(self, run: Running) -> None:
        """A sync handler ended (the pool delivers it on the event loop)."""
        self._finish(run, run.value, run.exc)

    def _finish(self, run: Running, value: Any, exc: BaseException | None) -> None:
        """Record a handler's end: never raises, always frees the slot (once)."""
        if run.done:
            return
        run.done = True
        ended = run.attempt.job
        if self.permits.give_back(ended.permits, ended.serial_lock):
            self._permits_returned(run.queue.name)
        for timer in (run.timer, run.stop_timer):
            if timer is not None:
                timer.cancel()
        attempt = run.attempt
        job = attempt.job
        ctx = attempt.ctx_made
        if run.abandoned and run.cancel_sent and isinstance(exc, asyncio.CancelledError):
            # The cancellation this runtime sent to an abandoned task: the attempt is the
            # database's to close (rescue or cancel), with the real reason.
            return
        try:
            outcome = outcome_of(
                attempt,
                value=value,
                exc=exc,
                result_max_bytes=self.config.settings.RESULT_MAX_BYTES,
                max_depth=self.config.settings.JSON_MAX_DEPTH,
                has_state=run.has_state,
                progress_json=ctx.progress_json if ctx is not None and ctx.progress_set else None,
                backoff_base=self.config.settings.RETRY_BACKOFF_BASE,
            )
        except BaseException as error:  # pragma: no cover - outcome_of does not raise
            outcome = Finalization(
                job.job_id, job.run_lease, job.claim_slot, "fail", error=error_info(error)
            )
        assert self._loop is not None
        ran = self._loop.time() - run.started
        self.batcher.add(outcome, job, ran)
        self.finished += 1
        if self._metrics is not None and self._loop is not None:
            now = self._loop.time()
            self._metrics.handler_done(job, now - run.started, now)
        if run.span is not None and self._tracing is not None:
            self._tracing.end(run.span, outcome, exc)
        if not run.abandoned:
            self._release(run)
        if run.thread is None:  # an async handler: its ORM connections, as after a request
            self.async_orm.job_ended()
        try:
            log_ended(job, outcome, ran, debug=self._debug)
        except Exception:  # pragma: no cover - logging must not break the loop
            log.exception(
                "awa worker: could not log the outcome of job %s",
                job.job_id,
                extra=job_log_fields(job),
            )

    def _release(self, run: Running) -> None:
        """Free a run's slot and wake its dispatcher."""
        job = run.attempt.job
        self.inflight.pop((job.job_id, job.run_lease), None)
        self.slots.release(run.queue.name, job.weight)
        if not self.inflight:
            self._all_done.set()

    # -- cancel notes (NOTIFY awa_cancel) -------------------------------------------------------

    def on_cancel_note(self, payload: str) -> None:
        """A note on ``awa_cancel``: tell the attempt's handler to stop once the database
        confirms its attempt was closed."""
        try:
            data = json.loads(payload)
            key = (int(data["id"]), int(data["lease"]))
        except Exception:  # not ours, or garbled: NOTIFY payloads are anyone's to send
            return
        if key in self.inflight and self._loop is not None and not self._loop.is_closed():
            # Any session may NOTIFY: the handler is told to stop only once the database says
            # its attempt was closed (cancelled or rescued), never on a note alone.
            task = self._loop.create_task(self._confirm_cancel(key))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _confirm_cancel(self, key: tuple[int, int]) -> None:
        async def still_open(conn: psycopg.AsyncConnection[Any]) -> bool:
            cursor = await conn.execute(query("attempt_open"), list(key))
            row = await cursor.fetchone()
            return bool(row and row[0])

        try:
            open_now = await self.control_link.run(still_open)
        except Exception as exc:  # the next heartbeat finds a closed attempt anyway
            log.warning(
                "awa worker: could not check a cancel note for job %s lease %s (%s); the next "
                "heartbeat will",
                key[0],
                key[1],
                first_line(exc),
            )
            return
        run = self.inflight.get(key)
        if run is None:
            return
        if open_now:
            log.warning(
                "awa worker: ignored a cancel note for job %s attempt lease %s, whose attempt "
                "is still open (a NOTIFY on awa_cancel not sent by awa_django)",
                key[0],
                key[1],
                extra=job_log_fields(run.attempt.job),
            )
            return
        self.tell_stop(run, "cancelled or rescued")

    def tell_stop(self, run: Running, why: str) -> None:
        """Tell a handler to stop (``is_cancelled()``); abandon it if it still runs after
        ``ABANDON_AFTER``."""
        if run.done or run.abandoned:
            return
        run.attempt.ctx.cancel()
        loop = self._loop
        if run.stop_timer is None and loop is not None:
            run.stop_timer = loop.call_later(
                self.config.settings.ABANDON_AFTER, self._abandon, run, why
            )

    def _abandon(self, run: Running, why: str) -> None:
        if run.done or run.abandoned:
            return
        run.abandoned = True
        self._release(run)
        self.abandoned.append(run)
        job = run.attempt.job
        log.warning(
            "awa worker: job %s %s attempt %s (lease %s) abandoned: its handler still runs "
            "%.1f s after it was told to stop (%s); its slot is freed and the attempt is left "
            "to rescue or cancel",
            job.job_id,
            job.kind,
            job.attempt,
            job.run_lease,
            self.config.settings.ABANDON_AFTER,
            why,
            extra=job_log_fields(job),
        )
        self.abandoned_total += 1
        handle = run.attempt.handle
        if handle is not None and handle.is_async:
            if not run.began:
                # Still waiting in its batch task behind other handlers' first steps: it never
                # runs (cancelling that task would reach the others).
                run.cancel_sent = True
                self._finish(run, None, asyncio.CancelledError("abandoned before it started"))
            elif run.task is not None and not run.task.done():
                run.cancel_sent = True
                run.task.cancel()  # the handler gets CancelledError
        elif run.thread is None and self.pool.cancel(run):
            run.cancel_sent = True  # it was still queued: it never runs
            self._finish(run, None, asyncio.CancelledError("abandoned before it started"))
        elif run.thread is not None:
            # Its thread stops counting against the pool; what the handler returns when it
            # ends is still written through the fenced path.
            self.pool.retire(run.thread)
        self.abandoned = [r for r in self.abandoned if not r.done]
        stuck = len(self.abandoned)
        if stuck > max(1, self.config.concurrency) and not self._stopping():
            log.error(
                "awa worker %s: %d handler(s) are stuck after being told to stop; draining and "
                "exiting with status %d so that the process is restarted",
                self.instance_id,
                stuck,
                EXIT_STUCK_HANDLERS,
            )
            self._restart(EXIT_STUCK_HANDLERS)

    # -- callbacks ---------------------------------------------------------------------------

    def _register_sync(self, ctx: JobContext, callback_id: uuid.UUID) -> None:
        """Register a callback id from a sync handler's thread (blocks on the event loop)."""
        loop = self._loop
        assert loop is not None
        if threading.get_ident() == self._loop_thread:
            raise RuntimeError(
                "ctx.callback_id cannot be read before `await ctx.aregister_callback()` in an "
                "async handler (registering it would block the event loop)"
            )
        asyncio.run_coroutine_threadsafe(self._register_async(ctx, callback_id), loop).result()

    async def _register_async(self, ctx: JobContext, callback_id: uuid.UUID) -> None:
        loop = asyncio.get_running_loop()
        run = self.inflight.get((ctx.id, ctx.run_lease))
        if run is not None:
            run.has_state = True  # its attempt_state row goes when the attempt ends
        deadline = loop.time() + _REGISTER_TIMEOUT

        async def register(conn: psycopg.AsyncConnection[Any]) -> bool:
            cursor = await conn.execute(
                query("callback_register"), [ctx.id, ctx.run_lease, callback_id]
            )
            row = await cursor.fetchone()
            return bool(row and row[0])

        if not await self.control_link.run(register, give_up=lambda: loop.time() > deadline):
            log.info(
                "job %s attempt lease %s is no longer open; its callback was not registered",
                ctx.id,
                ctx.run_lease,
                extra=job_fields(
                    ctx.id,
                    kind=ctx.kind,
                    queue=ctx.queue,
                    attempt=ctx.attempt,
                    run_lease=ctx.run_lease,
                ),
            )
            ctx.cancel()


#: Per pool thread: ``orm``, whether it had Django connections after its last job.
_thread_state = threading.local()


@types.coroutine
def _resume(
    coro: Coroutine[Any, Any, Any], context: contextvars.Context, step: Any
) -> Generator[Any, Any, Any]:
    """Carry on running ``coro``, whose first step (run in ``context``) yielded ``step``, in
    the current task: what the task sends or throws in goes on to ``coro``, every step in
    ``context``, as if ``coro`` had been the task's own coroutine from the start."""
    while True:
        try:
            sent = yield step
        except GeneratorExit:
            coro.close()
            raise
        except BaseException as exc:  # the task's cancellation, say
            try:
                step = context.run(coro.throw, exc)
            except StopIteration as stop:
                return stop.value
        else:
            try:
                step = context.run(coro.send, sent)
            except StopIteration as stop:
                return stop.value


def run_sync(run: Running) -> None:
    """Run a sync handler on a pool thread; what it returns or raises (``BaseException``
    included) goes to ``run.value`` / ``run.exc``, never raised.

    When the thread has Django connections (a handler used the ORM), the ones past
    ``CONN_MAX_AGE`` or broken are closed before and after the handler, as around a request; a
    transaction the handler leaves open is rolled back and its connection replaced, and the job
    fails with ``TransactionLeftOpen`` (its writes never happened). A thread whose handlers never
    touch the ORM has none, and pays one look-up per job: the one after the handler (the look-up
    before it is skipped when the thread had none after its previous job, since nothing else runs
    on a pool thread between two jobs; ~1.7 µs each).
    """
    run.thread = threading.current_thread()
    if run.abandoned:
        # Abandoned while the thread was taking it from the queue: it never runs.
        run.cancel_sent = True
        run.exc = asyncio.CancelledError("abandoned before it started")
        return
    attempt = run.attempt
    assert attempt.handle is not None
    value: Any = None
    error: BaseException | None = None
    try:
        if getattr(_thread_state, "orm", True) and connections.all(initialized_only=True):
            close_old_connections()
        set_current_job(attempt.job)  # the job fields of its log records (JobFieldsFilter)
        token = None if run.span is None else attach_span(run.span)
        try:
            value = attempt.handle.func(*attempt.call_args(), **attempt.kwargs)
        finally:
            if token is not None:
                detach_span(token)
    except BaseException as exc:
        error = exc
    set_current_job(None)
    leaked: list[str] = []
    orm = True
    try:
        if connections.all(initialized_only=True):
            leaked = release_thread_connections()
            close_old_connections()
        else:
            orm = False
    except BaseException:
        log.exception(
            "awa worker: closing the ORM connections after job %s failed",
            attempt.job.job_id,
            extra=job_log_fields(attempt.job),
        )
    if leaked:
        if error is None:
            error = TransactionLeftOpen(
                f"the handler left a transaction open on database(s) {', '.join(leaked)}; it "
                "was rolled back (exit every transaction.atomic() block it enters)"
            )
        with contextlib.suppress(Exception):  # a broken log handler must not lose the outcome
            log.warning(
                "awa worker: job %s left a transaction open on %s; rolled back and reconnected",
                attempt.job.job_id,
                ", ".join(leaked),
                extra=job_log_fields(attempt.job),
            )
    _thread_state.orm = orm
    run.value = value
    run.exc = error
