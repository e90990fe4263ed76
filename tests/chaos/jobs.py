"""Job handlers of the chaos lane; what each execution does comes from its arguments.

Every execution first writes a start row in ``chaos.exec`` (job, run_lease, attempt, pid,
behaviour) in its own autocommit statement, and sets ``finished_at`` and the action it took when
it ends, whatever way it ends. Most behaviours misbehave only on attempt 1 (or while the run
lease is small, for snoozes) so that every job terminates once the faults stop.

Queues: ``chaos`` (sync handlers and the django.tasks task), ``chaos-async`` (async handlers),
``chaos-deadline`` (sync, 2 s hard deadline from ``AWA["QUEUES"]``); producers send most jobs
to other queues (``.using(queue=...)``: dozens of spread queues, the flow-limited queues).
``chaos.tick`` is the periodic schedules' job (``AWA["PERIODIC"]``), ``chaos.limited`` a kind
with a fleet-wide concurrency limit of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import uuid
from typing import Any

from asgiref.sync import sync_to_async
from django.db import InterfaceError, OperationalError, connection

import awa_django
from awa_django import Cancel, RetryAfter, Snooze, TerminalError, WaitForCallback, job
from tests.chaos.db import statement

try:
    from django.tasks import task  # type: ignore[import-not-found,unused-ignore]
except ImportError:
    from django_tasks import task  # type: ignore[no-redef,unused-ignore]

SYNC_BEHAVIOURS = (
    "ok",
    "raise",
    "terminal",
    "retry_after",
    "snooze",
    "cancel",
    "sys_exit",
    "keyboard_interrupt",
    "base_exception",
    "bad_progress",
    "callback_early",
    "callback_late",
    "callback_never",
    "long",
    "raise_twice",
)
ASYNC_BEHAVIOURS = (
    "ok",
    "raise",
    "raise_twice",
    "terminal",
    "retry_after",
    "snooze",
    "cancel",
    "cancelled_error",
    "base_exception",
    "bad_progress",
    "long",
)
DEADLINE_BEHAVIOURS = ("ok", "hang")
TASK_BEHAVIOURS = ("ok", "raise")

# How long a handler keeps retrying a ledger write through a PostgreSQL restart.
LEDGER_PATIENCE = 30.0
RETRY_AFTER_SECONDS = 0.05
KIND_LIMIT = 3  # chaos.limited's global_concurrency (@job), changed by the operator mid-run
SNOOZE_WHILE_LEASE_AT_MOST = 2
LONG_STEP = 0.1
HANG_SECONDS = 4.0


class ChaosBaseError(BaseException):
    """A BaseException that is neither SystemExit, KeyboardInterrupt nor CancelledError."""


# -- the ledger, through the worker thread's Django connection ------------------------------------


def _ledger(name: str, params: list[Any]) -> list[tuple[Any, ...]]:
    """Run one ledger statement in autocommit, retrying through lost connections."""
    deadline = time.monotonic() + LEDGER_PATIENCE
    while True:
        try:
            with connection.cursor() as cursor:
                cursor.execute(statement(name), params)
                return list(cursor.fetchall()) if cursor.description else []
        except (OperationalError, InterfaceError):
            connection.close()
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.1)


def _start(job_id: int, lease: int | None, attempt: int, behaviour: str, token: str | None) -> str:
    key = str(uuid.uuid4())
    _ledger("exec_start", [key, job_id, lease, attempt, os.getpid(), behaviour, token])
    return key


def _finish(key: str, action: str) -> None:
    _ledger("exec_finish", [action, key])


def _action(value: Any) -> str:
    """What a handler's return value asks for, as recorded in chaos.exec.action."""
    if isinstance(value, RetryAfter | Snooze | Cancel | WaitForCallback):
        return type(value).__name__.lower()
    return "return"


# -- sync handlers --------------------------------------------------------------------------------


@job(takes_context=True, name="chaos.sync", queue="chaos", max_attempts=4)
def sync_job(ctx: Any, token: str, behaviour: str, plan: dict[str, Any]) -> Any:
    """A sync handler doing ``behaviour`` (see SYNC_BEHAVIOURS)."""
    key = _start(ctx.id, ctx.run_lease, ctx.attempt, behaviour, token)
    action = "raise"
    try:
        value = _sync_behaviour(ctx, token, behaviour, plan)
        action = _action(value)
        return value
    except BaseException as exc:
        action = f"raise:{type(exc).__name__}"
        raise
    finally:
        _finish(key, action)


