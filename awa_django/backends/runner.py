"""Worker side of the django.tasks backend: resolve a stored task path safely and run it.

A job written by ``AwaTaskBackend`` stores the task's ``module_path`` as its kind and
``{"task": {"backend": alias}}`` beside its arguments. The worker runs it only when the path
names, in a module of an installed app (or of ``AWA["JOB_MODULES"]``), a ``Task`` object whose
backend is that alias and an ``AwaTaskBackend``. Anything else (``subprocess.check_output``, a
plain function, another backend's task) is refused without being called.
"""

from __future__ import annotations

import importlib
import inspect
import sys
from typing import Any

from asgiref.sync import sync_to_async
from django.apps import apps
from django.utils import timezone

from awa_django.backends.compat import TASK_CLASSES, TaskContext, TaskResult, TaskResultStatus
from awa_django.conf import get_awa_settings
from awa_django.jobs import Job, JobOptions

__all__ = ["resolve_task", "task_handle"]

_handles: dict[tuple[str, str], Job[Any, Any]] = {}


def _importable(module: str) -> bool:
    roots = [config.name for config in apps.get_app_configs()]
    roots.extend(get_awa_settings().JOB_MODULES)
    return any(module == root or module.startswith(root + ".") for root in roots)


def resolve_task(path: str, alias: str) -> Any | None:
    """The ``Task`` at ``path`` if it belongs to backend ``alias`` (an AwaTaskBackend), else None.

    Modules outside the installed apps and ``AWA["JOB_MODULES"]`` are never imported.
    """
    from awa_django.backends.tasks import AwaTaskBackend

    module_name, _, attr = path.rpartition(".")
    if not module_name or not attr.isidentifier():
        return None
    module = sys.modules.get(module_name)
    if module is None:
        if not _importable(module_name):
            return None
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            return None
    task = getattr(module, attr, None)
    if not isinstance(task, TASK_CLASSES) or task.backend != alias:
        return None
    if task.module_path != path or not isinstance(task.get_backend(), AwaTaskBackend):
        return None
    return task


def task_handle(path: str, alias: str) -> Job[Any, Any] | None:
    """A ``Job`` the worker can run for the task at ``path``, or None to refuse it."""
    key = (path, alias)
    handle = _handles.get(key)
    if handle is None:
        task = resolve_task(path, alias)
        if task is None:
            return None
        handle = _handles[key] = Job(_runner(task), path, JobOptions())
    return handle


def _result(task: Any, ctx: Any, args: tuple[Any, ...], kwargs: dict[str, Any], status: Any) -> Any:
    now = timezone.now()
    return TaskResult(
        task=task,
        id=str(ctx.id),
        status=status,
        enqueued_at=None,
        started_at=now,
        finished_at=now if status != TaskResultStatus.RUNNING else None,
        last_attempted_at=now,
        args=list(args),
        kwargs=dict(kwargs),
        backend=task.backend,
        errors=[],
        worker_ids=["awa"] * ctx.attempt,
    )


def _runner(task: Any) -> Any:
    """Wrap the task function: TaskContext when asked for, and the three signals."""
    from awa_django.backends.compat import signals

    sender = type(task.get_backend())
    func = task.func

    def before(ctx: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
        result = _result(task, ctx, args, kwargs, TaskResultStatus.RUNNING)
        signals.task_started.send(sender, task_result=result)
        return (TaskContext(task_result=result), *args) if task.takes_context else args

    def after(ctx: Any, args: tuple[Any, ...], kwargs: dict[str, Any], ok: bool) -> None:
        status = TaskResultStatus.SUCCESSFUL if ok else TaskResultStatus.FAILED
        signals.task_finished.send(sender, task_result=_result(task, ctx, args, kwargs, status))

    if inspect.iscoroutinefunction(func):

        async def run_async(ctx: Any, *args: Any, **kwargs: Any) -> Any:
            call = await sync_to_async(before)(ctx, args, kwargs)
            try:
                value = await func(*call, **kwargs)
            except BaseException:
                await sync_to_async(after)(ctx, args, kwargs, False)
                raise
            await sync_to_async(after)(ctx, args, kwargs, True)
            return value

        return run_async

    def run_sync(ctx: Any, *args: Any, **kwargs: Any) -> Any:
        call = before(ctx, args, kwargs)
        try:
            value = func(*call, **kwargs)
        except BaseException:
            after(ctx, args, kwargs, False)
            raise
        after(ctx, args, kwargs, True)
        return value

    return run_sync
