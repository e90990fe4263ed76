"""Worker side of the django.tasks backend: resolve a stored task safely, run it, report it.

A job written by ``AwaTaskBackend`` stores the task's ``module_path`` as its kind and a task
document beside its arguments: the backend alias and the options it was enqueued with
(awa_django/backends/stored.py). The worker runs it only when the path names, in a module of an
installed app (or of ``AWA["JOB_MODULES"]``), a ``Task`` object (of ``django.tasks`` or
``django_tasks``) whose ``module_path`` is that path, and the stored alias names an
``AwaTaskBackend``. The task then runs as it was enqueued: the module-level task with the stored
backend, priority, queue and ``run_after`` applied again, as ``task.using(...)`` had them.
Anything else (``subprocess.check_output``, a plain function, an alias of another backend or of
none) is refused without being called; modules outside the installed apps are never imported.

Each attempt sends ``task_started`` and then ``task_finished`` with the status the attempt
leaves the task in (``SUCCESSFUL``, ``FAILED``, or ``READY`` when it will run again), carrying
the attempt's error as Django's reference backends do. An attempt that was told to stop
(cancelled, rescued, past its deadline, or still running when the worker's shutdown timed out)
sends no ``task_finished``: the database decides its outcome.
"""

from __future__ import annotations

import contextlib
import contextvars
import inspect
import json
import logging
from typing import Any

from asgiref.sync import sync_to_async
from django.db import DatabaseError, connections
from django.utils import timezone

from awa_django import serialization
from awa_django.backends.compat import (
    TaskContext,
    TaskResult,
    TaskResultStatus,
    signals,
)
from awa_django.backends.errors import exception_error, task_errors
from awa_django.backends.stored import (
    UNKNOWN_WORKER,
    StoredTask,
    attempt_worker_ids,
    plain_json,
    read_document,
    recorded_worker_ids,
    wrap_result,
)
from awa_django.backends.tasks import resolve_stored
from awa_django.conf import get_awa_settings
from awa_django.context import JobContext
from awa_django.db.transactions import (
    OpenTransaction,
    mark_open_transactions,
    release_thread_connections,
)
from awa_django.exceptions import (
    InvalidArgumentsError,
    InvalidResultError,
    JobValidationError,
    TransactionLeftOpen,
)
from awa_django.jobs import Job, JobOptions
from awa_django.middleware import JobCall, task_chain
from awa_django.outcomes import Cancel, RetryAfter, Snooze, WaitForCallback
from awa_django.retry import fails_at_once
from awa_django.sql import query

__all__ = ["task_handle"]

log = logging.getLogger("awa_django.worker")

_OUTCOMES = (RetryAfter, Snooze, Cancel, WaitForCallback)
_MAX_HANDLES = 512
_handles: dict[tuple[str, StoredTask], Job[Any, Any]] = {}


def task_handle(path: str, document: object) -> Job[Any, Any] | None:
    """A ``Job`` the worker can run for the task stored as ``path`` with task document
    ``document``, or None to refuse it (see the module docstring)."""
    stored = read_document(document)
    if stored is None:
        return None
    key = (path, stored)
    handle = _handles.get(key)
    if handle is None:
        task = resolve_stored(path, stored)
        if task is None:
            return None
        if len(_handles) >= _MAX_HANDLES:
            _handles.clear()
        handle = _handles[key] = Job(_runner(task), path, JobOptions(), takes_context=True)
    return handle


def _json(value: Any) -> Any:
    # Django's psycopg adapters hand jsonb back as text.
    return json.loads(value) if isinstance(value, str) else value


