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
suspicious, without running it (awa_django/backends/runner.py); ``enqueue`` refuses such a task
(``InvalidTask``, nothing written), so every id it returns reads back. ``get_result`` rebuilds
the task as it was enqueued, reports every failure with an importable exception class
(awa_django/backends/errors.py) and the worker of every attempt (awa_django/backends/stored.py).
"""

from __future__ import annotations

import dataclasses
import difflib
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
from awa_django.backends.loading import attribute_at, importable_module
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

    def _refuse_unresolvable(self, task: Task) -> None:  # type: ignore[type-arg]
        """``InvalidTask`` unless the worker (and ``get_result``) will find ``task`` again by
        its ``module_path``: a ``Task`` of that function, bound to the function's own name in
        a module of an installed app or of ``AWA["JOB_MODULES"]``. Anything else would be
        written, then refused by the worker as suspicious and unreadable by ``get_result``.

        Not part of ``validate_task``: ``@task`` validates before the module binds the name."""
        path = task.module_path
        module = path.rpartition(".")[0]
        if not importable_module(module):
            raise InvalidTask(
                f"Task {path!r} is not defined in a module of an installed app or of "
                "AWA['JOB_MODULES']: awa_worker would refuse to run it and get_result could "
                "not read it back. Define it in a module of an installed app (its tasks.py), "
                "or list its module in AWA['JOB_MODULES']."
            )
        found = _module_task(path)
        if found is None or found.func is not task.func:
            raise InvalidTask(
                f"Task {path!r} is not the task found at that path (a task is found again by "
                "its function's module and name, so awa_worker could not run it and get_result "
                "could not read it back). Define it with @task at the top level of its module, "
                "under its function's own name."
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
        ``InvalidTask`` with nothing written. So does a task the worker could not find again
        by its path (defined outside the installed apps and ``AWA["JOB_MODULES"]``, in a
        function, or under another name): every id ``enqueue`` returns can be read back.
        The result equals what ``get_result`` reads back until a worker picks the task up
        (``enqueued_at`` is the database's).
        """

        self.validate_task(task)
        self._refuse_unresolvable(task)
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
        """awa.E101: app not installed; awa.E102: alias not PostgreSQL; awa.E103: bad OPTIONS
        or QUEUES. As in Django's own checks, ``msg`` says what is wrong and ``hint`` what to
        do about it."""
        from django.apps import apps
        from django.conf import settings

        if not apps.is_installed("awa_django"):
            yield checks.Error(
                f"TASKS[{self.alias!r}] uses AwaTaskBackend, but awa_django is not in "
                "INSTALLED_APPS.",
                hint="Add 'awa_django' to INSTALLED_APPS and run manage.py migrate: the backend "
                "stores tasks in awa_django's tables and awa_worker runs them.",
                id="awa.E101",
            )
        # Without OPTIONS["database"] the alias is AWA["DATABASE_ALIAS"], which awa.E001/E002
        # already check; only an explicit alias is checked here.
        alias = self.database
        use_default = "or remove OPTIONS['database'] to use AWA['DATABASE_ALIAS']"
        if alias is None:
            pass
        elif alias not in settings.DATABASES:
            yield checks.Error(
                f"TASKS[{self.alias!r}]: OPTIONS['database'] is {alias!r}, which is not in "
                f"DATABASES (aliases: {', '.join(map(str, settings.DATABASES)) or 'none'}).",
                hint=f"Name a PostgreSQL alias of DATABASES, {use_default}.",
                id="awa.E102",
            )
        elif connections[alias].vendor != "postgresql":
            yield checks.Error(
                f"TASKS[{self.alias!r}]: OPTIONS['database'] is {alias!r}, a "
                f"{connections[alias].vendor} database; AwaTaskBackend needs PostgreSQL.",
                hint="Name an alias whose ENGINE is 'django.db.backends.postgresql', "
                f"{use_default}.",
                id="awa.E102",
            )
        for problem, hint in self._option_problems():
            yield checks.Error(f"TASKS[{self.alias!r}]: {problem}", hint=hint, id="awa.E103")

    def _option_problems(self) -> Iterable[tuple[str, str]]:
        """What is wrong with OPTIONS and QUEUES and what to do about it, one (message, hint)
        each (reported as awa.E103)."""
        unknown = sorted(set(self.options) - _OPTIONS, key=repr)
        if unknown:
            close = [
                f"{match[0]!r} for {key!r}"
                for key in unknown
                if isinstance(key, str)
                and (match := difflib.get_close_matches(key, sorted(_OPTIONS), 1))
            ]
            meant = f" (did you mean {', '.join(close)}?)" if close else ""
            yield (
                f"unknown OPTIONS {', '.join(map(repr, unknown))}.",
                f"Remove or rename them{meant}; the known OPTIONS are "
                f"{', '.join(map(repr, sorted(_OPTIONS)))} (docs/tasks.md, 'Options').",
            )
        max_attempts = self.options.get("max_attempts", 1)
        low, high = ATTEMPTS_RANGE
        if type(max_attempts) is not int or not low <= max_attempts <= high:
            yield (
                f"OPTIONS['max_attempts'] is {max_attempts!r}, not an int in {low}..{high}.",
                f"Give an int in {low}..{high} (attempts before a task is FAILED), or remove it "
                "for the default, 1.",
            )
        checks_of_options: list[tuple[str, Any, str]] = [
            (
                "deadline",
                lambda v: v is None or check_seconds("deadline", v),
                "Give one attempt's time limit as a positive number of seconds, or None.",
            ),
            (
                "tags",
                lambda v: [check_text("tags", t) for t in tag_tuple(v)],
                "Give a list of strings, such as ['billing'] (one string is not a list).",
            ),
            (
                "retry",
                RetryPolicy.from_option,
                "Give an awa_django.RetryPolicy or a dict of its fields (docs/retries.md, "
                "'Retry policies'), or remove it.",
            ),
        ]
        for name, check, hint in checks_of_options:
            if name in self.options:
                try:
                    check(self.options[name])
                except JobValidationError as exc:
                    yield f"OPTIONS[{name!r}] is invalid: {exc}.", hint
        for queue in sorted(self.queues, key=repr):
            try:
                check_queue_name(queue, "QUEUES")
            except JobValidationError as exc:
                yield (
                    f"{exc}.",
                    "Rename the queue (1-63 characters of a-z 0-9 _ . -), or give QUEUES = [] "
                    "to accept any valid queue name.",
                )


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
