"""The ``@job`` decorator, the registry of job kinds and the ``Job`` handle.

A job kind is a registered function (sync or async) plus its default options. Workers resolve
code only through this registry: a row naming any other callable is refused, never imported.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, Concatenate, Generic, Literal, NamedTuple, ParamSpec, TypeVar, overload

from asgiref.sync import async_to_sync, sync_to_async
from django.core.exceptions import ImproperlyConfigured

from awa_django import cron as _cron
from awa_django.conf import KindSettings
from awa_django.context import JobContext
from awa_django.db.enqueue import OptionsMemo, build_request, send_requests
from awa_django.exceptions import UnknownKindError
from awa_django.limits import (
    DESCRIPTION_MAX_LENGTH,
    check_descriptor,
    check_flow_limits,
    check_kind_name,
    check_weight,
    clean_text,
    tag_tuple,
)
from awa_django.retry import RetryPolicy, check_retry
from awa_django.types import EnqueuedJob, JobOptions, JobRequest
from awa_django.unique import states_tuple

__all__ = [
    "Job",
    "JobOptions",
    "autodiscover_jobs",
    "get_job",
    "job",
    "kind_flow_limits",
    "registered_kinds",
]

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

    def __init__(
        self,
        func: Callable[..., Any],
        kind: str,
        options: JobOptions,
        *,
        takes_context: bool = False,
        limits: KindSettings | None = None,
        descriptor: Mapping[str, Any] | None = None,
    ) -> None:
        self.func = func
        self.kind = kind
        self.options = options
        #: The kind's flow limits from ``@job(global_concurrency=, rate_limit=, rate_burst=)``
        #: (None: none; docs/flow.md, "Per kind").
        self.limits = limits
        #: What the kind is for (docs/descriptors.md): label, description, owner, links.
        self.descriptor: Mapping[str, Any] = descriptor or {}
        self.is_async = inspect.iscoroutinefunction(func)
        #: The function's first parameter is the attempt's ``JobContext``.
        self.takes_context = takes_context
        # The options as checked at the first enqueue (they never change: ``using`` makes a
        # new handle), so that later ones check only their arguments.
        self._memo = OptionsMemo()
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
        metadata: Mapping[str, object] | None = _UNSET,
        using: str | None = _UNSET,
        unique: bool = _UNSET,
        unique_key: str | None = _UNSET,
        unique_for: float | timedelta | None = _UNSET,
        unique_states: Iterable[str] | None = _UNSET,
        on_conflict: Literal["return", "raise"] = _UNSET,
        retry: RetryPolicy | None = _UNSET,
        weight: int = _UNSET,
        serial_key: str | None = _UNSET,
    ) -> Job[P, R]:
        """Return a copy of this handle with the given options replaced (validated at enqueue).

        ``unique_key`` (any string; keys are per kind), ``unique_for`` (seconds or
        ``timedelta``) and ``unique_states`` make the job unique (docs/jobs.md, "Unique jobs").
        ``serial_key`` (a string of 1-255 characters, per call only) makes jobs of the queue
        with the same key run one at a time, oldest first, across every worker (docs/flow.md,
        "Per-key serialisation").
        """
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
                ("unique", unique),
                ("unique_key", unique_key),
                ("unique_for", unique_for),
                ("on_conflict", on_conflict),
                ("retry", retry),
                ("weight", weight),
                ("serial_key", serial_key),
            )
            if value is not _UNSET
        }
        if tags is not _UNSET:
            changes["tags"] = tag_tuple(tags)
        if unique_states is not _UNSET:
            changes["unique_states"] = states_tuple(unique_states)
        return Job(
            self.func,
            self.kind,
            dataclasses.replace(self.options, **changes),
            takes_context=self.takes_context,
            limits=self.limits,
            descriptor=self.descriptor,
        )

    def prepare(self, *args: P.args, **kwargs: P.kwargs) -> JobRequest:
        """Validate and encode one request without sending it (for ``enqueue_many``).

        Raises ``JobValidationError`` at once for bad arguments or options.
        """
        return build_request(self.kind, args, kwargs, self.options, memo=self._memo)

    def enqueue(self, *args: P.args, **kwargs: P.kwargs) -> EnqueuedJob:
        """Enqueue one job in the caller's transaction and return its handle (with ``.id``)."""
        request = build_request(self.kind, args, kwargs, self.options, memo=self._memo)
        return send_requests([request], request.using)[0]

    async def aenqueue(self, *args: P.args, **kwargs: P.kwargs) -> EnqueuedJob:
        """Async ``enqueue``: runs in Django's thread-sensitive executor, like the async ORM."""
        return await sync_to_async(self.enqueue, thread_sensitive=True)(*args, **kwargs)

    def call(self, *args: P.args, **kwargs: P.kwargs) -> Any:
        """Run the function inline in this process, bypassing the queue (async ones to completion).

        A handler that takes the context (``takes_context=True``) gets ``None`` for it here.
        """
        call_args: tuple[Any, ...] = (None, *args) if self.takes_context else args
        if self.is_async:
            return async_to_sync(self.func)(*call_args, **kwargs)
        return self.func(*call_args, **kwargs)

    async def acall(self, *args: P.args, **kwargs: P.kwargs) -> Any:
        """Async ``call``: awaits async functions, runs sync ones in a thread."""
        call_args: tuple[Any, ...] = (None, *args) if self.takes_context else args
        if self.is_async:
            return await self.func(*call_args, **kwargs)
        return await sync_to_async(self.func)(*call_args, **kwargs)


