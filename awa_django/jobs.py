"""The ``@job`` decorator, the registry of job kinds and the ``Job`` handle.

A job kind is a registered function (sync or async) plus its default options. Workers resolve
code only through this registry: a row naming any other callable is refused, never imported.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any, Generic, ParamSpec, TypeVar, overload

from asgiref.sync import async_to_sync, sync_to_async
from django.core.exceptions import ImproperlyConfigured

from awa_django.db.enqueue import build_request, send_requests
from awa_django.exceptions import UnknownKindError
from awa_django.limits import tag_tuple
from awa_django.types import EnqueuedJob, JobOptions, JobRequest

__all__ = ["Job", "JobOptions", "autodiscover_jobs", "get_job", "job", "registered_kinds"]

P = ParamSpec("P")
R = TypeVar("R")

_UNSET: Any = object()


_registry: dict[str, Job[Any, Any]] = {}


class Job(Generic[P, R]):
    """A registered job kind. Create it with ``@job``; do not instantiate directly.

    ``enqueue`` writes through the Django connection of ``options.using`` (default
    ``AWA["DATABASE_ALIAS"]``), so the job commits or rolls back with the caller's
    ``transaction.atomic()`` block. ``using(...)`` returns a copy with other options.
    """

    def __init__(self, func: Callable[P, R], kind: str, options: JobOptions) -> None:
        self.func = func
        self.kind = kind
        self.options = options
        self.is_async = inspect.iscoroutinefunction(func)
        self.takes_context = _takes_context(func)
        self.__doc__ = func.__doc__
        self.__name__ = getattr(func, "__name__", kind)
        self.__module__ = func.__module__

    def __repr__(self) -> str:
        return f"<Job {self.kind} queue={self.options.queue!r}>"

    def using(
        self,
        *,
        queue: str | None = _UNSET,
        priority: int = _UNSET,
        run_after: datetime | timedelta | None = _UNSET,
        max_attempts: int | None = _UNSET,
        deadline: float | timedelta | None = _UNSET,
        tags: Iterable[str] = _UNSET,
        metadata: Mapping[str, Any] | None = _UNSET,
        using: str | None = _UNSET,
    ) -> Job[P, R]:
        """Return a copy of this handle with the given options replaced (validated at enqueue)."""
        changes: dict[str, Any] = {
            name: value
            for name, value in (
                ("queue", queue),
                ("priority", priority),
                ("run_after", run_after),
                ("max_attempts", max_attempts),
                ("deadline", deadline),
                ("metadata", metadata),
                ("using", using),
            )
            if value is not _UNSET
        }
        if tags is not _UNSET:
            changes["tags"] = tag_tuple(tags)
        return Job(self.func, self.kind, dataclasses.replace(self.options, **changes))

    def prepare(self, *args: P.args, **kwargs: P.kwargs) -> JobRequest:
        """Validate and encode one request without sending it (for ``enqueue_many``).

        Raises ``ValidationError`` at once for bad arguments or options.
        """
        return build_request(self.kind, args, kwargs, self.options)

    def enqueue(self, *args: P.args, **kwargs: P.kwargs) -> EnqueuedJob:
        """Enqueue one job in the caller's transaction and return its handle (with ``.id``)."""
        request = build_request(self.kind, args, kwargs, self.options)
        return send_requests([request], request.using)[0]

    async def aenqueue(self, *args: P.args, **kwargs: P.kwargs) -> EnqueuedJob:
        """Async ``enqueue``: runs in Django's thread-sensitive executor, like the async ORM."""
        return await sync_to_async(self.enqueue, thread_sensitive=True)(*args, **kwargs)

    def call(self, *args: P.args, **kwargs: P.kwargs) -> Any:
        """Run the function inline in this process, bypassing the queue (async ones to completion).

        A handler that takes a ``ctx`` first parameter gets ``None`` here.
        """
        call_args: tuple[Any, ...] = (None, *args) if self.takes_context else args
        if self.is_async:
            return async_to_sync(self.func)(*call_args, **kwargs)  # type: ignore[arg-type]
        return self.func(*call_args, **kwargs)

    async def acall(self, *args: P.args, **kwargs: P.kwargs) -> Any:
        """Async ``call``: awaits async functions, runs sync ones in a thread."""
        call_args: tuple[Any, ...] = (None, *args) if self.takes_context else args
        if self.is_async:
            return await self.func(*call_args, **kwargs)  # type: ignore[misc]
        return await sync_to_async(self.func)(*call_args, **kwargs)


