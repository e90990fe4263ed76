"""The Tasks framework awa_django plugs into: ``django.tasks`` (Django 6+) or the ``django-tasks``
backport (``django_tasks``, for Django 5.2). Both have the same API; only names moved."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from django_tasks import signals
    from django_tasks.backends.base import BaseTaskBackend
    from django_tasks.base import Task, TaskContext, TaskError, TaskResult, TaskResultStatus
    from django_tasks.exceptions import InvalidTaskError as InvalidTask
    from django_tasks.exceptions import TaskResultDoesNotExist
else:
    try:
        from django.tasks import signals
        from django.tasks.backends.base import BaseTaskBackend
        from django.tasks.base import Task, TaskContext, TaskError, TaskResult, TaskResultStatus
        from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
    except ImportError:
        from django_tasks import signals
        from django_tasks.backends.base import BaseTaskBackend
        from django_tasks.base import Task, TaskContext, TaskError, TaskResult, TaskResultStatus
        from django_tasks.exceptions import InvalidTaskError as InvalidTask
        from django_tasks.exceptions import TaskResultDoesNotExist

__all__ = [
    "TASK_CLASSES",
    "BaseTaskBackend",
    "InvalidTask",
    "Task",
    "TaskContext",
    "TaskError",
    "TaskResult",
    "TaskResultDoesNotExist",
    "TaskResultStatus",
    "signals",
]


def _task_classes() -> tuple[type[Any], ...]:
    # Both modules side by side (as the backport requires): a worker accepts Task objects of
    # either, whichever the project's code was written against.
    classes: list[type[Any]] = [Task]
    for module in ("django.tasks.base", "django_tasks.base"):
        try:
            other = __import__(module, fromlist=["Task"]).Task
        except ImportError:
            continue
        if other not in classes:
            classes.append(other)
    return tuple(classes)


TASK_CLASSES = _task_classes()