def _check_takes_context(func: Callable[..., Any], kind: str) -> None:
    """A function registered with ``takes_context=True`` must take a first positional
    parameter (the context); refused at registration otherwise."""
    try:
        params = list(inspect.signature(func).parameters.values())
    except (TypeError, ValueError):
        return  # a builtin or C callable: the call will tell
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    if params and (
        params[0].kind in positional or params[0].kind is inspect.Parameter.VAR_POSITIONAL
    ):
        return
    raise ImproperlyConfigured(
        f"job kind {kind!r} is registered with takes_context=True but its function takes no "
        "first positional parameter for the context"
    )


@overload
def job(func: Callable[P, R], /) -> Job[P, R]: ...


@overload
def job(
    *,
    takes_context: Literal[True],
    name: str | None = None,
    queue: str | None = None,
    priority: int = 0,
    max_attempts: int | None = None,
    deadline: float | timedelta | None = None,
    tags: Iterable[str] = (),
    metadata: Mapping[str, object] | None = None,
    using: str | None = None,
    unique: bool = False,
    unique_for: float | timedelta | None = None,
    unique_states: Iterable[str] | None = None,
    on_conflict: Literal["return", "raise"] = "return",
    cron: str | None = None,
    timezone: str = "UTC",
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    catch_up: str | int = "latest",
    retry: RetryPolicy | None = None,
    weight: int = 1,
    global_concurrency: int | None = None,
    rate_limit: float | None = None,
    rate_burst: int | None = None,
    label: str | None = None,
    description: str | None = None,
    owner: str | None = None,
    links: Mapping[str, str] | None = None,
) -> Callable[[Callable[Concatenate[JobContext, P], R]], Job[P, R]]: ...


@overload
def job(
    *,
    takes_context: Literal[False] = False,
    name: str | None = None,
    queue: str | None = None,
    priority: int = 0,
    max_attempts: int | None = None,
    deadline: float | timedelta | None = None,
    tags: Iterable[str] = (),
    metadata: Mapping[str, object] | None = None,
    using: str | None = None,
    unique: bool = False,
    unique_for: float | timedelta | None = None,
    unique_states: Iterable[str] | None = None,
    on_conflict: Literal["return", "raise"] = "return",
    cron: str | None = None,
    timezone: str = "UTC",
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    catch_up: str | int = "latest",
    retry: RetryPolicy | None = None,
    weight: int = 1,
    global_concurrency: int | None = None,
    rate_limit: float | None = None,
    rate_burst: int | None = None,
    label: str | None = None,
    description: str | None = None,
    owner: str | None = None,
    links: Mapping[str, str] | None = None,
) -> Callable[[Callable[P, R]], Job[P, R]]: ...