def _takes_context(func: Callable[..., Any]) -> bool:
    try:
        params = list(inspect.signature(func).parameters.values())
    except (TypeError, ValueError):
        return False
    return bool(params) and params[0].name == "ctx"


@overload
def job(func: Callable[P, R], /) -> Job[P, R]: ...


@overload
def job(
    *,
    name: str | None = None,
    queue: str | None = None,
    priority: int = 0,
    max_attempts: int | None = None,
    deadline: float | timedelta | None = None,
    tags: Iterable[str] = (),
    metadata: Mapping[str, Any] | None = None,
    using: str | None = None,
) -> Callable[[Callable[P, R]], Job[P, R]]: ...


def job(
    func: Callable[P, R] | None = None,
    /,
    *,
    name: str | None = None,
    queue: str | None = None,
    priority: int = 0,
    max_attempts: int | None = None,
    deadline: float | timedelta | None = None,
    tags: Iterable[str] = (),
    metadata: Mapping[str, Any] | None = None,
    using: str | None = None,
) -> Job[P, R] | Callable[[Callable[P, R]], Job[P, R]]:
    """Register a function (sync or async) as a job kind; usable bare or with options.

    The kind is the function's dotted path (``module.qualname``) unless ``name=`` is given.
    Options are validated when a job is enqueued. Registering two different functions under one
    kind raises ``ImproperlyConfigured``; re-importing the same module is fine.
    """
    options = JobOptions(
        queue=queue,
        priority=priority,
        max_attempts=max_attempts,
        deadline=deadline,
        tags=tag_tuple(tags),
        metadata=metadata,
        using=using,
    )

    def register(f: Callable[P, R]) -> Job[P, R]:
        qualname = getattr(f, "__qualname__", "")
        if name is None and "<locals>" in qualname:
            raise ImproperlyConfigured(
                f"@job cannot register the nested function {qualname!r} by path; define it at "
                "module level or pass name="
            )
        kind = name or f"{f.__module__}.{qualname}"
        existing = _registry.get(kind)
        if existing is not None and _origin(existing.func) != _origin(f):
            raise ImproperlyConfigured(
                f"job kind {kind!r} is already registered for {_origin(existing.func)}"
            )
        handle: Job[P, R] = Job(f, kind, options)
        _registry[kind] = handle
        return handle

    if func is not None:
        return register(func)
    return register


def _origin(func: Callable[..., Any]) -> str:
    return f"{func.__module__}.{getattr(func, '__qualname__', repr(func))}"


def get_job(kind: str) -> Job[Any, Any]:
    """Return the registered job of ``kind``; raise ``UnknownKindError`` if there is none."""
    try:
        return _registry[kind]
    except KeyError:
        raise UnknownKindError(kind) from None


def autodiscover_jobs() -> None:
    """Import every installed app's ``jobs`` module and each of ``AWA["JOB_MODULES"]``.

    This is how workers (and producers that enqueue by name) find job kinds. Idempotent.
    """
    from importlib import import_module

    from django.utils.module_loading import autodiscover_modules

    from awa_django.conf import get_awa_settings

    autodiscover_modules("jobs")
    for module in get_awa_settings().JOB_MODULES:
        import_module(module)


def registered_kinds() -> dict[str, Job[Any, Any]]:
    """A snapshot of the registry: kind → ``Job``."""
    return dict(_registry)
