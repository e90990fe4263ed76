"""``AwaTaskBackend``: Django's standard ``@task`` API (django.tasks) running on awa_django.

Configure it in settings::

    TASKS = {
        "default": {
            "BACKEND": "awa_django.backends.tasks.AwaTaskBackend",
            "QUEUES": ["default", "emails"],      # [] accepts any valid queue name
            "OPTIONS": {"max_attempts": 1, "database": "default"},
        }
    }

Guarantees: ``enqueue``/``aenqueue`` write through the Django connection of the backend's
database alias, so a task enqueued inside ``transaction.atomic()`` commits or rolls back with the
caller's rows (no ``transaction.on_commit`` needed, and a rolled-back task never runs).
``awa_worker`` runs the tasks; a worker runs a stored task path only if it resolves to a ``Task``
of this backend defined in an installed app (or ``AWA["JOB_MODULES"]``); anything else fails the
job as suspicious, without running it.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping
from typing import Any

from django.core import checks
from django.db import connections
from django.utils import timezone

from awa_django.backends.compat import (
    BaseTaskBackend,
    InvalidTask,
    Task,
    TaskError,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultStatus,
    signals,
)
from awa_django.conf import get_awa_settings
from awa_django.db.identifiers import QUEUE_NAME_RE
from awa_django.exceptions import ValidationError
from awa_django.jobs import JobOptions
from awa_django.sql import query

__all__ = ["STATUS_OF_STATE", "AwaTask", "AwaTaskBackend"]

#: How awa_django's eight states (and the DLQ) compress into django.tasks' four statuses.
STATUS_OF_STATE: Mapping[str, str] = {
    "scheduled": "READY",
    "available": "READY",
    "retryable": "READY",
    "running": "RUNNING",
    "waiting_external": "RUNNING",
    "completed": "SUCCESSFUL",
    "failed": "FAILED",  # dead-lettered jobs too
    "cancelled": "FAILED",
}

_OPTIONS = {"database", "max_attempts", "deadline", "tags"}


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class AwaTask(Task):  # type: ignore[type-arg]
    """A django.tasks ``Task`` with awa_django's options, set through ``@task(**kwargs)``
    (Django 6.1 and the backport): ``max_attempts``, ``deadline`` (seconds), ``tags``.
    ``None`` means the backend's ``OPTIONS`` default."""

    max_attempts: int | None = None
    deadline: float | None = None
    tags: tuple[str, ...] | None = None