def job(
    func: Callable[P, R] | None = None,
    /,
    *,
    takes_context: bool = False,
    name: str | None = None,
    queue: str | None = None,
    priority: int = 0,
    max_attempts: int | None = None,
    deadline: float | timedelta | None = None,
    tags: Iterable[str] = (),
    metadata: Mapping[str, object] | None = None,
    using: str | None = None,
    unique: bool = False,
    unique_for: float | timedelta | None = None,
    unique_states: Iterable[str] | None = None,
    on_conflict: Literal["return", "raise"] = "return",
    cron: str | None = None,
    timezone: str = "UTC",
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    catch_up: str | int = "latest",
    retry: RetryPolicy | None = None,
    weight: int = 1,
    global_concurrency: int | None = None,
    rate_limit: float | None = None,
    rate_burst: int | None = None,
    label: str | None = None,
    description: str | None = None,
    owner: str | None = None,
    links: Mapping[str, str] | None = None,
) -> Any:
    """Register a function (sync or async) as a job kind; usable bare or with options.

    With ``takes_context=True`` the function's first parameter is the attempt's
    :class:`~awa_django.JobContext` (id, attempt, metadata, tags, previous errors, progress,
    cancellation, callbacks), as with django.tasks' ``@task(takes_context=True)``; callers
    enqueue without it. The kind is the function's dotted path (``module.qualname``) unless
    ``name=`` is given. ``retry`` is the kind's :class:`~awa_django.RetryPolicy` (stored with
    each job; ``.using(retry=...)`` replaces it per call). ``unique=True`` makes every job of
    the kind unique by its arguments (``unique_for``, ``unique_states``, ``on_conflict``: see
    docs/jobs.md, "Unique jobs"). Options are validated when a job is enqueued (a ``retry``
    that is not a ``RetryPolicy`` and a bad ``weight`` at once). ``weight`` (1-10,000) is how
    many execution slots and global-concurrency permits one attempt takes (docs/flow.md).
    ``global_concurrency`` (1-10,000), ``rate_limit`` (jobs per second, 0.001-1,000,000) and
    ``rate_burst`` (1-1,000,000, with a rate) limit the kind across every queue, worker process
    and host (docs/flow.md, "Per kind"); workers write them to the database when they start
    (``AWA["KINDS"]`` wins for a kind it names), and bad values raise ``InvalidOptionError``
    at once.

    ``cron=`` makes it periodic (docs/periodic.md): the maintenance leader enqueues it with
    ``args`` and ``kwargs`` at each fire time of the expression in ``timezone``, exactly once
    per fire time; ``catch_up`` is ``"latest"`` or the most missed fires to make up after
    downtime. The schedule is named after the kind. A bad expression, time zone or policy is
    reported by ``manage.py check`` (awa.E007), not raised here. Registering two different
    functions under one kind raises ``ImproperlyConfigured``; re-importing the same module is
    fine.

    ``label``, ``description`` (default: the first paragraph of the docstring), ``owner`` and
    ``links`` (names to http(s) URLs: runbook, dashboard) say what the kind is for; workers
    report them, and the admin and ``awa_status`` show them (docs/descriptors.md). Bad values
    raise ``InvalidOptionError`` at once.
    """
    options = JobOptions(
        queue=queue,
        priority=priority,
        max_attempts=max_attempts,
        deadline=deadline,
        tags=tag_tuple(tags),
        metadata=metadata,
        using=using,
        unique=unique,
        unique_for=unique_for,
        unique_states=states_tuple(unique_states),
        on_conflict=on_conflict,
        retry=check_retry(retry),
        weight=check_weight(weight),
    )

    limits = _kind_limits(global_concurrency, rate_limit, rate_burst)
    periodic = _periodic(cron, timezone, args, kwargs, catch_up)
    described = check_descriptor(label=label, description=description, owner=owner, links=links)

    def register(f: Callable[..., Any]) -> Job[Any, Any]:
        descriptor = {key: value for key, value in described.items() if value is not None}
        if description is None:
            summary = _summary(f)
            if summary:
                descriptor["description"] = summary
        return _register(f, name, options, takes_context, limits, periodic, descriptor)

    if func is not None:
        return register(func)
    return register


class _Periodic(NamedTuple):
    """``@job(cron=...)``'s schedule, declared when the kind is registered (docs/periodic.md)."""

    cron: str
    timezone: str
    args: Sequence[Any]
    kwargs: Mapping[str, Any] | None
    catch_up: str | int


