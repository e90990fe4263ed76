"""The Tasks framework awa_django plugs into: ``django.tasks`` (Django 6+) or the ``django-tasks``
backport (``django_tasks``, for Django 5.2). Both have the same API; only names moved."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
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
    "normalize_json",
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


def _normalize_json(obj: Any) -> Any:
    """Django 6's ``django.utils.json.normalize_json``, for the backport lines that lack it:
    mappings become dicts, other sequences lists, UTF-8 ``bytes`` text; ``str``, ``int``,
    ``float``, ``bool`` and ``None`` (subclasses included) pass as they are; anything else raises
    ``TypeError``."""
    match obj:
        case Mapping():
            return {_normalize_json(k): _normalize_json(v) for k, v in obj.items()}
        case bytes():
            try:
                return obj.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise ValueError(f"Unsupported value: {type(obj)}") from exc
        case str() | int() | float() | bool() | None:
            return obj
        case Sequence():
            return [_normalize_json(v) for v in obj]
        case _:
            raise TypeError(f"Unsupported type: {type(obj)}")


def _find_normalize_json() -> Callable[[Any], Any]:
    # Django 6's own; on 5.2 the backport's copy when it has one, else the one above.
    for module in ("django.utils.json", "django_tasks.utils"):
        try:
            found: Callable[[Any], Any] = importlib.import_module(module).normalize_json
        except (ImportError, AttributeError):
            continue
        return found
    return _normalize_json


#: ``normalize_json`` as Django applies it to a ``TaskResult``'s arguments and return value.
normalize_json = _find_normalize_json()