def _sync_behaviour(ctx: Any, token: str, behaviour: str, plan: dict[str, Any]) -> Any:
    first = ctx.attempt == 1 or (behaviour == "raise_twice" and ctx.attempt == 2)
    if behaviour == "snooze" and ctx.run_lease <= SNOOZE_WHILE_LEASE_AT_MOST:
        return Snooze(0.05)
    if behaviour == "long" and ctx.attempt <= 2:
        _long_sync(ctx, float(plan.get("seconds", 1.0)))
    elif first and behaviour.startswith("callback_"):
        return _park(ctx, behaviour, plan)
    elif first and behaviour == "sys_exit":
        raise SystemExit(3)
    elif first and behaviour == "keyboard_interrupt":
        raise KeyboardInterrupt
    elif first:
        _misbehave(ctx, behaviour)
        value = _steer(behaviour)
        if value is not None:
            return value
    return {"token": token, "attempt": ctx.attempt}


def _long_sync(ctx: Any, seconds: float) -> None:
    started = time.monotonic()
    while time.monotonic() - started < seconds and not ctx.is_cancelled():
        ctx.set_progress(min(99.0, 100 * (time.monotonic() - started) / seconds), "long")
        time.sleep(LONG_STEP)


def _park(ctx: Any, behaviour: str, plan: dict[str, Any]) -> WaitForCallback:
    """Wait for a callback: resolved here before parking (early), by the driver's resolver after
    a delay (late, in the plan's mode), or never (it times out)."""
    callback_id = ctx.callback_id
    timeout = float(plan.get("timeout", 0.5))
    mode = {"callback_early": "early", "callback_never": "never"}.get(
        behaviour, str(plan.get("mode", "python"))
    )
    park = [str(callback_id), ctx.id, ctx.run_lease, ctx.attempt]
    delay = float(plan.get("delay", 0.5))
    _ledger("callback_park", [*park, delay, bool(plan.get("error", False)), mode])
    if mode == "early":
        _resolve_early(callback_id, twice=bool(plan.get("twice", False)))
    return WaitForCallback(callback_id, timeout=timeout)


def _resolve_early(callback_id: Any, *, twice: bool) -> None:
    """Resolve the attempt's own callback before it parks (kept for the park); ``twice``: a
    second, different resolution, which must not act."""
    for n in range(2 if twice else 1):
        request = str(uuid.uuid4())
        outcome = awa_django.resolve_callback(callback_id, result={"early": n, "by": request})
        row = [request, request, str(callback_id), "early", "result", outcome, False]
        _ledger("callback_call", row)


def _misbehave(ctx: Any, behaviour: str) -> None:
    """Behaviours shared by sync and async handlers that raise or poke at the context."""
    if behaviour == "raise":
        raise ValueError("chaos: raised on attempt 1")
    if behaviour == "raise_twice":
        raise ValueError(f"chaos: raised on attempt {ctx.attempt} of the first two")
    if behaviour == "terminal":
        raise TerminalError("chaos: terminal error on attempt 1")
    if behaviour == "base_exception":
        raise ChaosBaseError("chaos: a BaseException subclass on attempt 1")
    if behaviour == "bad_progress":
        # Refusing the metadata at once is fine; what matters is that the worker (its heartbeat
        # and completion loops) survives it and the handler carries on.
        with contextlib.suppress(awa_django.JobValidationError):
            ctx.set_progress(10, "x", bad=object())
        ctx.flush_progress()


def _steer(behaviour: str) -> Any:
    """The outcome value a steering behaviour returns on attempt 1, else None."""
    if behaviour == "retry_after":
        return RetryAfter(RETRY_AFTER_SECONDS)
    if behaviour == "cancel":
        return Cancel("chaos: the handler cancels its job")
    return None


