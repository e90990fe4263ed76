"""Job middleware for the middleware tests (``AWA["JOB_MIDDLEWARE"]`` entries): each records
what it saw in ``CALLS`` and works for sync and async handlers alike, but for the wrong ones."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import Any

from asgiref.sync import markcoroutinefunction

from awa_django import JobCall, Snooze, TerminalError

#: What the middleware saw, in order (cleared by the tests).
CALLS: list[str] = []

#: How many times each factory was called.
BUILT: dict[str, int] = {}


def _around(name: str, call_next: Callable[..., Any]) -> Callable[[JobCall], Any]:
    BUILT[name] = BUILT.get(name, 0) + 1
    if inspect.iscoroutinefunction(call_next):

        async def async_middleware(call: JobCall) -> Any:
            CALLS.append(f"{name}>{call.context.kind}")
            try:
                return {name: await call_next(call)}
            finally:
                CALLS.append(f"<{name}")

        return async_middleware

    def middleware(call: JobCall) -> Any:
        CALLS.append(f"{name}>{call.context.kind}")
        try:
            return {name: call_next(call)}
        finally:
            CALLS.append(f"<{name}")

    return middleware


def outer(call_next: Callable[..., Any]) -> Callable[[JobCall], Any]:
    return _around("outer", call_next)


def inner(call_next: Callable[..., Any]) -> Callable[[JobCall], Any]:
    return _around("inner", call_next)


def gate(call_next: Callable[..., Any]) -> Callable[[JobCall], Any]:
    """Decides by the job's metadata: refuse it for good, snooze it, fail it, or double its
    first argument."""

    def decide(call: JobCall) -> Any:
        rule = call.context.metadata.get("gate")
        if rule == "refuse":
            raise TerminalError("refused by the gate")
        if rule == "snooze":
            return Snooze(60)
        if rule == "boom":
            raise LookupError("the gate broke")
        if rule == "double":
            return dataclasses.replace(call, args=(call.args[0] * 2, *call.args[1:]))
        return call

    if inspect.iscoroutinefunction(call_next):

        async def async_gate(call: JobCall) -> Any:
            decided = decide(call)
            return await call_next(decided) if isinstance(decided, JobCall) else decided

        return async_gate

    def sync_gate(call: JobCall) -> Any:
        decided = decide(call)
        return call_next(decided) if isinstance(decided, JobCall) else decided

    return sync_gate


def sync_only(call_next: Callable[..., Any]) -> Callable[[JobCall], Any]:
    """Wrong for async handlers: always a sync callable."""
    return lambda call: call_next(call)


def marked(call_next: Callable[..., Any]) -> Callable[[JobCall], Any]:
    """Django's convention for async middleware: a plain function marked as a coroutine one."""
    if inspect.iscoroutinefunction(call_next):

        def awaits(call: JobCall) -> Any:
            return call_next(call)  # the coroutine, awaited by the caller

        return markcoroutinefunction(awaits)
    return lambda call: call_next(call)


def broken(call_next: Callable[..., Any]) -> Callable[[JobCall], Any]:
    raise RuntimeError("the factory broke")


NOT_CALLABLE = 42