class _Attempt:
    """One attempt of a task in the worker: its ``TaskResult``, signals and stored value."""

    __slots__ = ("ctx", "result", "sender", "task")

    ctx: JobContext
    result: TaskResult[Any]
    sender: type[Any]
    task: Any

    def __init__(
        self, task: Any, ctx: JobContext, args: tuple[object, ...], kwargs: dict[str, object]
    ):
        backend = task.get_backend()
        self.task = task
        self.ctx = ctx
        self.sender = type(backend)
        enqueued_at = claimed_at = errors = claims = None
        try:
            # The worker's own database, where it claimed the attempt.
            with connections[get_awa_settings().DATABASE_ALIAS].cursor() as cursor:
                cursor.execute(query("task_attempt"), [ctx.id, ctx.run_lease])
                row = cursor.fetchone()
            if row is not None:
                enqueued_at, errors, claimed_at, claims = row
        except DatabaseError:
            log.warning(
                "awa worker: could not read task %s for its TaskResult; running it anyway",
                ctx.id,
                exc_info=True,
            )
        # Every attempt records the workers of all attempts so far (stored.py).
        previous = attempt_worker_ids(
            ctx.attempt - 1, _json(claims), recorded_worker_ids(ctx.progress)
        )
        worker_ids = [*previous, ctx.worker_id or UNKNOWN_WORKER]
        ctx.set_progress(None, worker_ids=worker_ids)
        self.result = TaskResult(
            task=task,
            id=str(ctx.id),
            status=TaskResultStatus.RUNNING,
            enqueued_at=enqueued_at,
            started_at=claimed_at,
            finished_at=None,
            last_attempted_at=claimed_at,
            args=list(args),
            kwargs=dict(kwargs),
            backend=task.backend,
            errors=task_errors(_json(errors)),
            worker_ids=worker_ids,
        )

    def start(self) -> None:
        signals.task_started.send(self.sender, task_result=self.result)

    def call_args(self, args: tuple[object, ...]) -> tuple[object, ...]:
        return (TaskContext(task_result=self.result), *args) if self.task.takes_context else args

    def stored(self, value: object) -> object:
        """What the worker stores for ``value``: an outcome as it is, anything else normalised
        and wrapped with the worker ids. Raises ``InvalidResultError`` when it cannot be."""
        if isinstance(value, _OUTCOMES):
            return value
        cfg = get_awa_settings()
        limits = {"max_bytes": cfg.RESULT_MAX_BYTES, "max_depth": cfg.JSON_MAX_DEPTH}
        ids = self.result.worker_ids
        plain = value
        try:
            try:
                serialization.dumps(wrap_result(value, ids), "result", **limits)
            except InvalidArgumentsError as refused:
                try:
                    plain = plain_json(value)
                except (TypeError, ValueError) as exc:
                    raise InvalidResultError(
                        f"the task's return value cannot be stored: {refused}"
                    ) from exc
                serialization.dumps(wrap_result(plain, ids), "result", **limits)
        except JobValidationError as exc:
            raise InvalidResultError(f"the task's return value cannot be stored: {exc}") from exc
        object.__setattr__(self.result, "_return_value", plain)
        return wrap_result(plain, ids)

    def finish(self, value: object, exc: BaseException | None) -> None:
        """Send ``task_finished`` with the status this attempt leaves the task in."""
        ctx = self.ctx
        if ctx.is_cancelled():
            return  # told to stop: rescue, cancel or the database's own record decides
        result = self.result
        status = _status_after(ctx, value, exc)
        if exc is not None:
            result.errors.append(exception_error(exc))
        object.__setattr__(result, "status", status)
        if status in (TaskResultStatus.SUCCESSFUL, TaskResultStatus.FAILED):
            object.__setattr__(result, "finished_at", timezone.now())
        # Robust: a receiver that raises must not turn the outcome just announced into another.
        for receiver, response in signals.task_finished.send_robust(
            self.sender, task_result=result
        ):
            if isinstance(response, Exception):
                log.error(
                    "awa worker: task_finished receiver %r failed for task %s",
                    receiver,
                    result.id,
                    exc_info=response,
                )


def _status_after(ctx: JobContext, value: object, exc: BaseException | None) -> TaskResultStatus:
    """The status an attempt leaves its task in (the executor's rules, docs/jobs.md)."""
    attempts_left = ctx.attempt < ctx.max_attempts
    if exc is not None:
        if fails_at_once(ctx.metadata, exc) or not attempts_left:
            return TaskResultStatus.FAILED
        return TaskResultStatus.READY
    if isinstance(value, Snooze) or (isinstance(value, RetryAfter) and attempts_left):
        return TaskResultStatus.READY
    if isinstance(value, RetryAfter | Cancel | WaitForCallback):
        # A task cannot wait for a callback (it has no ctx.callback_id): the executor fails it.
        return TaskResultStatus.FAILED
    return TaskResultStatus.SUCCESSFUL