@job(takes_context=True, name="chaos.deadline", queue="chaos-deadline", max_attempts=3)
def deadline_job(ctx: Any, token: str, behaviour: str, plan: dict[str, Any]) -> Any:
    """Sync, in the 2 s deadline queue: ``hang`` sleeps past the deadline on attempt 1,
    ignoring ``ctx.is_cancelled()``."""
    key = _start(ctx.id, ctx.run_lease, ctx.attempt, behaviour, token)
    action = "raise"
    try:
        if behaviour == "hang" and ctx.attempt == 1:
            time.sleep(float(plan.get("seconds", HANG_SECONDS)))
        action = "return"
        return {"token": token, "attempt": ctx.attempt}
    except BaseException as exc:
        action = f"raise:{type(exc).__name__}"
        raise
    finally:
        _finish(key, action)


@job(takes_context=True, name="chaos.limited", queue="chaos", global_concurrency=KIND_LIMIT)
def limited_job(ctx: Any, token: str, behaviour: str, plan: dict[str, Any]) -> Any:
    """A kind with a fleet-wide concurrency limit of its own, in whatever queue it is sent to:
    ``ok`` or ``long`` (sleeps ``plan["seconds"]``)."""
    key = _start(ctx.id, ctx.run_lease, ctx.attempt, behaviour, token)
    action = "raise"
    try:
        if behaviour == "long":
            _long_sync(ctx, float(plan.get("seconds", 0.2)))
        action = "return"
        return {"token": token, "attempt": ctx.attempt}
    except BaseException as exc:
        action = f"raise:{type(exc).__name__}"
        raise
    finally:
        _finish(key, action)


@job(takes_context=True, name="chaos.tick", queue="chaos-cron", max_attempts=3)
def tick_job(ctx: Any, schedule: str) -> Any:
    """The job of the periodic schedules: records its execution and returns."""
    key = _start(ctx.id, ctx.run_lease, ctx.attempt, "tick", None)
    action = "raise"
    try:
        action = "return"
        return {"schedule": schedule, "fire": ctx.metadata.get("cron_fire_time")}
    except BaseException as exc:
        action = f"raise:{type(exc).__name__}"
        raise
    finally:
        _finish(key, action)


# -- async handlers -------------------------------------------------------------------------------


@job(takes_context=True, name="chaos.async", queue="chaos-async", max_attempts=4)
async def async_job(ctx: Any, token: str, behaviour: str, plan: dict[str, Any]) -> Any:
    """An async handler doing ``behaviour`` (see ASYNC_BEHAVIOURS)."""
    key = await sync_to_async(_start)(ctx.id, ctx.run_lease, ctx.attempt, behaviour, token)
    action = "raise"
    try:
        value = await _async_behaviour(ctx, token, behaviour, plan)
        action = _action(value)
        return value
    except BaseException as exc:
        action = f"raise:{type(exc).__name__}"
        raise
    finally:
        await sync_to_async(_finish)(key, action)


async def _async_behaviour(ctx: Any, token: str, behaviour: str, plan: dict[str, Any]) -> Any:
    first = ctx.attempt == 1 or (behaviour == "raise_twice" and ctx.attempt == 2)
    if behaviour == "snooze" and ctx.run_lease <= SNOOZE_WHILE_LEASE_AT_MOST:
        return Snooze(0.05)
    if behaviour == "long" and ctx.attempt <= 2:
        seconds = float(plan.get("seconds", 1.0))
        started = time.monotonic()
        while time.monotonic() - started < seconds and not ctx.is_cancelled():
            ctx.set_progress(min(99.0, 100 * (time.monotonic() - started) / seconds), "long")
            await asyncio.sleep(LONG_STEP)
    elif first and behaviour == "cancelled_error":
        raise asyncio.CancelledError
    elif first:
        _misbehave(ctx, behaviour)
        value = _steer(behaviour)
        if value is not None:
            return value
    return {"token": token, "attempt": ctx.attempt}


# -- the django.tasks task ------------------------------------------------------------------------


@task(queue_name="chaos", takes_context=True)
def chaos_task(context: Any, token: str, behaviour: str) -> dict[str, Any]:
    """A django.tasks task (through AwaTaskBackend); ``raise`` fails attempt 1."""
    job_id = int(context.task_result.id)
    attempt = int(context.attempt)
    key = _start(job_id, None, attempt, f"task_{behaviour}", token)
    action = "raise"
    try:
        if behaviour == "raise" and attempt == 1:
            raise ValueError("chaos: task raised on attempt 1")
        action = "return"
        return {"token": token, "attempt": attempt}
    except BaseException as exc:
        action = f"raise:{type(exc).__name__}"
        raise
    finally:
        _finish(key, action)
