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
defined in an installed app (or ``AWA["JOB_MODULES"]``) and the stored backend alias is an
``AwaTaskBackend`` (``task.using(backend=...)`` works); anything else fails the job as
suspicious, without running it (awa_django/backends/runner.py). ``get_result`` rebuilds the task
as it was enqueued, reports every failure with an importable exception class
(awa_django/backends/errors.py) and the worker of every attempt (awa_django/backends/stored.py).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping
from typing import Any

from django.core import checks
from django.db import connections

from awa_django.backends.compat import (
    TASK_CLASSES,
    BaseTaskBackend,
    InvalidTask,
    Task,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultStatus,
    signals,
)
from awa_django.backends.errors import task_errors
from awa_django.backends.loading import attribute_at
from awa_django.backends.stored import (
    StoredTask,
    attempt_worker_ids,
    plain_json,
    read_document,
    recorded_worker_ids,
    task_document,
    unwrap_result,
)
from awa_django.conf import get_awa_settings
from awa_django.db.enqueue import build_request, send_requests
from awa_django.exceptions import InvalidArgumentsError, JobValidationError
from awa_django.limits import (
    ATTEMPTS_RANGE,
    QUEUE_NAME_RE,
    check_queue_name,
    check_seconds,
    check_text,
    tag_tuple,
)
from awa_django.retry import RetryPolicy
from awa_django.sql import query
from awa_django.states import JobState
from awa_django.types import JobOptions, JobRequest
from awa_django.unique import states_tuple

__all__ = ["STATUS_OF_STATE", "AwaTask", "AwaTaskBackend", "resolve_stored", "resolve_task"]

#: How awa_django's eight states (and the DLQ) compress into django.tasks' four statuses.
STATUS_OF_STATE: Mapping[str, str] = {
    JobState.SCHEDULED: "READY",
    JobState.AVAILABLE: "READY",
    JobState.RETRYABLE: "READY",
    JobState.RUNNING: "RUNNING",
    JobState.WAITING_EXTERNAL: "RUNNING",
    JobState.COMPLETED: "SUCCESSFUL",
    JobState.FAILED: "FAILED",  # dead-lettered jobs too
    JobState.CANCELLED: "FAILED",
}

_OPTIONS = {"database", "max_attempts", "deadline", "tags", "retry"}


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class AwaTask(Task):  # type: ignore[type-arg]
    """A django.tasks ``Task`` with awa_django's options, set through ``@task(**kwargs)``
    (Django 6.1 and the backport): ``max_attempts``, ``deadline`` (seconds), ``tags``,
    ``retry`` (an ``awa_django.RetryPolicy``, stored with each job it enqueues), and the unique
    options below. ``None`` means the backend's ``OPTIONS`` default (for the unique options:
    not unique)."""

    max_attempts: int | None = None
    deadline: float | None = None
    tags: tuple[str, ...] | None = None
    #: Unique tasks (docs/jobs.md, "Unique jobs"): ``unique=True`` keys the task by its
    #: arguments, ``unique_key`` by any string (set it per call with ``dataclasses.replace``);
    #: a duplicate's ``enqueue`` returns the existing task's result, or raises
    #: ``DuplicateJobError`` with ``on_conflict="raise"``.
    unique: bool | None = None
    unique_key: str | None = None
    unique_for: float | None = None
    unique_states: tuple[str, ...] | None = None
    on_conflict: str | None = None
    retry: RetryPolicy | None = None