def _kind_limits(
    global_concurrency: int | None, rate_limit: float | None, rate_burst: int | None
) -> KindSettings | None:
    """The kind's flow limits given to ``@job`` (checked at once), or None when none is."""
    if global_concurrency is None and rate_limit is None and rate_burst is None:
        return None
    return KindSettings(*check_flow_limits(global_concurrency, rate_limit, rate_burst))


def _periodic(
    cron: str | None,
    timezone: str,
    args: Sequence[Any],
    kwargs: Mapping[str, Any] | None,
    catch_up: str | int,
) -> _Periodic | None:
    """``@job``'s schedule options, or None without ``cron=`` (which then takes none of them)."""
    if cron is None:
        if args or kwargs or timezone != "UTC" or catch_up != "latest":
            raise ImproperlyConfigured(
                "@job(args=, kwargs=, timezone=, catch_up=) describe a periodic job and need cron="
            )
        return None
    return _Periodic(cron, timezone, args, kwargs, catch_up)


def _register(
    f: Callable[..., Any],
    name: str | None,
    options: JobOptions,
    takes_context: bool,
    limits: KindSettings | None,
    periodic: _Periodic | None,
    descriptor: Mapping[str, Any] | None = None,
) -> Job[Any, Any]:
    """Register ``f`` as a job kind (``@job``): its kind is ``name`` or its dotted path."""
    qualname = getattr(f, "__qualname__", "")
    if name is None and "<locals>" in qualname:
        raise ImproperlyConfigured(
            f"@job cannot register the nested function {qualname!r} by path; define it at "
            "module level or pass name="
        )
    kind = name or f"{f.__module__}.{qualname}"
    if limits is not None:
        check_kind_name(kind, "name")  # the limits' row is named by it (docs/flow.md)
    existing = _registry.get(kind)
    if existing is not None and _origin(existing.func) != _origin(f):
        raise ImproperlyConfigured(
            f"job kind {kind!r} is already registered for {_origin(existing.func)}"
        )
    if takes_context:
        _check_takes_context(f, kind)
    handle: Job[Any, Any] = Job(
        f, kind, options, takes_context=takes_context, limits=limits, descriptor=descriptor
    )
    _registry[kind] = handle
    if periodic is not None:
        kwargs = periodic.kwargs
        _cron.declare(
            _cron.Schedule(
                name=kind,
                kind=kind,
                cron=periodic.cron,
                timezone=periodic.timezone,
                args=periodic.args,
                kwargs=dict(kwargs) if isinstance(kwargs, Mapping) else (kwargs or {}),
                catch_up=periodic.catch_up,
            )
        )
    return handle


#: A blank line (spaces and tabs allowed), or a paragraph separator.
_PARAGRAPH_BREAK = re.compile(r"\r?\n[ \t]*\r?\n|\u2029")


def _summary(func: Callable[..., Any]) -> str | None:
    """The first paragraph of ``func``'s docstring on one line, cut to what a description
    holds; None when it has none."""
    doc = inspect.getdoc(func)
    if not doc:
        return None
    paragraph = " ".join(_PARAGRAPH_BREAK.split(doc.strip(), maxsplit=1)[0].split())
    return clean_text(paragraph)[:DESCRIPTION_MAX_LENGTH] or None


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


def kind_flow_limits() -> dict[str, dict[str, float | int | None]]:
    """The flow limits this project's code and settings give job kinds, as
    ``awa.flow_kind_sync_v1`` takes them: ``@job(global_concurrency=, rate_limit=,
    rate_burst=)`` of the registered kinds, and ``AWA["KINDS"]``, which wins for a kind it
    names (also one no ``@job`` registers here: kinds enqueued by name). Kinds without limits
    are left out."""
    from awa_django.conf import get_awa_settings

    limits: dict[str, KindSettings] = {}
    for kind, handle in _registry.items():
        if handle.limits is not None:
            limits[kind] = handle.limits
    limits.update(get_awa_settings().KINDS)
    return {kind: lim.flow_limits() for kind, lim in sorted(limits.items()) if lim.has_flow_limits}


def registered_kinds() -> dict[str, Job[Any, Any]]:
    """A snapshot of the registry: kind → ``Job``."""
    return dict(_registry)
