"""Job middleware: code around every handler, declared once in ``AWA["JOB_MIDDLEWARE"]``
(docs/jobs.md, "Job middleware").

Each entry is the dotted path of a factory, as Django's own middleware: called with
``call_next`` (the next middleware, or the handler), it returns the callable that takes a
:class:`JobCall` and returns the job's result. The first entry is the outermost. For an async
handler ``call_next`` is a coroutine function and the factory must return one too.

What a middleware raises, before or after ``call_next``, is what the handler raised: the
attempt is retried or fails by the job's policy. What the outermost returns is the job's
result; one that returns without calling ``call_next`` runs no handler. A factory that cannot be
imported, is not callable, or returns a callable of the wrong kind fails the jobs it would run
with an ``ImproperlyConfigured`` error that says why (retried by their policy, as a setting a
deploy fixes; ``manage.py check`` reports the first two: awa.E009), never the worker. For a
django.tasks task the chain is around the task function itself (awa_django/backends/runner.py):
``call_next`` returns the task's return value, and the task's signals are sent outside it.

Each handler's chain is built once, the first time one of its jobs runs, and kept while the
setting is unchanged.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from typing import Any, TypeVar

from asgiref.sync import iscoroutinefunction
from django.core.exceptions import ImproperlyConfigured

from awa_django.conf import get_awa_settings, import_job_middleware
from awa_django.context import JobContext
from awa_django.jobs import Job

__all__ = ["JobCall", "build_chain", "task_chain", "with_middleware"]

T = TypeVar("T")

#: The most handlers whose chains are kept (django.tasks handles come and go by task).
_MAX_CHAINS = 4096

_chains: dict[Job[Any, Any], Job[Any, Any]] = {}
_task_chains: dict[object, Callable[[JobCall], Any]] = {}
_chains_for: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True, slots=True)
class JobCall:
    """One call of a handler, as job middleware sees it.

    ``context`` is the attempt's ``JobContext`` (``id``, ``kind``, ``queue``, ``attempt``,
    ``max_attempts``, ``metadata``, ``tags``, ``errors``...), whether or not the handler takes
    it; ``args`` and ``kwargs`` are what the handler is called with. Pass a changed copy
    (``dataclasses.replace(call, kwargs=...)``) to ``call_next`` to call it with others."""

    context: JobContext
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


def with_middleware(handle: Job[Any, Any], paths: tuple[str, ...]) -> Job[Any, Any]:
    """``handle`` with the middleware of ``paths`` around its function (a copy that takes the
    context), or ``handle`` itself when there is none."""
    if not paths:
        return handle
    return _cached(_chains, handle, paths, lambda: _wrap(handle, paths))


def _cached(store: dict[Any, T], key: object, paths: tuple[str, ...], build: Callable[[], T]) -> T:
    """``store[key]``, built by ``build`` the first time; every store is emptied when the
    setting changes, and one that grows past :data:`_MAX_CHAINS` is emptied."""
    global _chains_for
    if paths != _chains_for:
        _chains.clear()
        _task_chains.clear()
        _chains_for = paths
    found = store.get(key)
    if found is None:
        if len(store) >= _MAX_CHAINS:
            store.clear()
        found = store[key] = build()
    return found


def _is_async(function: object) -> bool:
    # asgiref's: it honours markcoroutinefunction (Django's convention for async middleware).
    return iscoroutinefunction(function) or iscoroutinefunction(
        getattr(function, "__call__", None)  # noqa: B004  (a callable object's method)
    )


def build_chain(
    kind: str, is_async: bool, innermost: Callable[[JobCall], Any], paths: tuple[str, ...]
) -> Callable[[JobCall], Any]:
    """The middleware of ``paths`` around ``innermost`` (the handler's call), outermost
    first; ``ImportError`` or ``TypeError`` for an entry that cannot make one."""
    call_next = innermost
    for path in reversed(paths):
        made = import_job_middleware(path)(call_next)
        if not callable(made):
            raise TypeError(f"job middleware {path!r} returned {made!r}, not a callable")
        if _is_async(made) != is_async:
            kind_of = "an async" if is_async else "a sync"
            raise TypeError(
                f"job middleware {path!r} returned a {'sync' if is_async else 'async'} "
                f"callable for {kind_of} handler ({kind}): a factory returns an async "
                "callable when call_next is a coroutine function, else a sync one"
            )
        call_next = made
    return call_next


def _safe_chain(
    kind: str, is_async: bool, innermost: Callable[[JobCall], Any], paths: tuple[str, ...]
) -> Callable[[JobCall], Any]:
    """:func:`build_chain`, or, when it cannot be built, a chain that fails every call with
    the reason (the worker goes on)."""
    try:
        return build_chain(kind, is_async, innermost, paths)
    except Exception as exc:
        failure = f"{type(exc).__name__}: {exc}"
    if is_async:

        async def refuse_async(call: JobCall) -> Any:
            raise ImproperlyConfigured(failure)

        return refuse_async

    def refuse(call: JobCall) -> Any:
        raise ImproperlyConfigured(failure)

    return refuse


def task_chain(
    key: object, kind: str, is_async: bool, innermost: Callable[[JobCall], Any]
) -> Callable[[JobCall], Any] | None:
    """The middleware chain of a django.tasks task (``key``: its function), around the call
    of the task function, so that middleware sees the task's own return value; None when
    ``AWA["JOB_MIDDLEWARE"]`` is empty. Built once per task and setting."""
    paths = get_awa_settings().JOB_MIDDLEWARE
    if not paths:
        return None
    return _cached(_task_chains, key, paths, lambda: _safe_chain(kind, is_async, innermost, paths))


def _wrap(handle: Job[Any, Any], paths: tuple[str, ...]) -> Job[Any, Any]:
    func = handle.func
    takes_context = handle.takes_context
    innermost: Callable[[JobCall], Any]
    if handle.is_async:

        async def handler(call: JobCall) -> Any:
            if takes_context:
                return await func(call.context, *call.args, **call.kwargs)
            return await func(*call.args, **call.kwargs)

        innermost = handler
    else:

        def sync_handler(call: JobCall) -> Any:
            if takes_context:
                return func(call.context, *call.args, **call.kwargs)
            return func(*call.args, **call.kwargs)

        innermost = sync_handler
    chain = _safe_chain(handle.kind, handle.is_async, innermost, paths)
    run: Callable[..., Any]
    if handle.is_async:

        async def run_async(ctx: JobContext, *args: Any, **kwargs: Any) -> Any:
            return await chain(JobCall(ctx, args, kwargs))

        run = run_async
    else:

        def run_sync(ctx: JobContext, *args: Any, **kwargs: Any) -> Any:
            return chain(JobCall(ctx, args, kwargs))

        run = run_sync
    wrapped = copy.copy(handle)
    wrapped.func = run
    wrapped.takes_context = True
    return wrapped