def _release_connections(job_id: int, kept: dict[str, OpenTransaction]) -> None:
    """Roll back a transaction the task left open (as the executor would), before the
    ``task_finished`` receivers run; raise ``TransactionLeftOpen`` when there was one.

    ``kept``: the transactions that were open before the task ran (a test's, under
    ``awa_django.testing.drain()``); they stay open, only what the task left open in them is
    rolled back."""
    try:
        leaked = release_thread_connections(kept)
    except Exception:
        log.exception("awa worker: closing the ORM connections after task %s failed", job_id)
        return
    if leaked:
        log.warning(
            "awa worker: job %s left a transaction open on %s; rolled back and reconnected",
            job_id,
            ", ".join(leaked),
        )
        raise TransactionLeftOpen(
            f"the handler left a transaction open on database(s) {', '.join(leaked)}; it "
            "was rolled back (exit every transaction.atomic() block it enters)"
        )


#: The attempt whose task function the middleware chain's innermost call runs.
_current: contextvars.ContextVar[_Attempt] = contextvars.ContextVar("awa_task_attempt")


def _runner(task: Any) -> Any:
    """The handler the worker runs for ``task``: ``(ctx, *args, **kwargs)``. Job middleware
    (``AWA["JOB_MIDDLEWARE"]``) goes around the task function's call, inside the signals."""
    func = task.func
    path = str(getattr(task, "module_path", ""))

    if inspect.iscoroutinefunction(func):

        async def innermost_async(call: JobCall) -> object:
            return await func(*_current.get().call_args(call.args), **call.kwargs)

        async def call_async(ctx: JobContext, attempt: _Attempt, args: Any, kwargs: Any) -> Any:
            chain = task_chain(func, path, True, innermost_async)
            if chain is None:
                return await func(*attempt.call_args(args), **kwargs)
            token = _current.set(attempt)
            try:
                return await chain(JobCall(ctx, tuple(args), dict(kwargs)))
            finally:
                _current.reset(token)

        async def run_async(ctx: JobContext, *args: object, **kwargs: object) -> object:
            attempt = await sync_to_async(_Attempt)(task, ctx, args, kwargs)
            try:
                await sync_to_async(attempt.start)()
                value = await call_async(ctx, attempt, args, kwargs)
                stored = attempt.stored(value)
            except BaseException as exc:
                await sync_to_async(attempt.finish)(None, exc)
                raise
            await sync_to_async(attempt.finish)(value, None)
            return stored

        return run_async

    def innermost(call: JobCall) -> object:
        return func(*_current.get().call_args(call.args), **call.kwargs)

    def call_sync(ctx: JobContext, attempt: _Attempt, args: Any, kwargs: Any) -> Any:
        chain = task_chain(func, path, False, innermost)
        if chain is None:
            return func(*attempt.call_args(args), **kwargs)
        token = _current.set(attempt)
        try:
            return chain(JobCall(ctx, tuple(args), dict(kwargs)))
        finally:
            _current.reset(token)

    def run_sync(ctx: JobContext, *args: object, **kwargs: object) -> object:
        attempt = _Attempt(task, ctx, args, kwargs)
        try:
            attempt.start()
            # None in a worker; under drain(), the test's, with what task_started wrote in it.
            kept = mark_open_transactions()
            try:
                value = call_sync(ctx, attempt, args, kwargs)
            except BaseException:
                with contextlib.suppress(TransactionLeftOpen):  # its own exception is its error
                    _release_connections(ctx.id, kept)
                raise
            _release_connections(ctx.id, kept)
            stored = attempt.stored(value)
        except BaseException as exc:
            attempt.finish(None, exc)
            raise
        attempt.finish(value, None)
        return stored

    return run_sync