class AwaTaskBackend(BaseTaskBackend):
    """A django.tasks backend storing tasks as awa_django jobs (see the module docstring).

    OPTIONS: ``database`` (alias, default ``AWA["DATABASE_ALIAS"]``), ``max_attempts``
    (default 1: a task that raises is FAILED, as django.tasks expects; raise it to retry with
    backoff), ``deadline`` (seconds per attempt), ``tags``.
    """

    task_class = AwaTask
    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        self.database: str | None = self.options.get("database")
        self.max_attempts: int = self.options.get("max_attempts", 1)
        self.deadline: float | None = self.options.get("deadline")
        self.tags: tuple[str, ...] = tuple(self.options.get("tags", ()))

    @property
    def alias_for_db(self) -> str:
        return self.database or get_awa_settings().DATABASE_ALIAS

    def validate_task(self, task: Task) -> None:  # type: ignore[type-arg]
        super().validate_task(task)
        if QUEUE_NAME_RE.fullmatch(task.queue_name) is None:
            raise InvalidTask(
                f"Queue name {task.queue_name!r} is not valid for awa_django "
                "(1-63 characters of a-z 0-9 _ . -)."
            )

    def _options(self, task: Task) -> JobOptions:  # type: ignore[type-arg]
        max_attempts = getattr(task, "max_attempts", None) or self.max_attempts
        deadline = getattr(task, "deadline", None) or self.deadline
        tags = getattr(task, "tags", None)
        return JobOptions(
            queue=task.queue_name,
            priority=task.priority,
            max_attempts=max_attempts,
            run_after=task.run_after,
            deadline=deadline,
            tags=tuple(tags) if tags is not None else self.tags,
            using=self.alias_for_db,
        )

    def enqueue(self, task: Task, args: Any, kwargs: Any) -> TaskResult:  # type: ignore[type-arg]
        """Write the task as a job in the caller's transaction; return its READY result."""
        from awa_django.producer import build_request, send_requests

        self.validate_task(task)
        try:
            request = build_request(
                task.module_path,
                tuple(args),
                dict(kwargs),
                self._options(task),
                task_backend=self.alias,
            )
        except ValidationError as exc:
            raise InvalidTask(str(exc)) from exc
        [handle] = send_requests([request], request.using)
        result: TaskResult = TaskResult(  # type: ignore[type-arg]
            task=task,
            id=str(handle.id),
            status=TaskResultStatus.READY,
            enqueued_at=timezone.now(),
            started_at=None,
            finished_at=None,
            last_attempted_at=None,
            args=list(args),
            kwargs=dict(kwargs),
            backend=self.alias,
            errors=[],
            worker_ids=[],
        )
        signals.task_enqueued.send(type(self), task_result=result)
        return result

    def get_result(self, result_id: str) -> TaskResult:  # type: ignore[type-arg]
        """The task's current result, read from every plane; ``TaskResultDoesNotExist`` when
        the id is unknown, not a task of this backend, or aged out of history."""
        from awa_django.backends.runner import resolve_task

        try:
            job_id = int(result_id)
        except (TypeError, ValueError):
            raise TaskResultDoesNotExist(result_id) from None
        with connections[self.alias_for_db].cursor() as cursor:
            cursor.execute(query("task_result"), [job_id])
            row = cursor.fetchone()
            if row is None:
                raise TaskResultDoesNotExist(result_id)
            kind, state, args, attempt, created, attempted, finalized, errors, result = (
                _json(v) if i in (2, 7, 8) else v for i, v in enumerate(row)
            )
            if not isinstance(args, dict) or args.get("task", {}).get("backend") != self.alias:
                raise TaskResultDoesNotExist(result_id)
            task = resolve_task(kind, self.alias)
            if task is None:
                raise TaskResultDoesNotExist(result_id)
            cursor.execute(query("task_workers"), [job_id])
            workers = [str(r[0]) for r in cursor.fetchall() if r[0] is not None]
        status = TaskResultStatus(STATUS_OF_STATE[state])
        value: TaskResult = TaskResult(  # type: ignore[type-arg]
            task=task,
            id=str(job_id),
            status=status,
            enqueued_at=created,
            started_at=attempted,
            finished_at=finalized
            if status in (TaskResultStatus.SUCCESSFUL, TaskResultStatus.FAILED)
            else None,
            last_attempted_at=attempted,
            args=list(args.get("args", [])),
            kwargs=dict(args.get("kwargs", {})),
            backend=self.alias,
            errors=[_task_error(e) for e in errors or []],
            worker_ids=(workers + ["awa"] * attempt)[: max(attempt, 0)],
        )
        if status == TaskResultStatus.SUCCESSFUL:
            object.__setattr__(value, "_return_value", result)
        return value

    def check(self, **kwargs: Any) -> Iterable[checks.CheckMessage]:
        """awa.E101: app not installed; awa.E102: alias not PostgreSQL; awa.E103: bad OPTIONS."""
        from django.apps import apps
        from django.conf import settings

        if not apps.is_installed("awa_django"):
            yield checks.Error(
                "awa_django must be in INSTALLED_APPS to use AwaTaskBackend.", id="awa.E101"
            )
        # Without OPTIONS["database"] the alias is AWA["DATABASE_ALIAS"], which awa.E001/E002
        # already check; only an explicit alias is checked here.
        alias = self.database
        if alias is None:
            pass
        elif alias not in settings.DATABASES:
            yield checks.Error(f"OPTIONS['database'] {alias!r} is not in DATABASES.", id="awa.E102")
        elif connections[alias].vendor != "postgresql":
            yield checks.Error(
                f"AwaTaskBackend needs PostgreSQL; database {alias!r} is "
                f"{connections[alias].vendor}.",
                id="awa.E102",
            )
        unknown = set(self.options) - _OPTIONS
        if unknown:
            yield checks.Error(
                f"Unknown OPTIONS for AwaTaskBackend {self.alias!r}: {sorted(unknown)}; "
                f"known: {sorted(_OPTIONS)}.",
                id="awa.E103",
            )
        max_attempts = self.options.get("max_attempts", 1)
        if type(max_attempts) is not int or not 1 <= max_attempts <= 1000:
            yield checks.Error("OPTIONS['max_attempts'] must be an int in 1..1000.", id="awa.E103")


def _json(value: Any) -> Any:
    # Django's psycopg adapters hand jsonb back as text (for JSONField to decode).
    return json.loads(value) if isinstance(value, str) else value


def _task_error(entry: Mapping[str, Any]) -> TaskError:
    kind = str(entry.get("type", "Exception"))
    path = kind if "." in kind else f"builtins.{kind}"
    return TaskError(exception_class_path=path, traceback=str(entry.get("traceback", "")))