class AwaTaskBackend(BaseTaskBackend):
    """A django.tasks backend storing tasks as awa_django jobs (see the module docstring).

    OPTIONS: ``database`` (alias, default ``AWA["DATABASE_ALIAS"]``), ``max_attempts``
    (default 1: a task that raises is FAILED, as django.tasks expects; raise it to retry with
    backoff), ``deadline`` (seconds per attempt), ``tags``, ``retry`` (an
    ``awa_django.RetryPolicy`` or a mapping of its fields: the tasks' retry policy).
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
        # Kept as given: a str is not a list of tags (tag_tuple refuses it at enqueue, E103
        # reports it at check time) and must never be split into characters.
        self.tags: Any = self.options.get("tags", ())
        # Checked at enqueue (and by awa.E103), not here: a bad one must not stop start-up.
        self.retry: Any = self.options.get("retry")

    @property
    def alias_for_db(self) -> str:
        return self.database or get_awa_settings().DATABASE_ALIAS

    def validate_task(self, task: Task) -> None:  # type: ignore[type-arg]
        # Django compares the priority with its bounds first: a str would be a bare TypeError.
        if type(task.priority) is not int:
            raise InvalidTask(f"Priority must be an int, got {type(task.priority).__name__}.")
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
        unique_states = getattr(task, "unique_states", None)
        retry = getattr(task, "retry", None)
        return JobOptions(
            queue=task.queue_name,
            priority=task.priority,
            max_attempts=max_attempts,
            run_after=task.run_after,
            deadline=deadline,
            tags=tag_tuple(tags if tags is not None else self.tags),
            using=self.alias_for_db,
            unique=getattr(task, "unique", None) or False,
            unique_key=getattr(task, "unique_key", None),
            unique_for=getattr(task, "unique_for", None),
            unique_states=states_tuple(unique_states),
            on_conflict=getattr(task, "on_conflict", None) or "return",
            retry=RetryPolicy.from_option(retry if retry is not None else self.retry),
        )

    def _request(
        self,
        task: Task,  # type: ignore[type-arg]
        args: list[Any],
        kwargs: dict[str, Any],
    ) -> JobRequest:

        return build_request(
            task.module_path,
            args,
            kwargs,
            self._options(task),
            task_backend=self.alias,
            task_options=task_document(task, self.alias),
        )

    def enqueue(self, task: Task, args: Any, kwargs: Any) -> TaskResult:  # type: ignore[type-arg]
        """Write the task as a job in the caller's transaction; return its READY result.

        Arguments are normalised as Django normalises a ``TaskResult``'s (``OrderedDict``,
        tuples, ``TextChoices`` members...) and must then be JSON; anything else raises
        ``InvalidTask`` with nothing written. The result equals what ``get_result`` reads back
        until a worker picks the task up (``enqueued_at`` is the database's).
        """

        self.validate_task(task)
        args, kwargs = list(args), dict(kwargs)
        try:
            try:
                request = self._request(task, args, kwargs)
            except InvalidArgumentsError as refused:
                # Not plain JSON: normalised as Django normalises a TaskResult's, then again.
                try:
                    args, kwargs = plain_json(args), plain_json(kwargs)
                except (TypeError, ValueError):
                    raise refused from None
                request = self._request(task, args, kwargs)
        except JobValidationError as exc:
            raise InvalidTask(str(exc)) from exc
        [handle] = send_requests([request], request.using)
        if handle.duplicate:  # a unique task: nothing written, the holder's result instead
            return self.get_result(str(handle.id))
        with connections[request.using].cursor() as cursor:
            cursor.execute(query("task_enqueued_at"), [handle.id])
            row = cursor.fetchone()
        result: TaskResult = TaskResult(  # type: ignore[type-arg]
            task=task,
            id=str(handle.id),
            status=TaskResultStatus.READY,
            enqueued_at=row[0] if row is not None else None,
            started_at=None,
            finished_at=None,
            last_attempted_at=None,
            args=args,
            kwargs=kwargs,
            backend=self.alias,
            errors=[],
            worker_ids=[],
        )
        signals.task_enqueued.send(type(self), task_result=result)
        return result

    def get_result(self, result_id: str) -> TaskResult:  # type: ignore[type-arg]
        """The task's current result, read from every plane; ``TaskResultDoesNotExist`` when
        the id is unknown, not a task of this backend, or aged out of history.

        ``task`` is the task as it was enqueued (its backend, priority, queue and
        ``run_after``); ``errors`` has a ``TaskError`` per failed attempt whose class path
        imports (docs/tasks.md, "Errors"); ``worker_ids`` the worker of each attempt.
        """

        try:
            job_id = int(result_id)
        except (TypeError, ValueError):
            raise TaskResultDoesNotExist(result_id) from None
        with connections[self.alias_for_db].cursor() as cursor:
            cursor.execute(query("task_row"), [job_id])
            row = cursor.fetchone()
        if row is None:
            raise TaskResultDoesNotExist(result_id)
        kind, state, args, attempt, created, attempted, finalized = row[:7]
        errors, stored, progress, claims = (_json(v) for v in row[7:])
        args = _json(args)
        document = args.get("task") if isinstance(args, dict) else None
        if not isinstance(document, dict) or document.get("backend") != self.alias:
            raise TaskResultDoesNotExist(result_id)
        task = resolve_task(kind, document)
        if task is None:
            raise TaskResultDoesNotExist(result_id)
        status = TaskResultStatus(STATUS_OF_STATE[state])
        value, recorded = unwrap_result(stored)
        if status != TaskResultStatus.SUCCESSFUL:
            recorded = recorded_worker_ids(progress)
        result: TaskResult = TaskResult(  # type: ignore[type-arg]
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
            errors=task_errors(errors),
            worker_ids=attempt_worker_ids(attempt, claims, recorded),
        )
        if status == TaskResultStatus.SUCCESSFUL:
            object.__setattr__(result, "_return_value", value)
        return result

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
        for problem in self._option_problems():
            yield checks.Error(problem, id="awa.E103")

    def _option_problems(self) -> Iterable[str]:
        """What is wrong with OPTIONS and QUEUES, one sentence each (reported as awa.E103)."""
        max_attempts = self.options.get("max_attempts", 1)
        low, high = ATTEMPTS_RANGE
        if type(max_attempts) is not int or not low <= max_attempts <= high:
            yield f"OPTIONS['max_attempts'] must be an int in {low}..{high}."
        checks_of_options: list[tuple[str, Any]] = [
            ("deadline", lambda v: v is None or check_seconds("deadline", v)),
            ("tags", lambda v: [check_text("tags", t) for t in tag_tuple(v)]),
            ("retry", RetryPolicy.from_option),
        ]
        for name, check in checks_of_options:
            if name in self.options:
                try:
                    check(self.options[name])
                except JobValidationError as exc:
                    yield f"OPTIONS[{name!r}] is invalid: {exc}."
        for queue in sorted(self.queues, key=repr):
            try:
                check_queue_name(queue, "QUEUES")
            except JobValidationError as exc:
                yield f"{exc}."


def _json(value: Any) -> Any:
    # Django's psycopg adapters hand jsonb back as text (for JSONField to decode).
    return json.loads(value) if isinstance(value, str) else value


# Stored tasks back to Task objects ---------------------------------------------------------------


def _module_task(path: str) -> Any | None:
    """The ``Task`` object defined at ``path``, importing only installed apps' modules."""
    task = attribute_at(path)
    if not isinstance(task, TASK_CLASSES) or task.module_path != path:
        return None
    return task


def _with_options(task: Any, stored: StoredTask) -> Any:
    """``task`` with the stored options, as ``task.using(...)`` made it at enqueue.

    Built without validating again: a task enqueued before the backend's ``QUEUES`` changed
    still runs and reads back (the stored values are checked by ``read_document``).
    """
    changes: dict[str, Any] = {"backend": stored.backend, "run_after": stored.run_after}
    if stored.priority is not None:
        changes["priority"] = stored.priority
    if stored.queue_name is not None:
        changes["queue_name"] = stored.queue_name
    rebuilt = object.__new__(type(task))
    for field in dataclasses.fields(task):
        value = changes[field.name] if field.name in changes else getattr(task, field.name)
        object.__setattr__(rebuilt, field.name, value)
    return rebuilt


def resolve_stored(path: str, stored: StoredTask) -> Any | None:
    """The task at ``path`` with the ``stored`` options; None unless it is a ``Task`` of an
    installed app (or ``AWA["JOB_MODULES"]``) whose stored backend is an AwaTaskBackend."""
    task = _module_task(path)
    if task is None:
        return None
    rebuilt = _with_options(task, stored)
    try:
        backend = rebuilt.get_backend()
    except Exception:  # an alias that is not in TASKS, or a backend that fails to load
        return None
    return rebuilt if isinstance(backend, AwaTaskBackend) else None


def resolve_task(path: str, document: Any) -> Any | None:
    """The task stored as ``path`` with task document ``document``, as it was enqueued; None
    when it is not a ``Task`` of an installed app whose stored backend is an AwaTaskBackend.

    Modules outside the installed apps and ``AWA["JOB_MODULES"]`` are never imported.
    """
    stored = read_document(document)
    return None if stored is None else resolve_stored(path, stored)
