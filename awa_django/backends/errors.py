"""Failures as django.tasks reports them: a ``TaskError`` per failed attempt.

A job's ``errors`` are written by the worker (an exception's ``module.qualname``, message and
traceback tail), and by awa_django's own SQL and checks for failures that have no Python
exception: a rescued attempt, an operator's cancel, a refused task. ``task_error`` maps each
entry to a ``TaskError`` whose ``exception_class_path`` imports (``.exception_class`` works):
awa_django's own failure kinds become the classes of ``awa_django.exceptions`` that name them, and
an entry without a Python traceback (awa_django's own kinds mostly) gets a short text that says
so and ends like one (``module.Class: message``). Outcomes a handler chose, that are not errors
(``RetryAfter``, ``Cancel``), are no ``TaskError`` at all.
"""

from __future__ import annotations

import builtins
import sys
import traceback
from collections.abc import Iterable, Mapping
from typing import Any

from awa_django import exceptions
from awa_django.backends.compat import TaskError
from awa_django.backends.loading import attribute_at

__all__ = [
    "NOT_ERRORS",
    "exception_error",
    "path_of",
    "task_error",
    "task_errors",
]

#: Stored types of outcomes a handler chose (not failures): no TaskError is made of them.
NOT_ERRORS = frozenset({"awa_django.RetryAfter", "awa_django.Cancel"})

# Types awa_django stores for its own failure kinds (executor, SQL, operations).
_KINDS: Mapping[str, type[BaseException]] = {
    "awa_django.SuspiciousTask": exceptions.SuspiciousTask,
    "awa_django.UnknownKind": exceptions.UnknownKindError,
    "awa_django.InvalidArguments": exceptions.InvalidArgumentsError,
    "awa_django.InvalidJob": exceptions.InvalidJobError,
    "awa_django.InvalidOutcome": exceptions.InvalidOutcomeError,
    "awa_django.InvalidCallback": exceptions.InvalidCallbackError,
    "awa_django.CallbackError": exceptions.CallbackError,
    "Cancelled": exceptions.JobCancelled,
}

# awa_django.Rescued entries, by the reason maintenance records (awa.rescue_v1).
_RESCUES: Mapping[str, type[BaseException]] = {
    "heartbeat stale: worker presumed dead": exceptions.HeartbeatStale,
    "hard deadline exceeded": exceptions.DeadlineExceeded,
    "callback timed out": exceptions.CallbackTimedOut,
}

# Bare class names the executor records for refused outcomes ("InvalidArgumentsError"...).
_OWN: Mapping[str, type[BaseException]] = {
    name: cls
    for name in exceptions.__all__
    if isinstance(cls := getattr(exceptions, name), type) and issubclass(cls, BaseException)
}


def path_of(cls: type[BaseException]) -> str:
    """``module.qualname`` of an exception class, as django.tasks records it."""
    return f"{cls.__module__}.{cls.__qualname__}"


_RECORDED = path_of(exceptions.RecordedError)


def _names(cls: type[BaseException]) -> bool:
    """True when ``import_string(path_of(cls))`` gives ``cls`` back: a class defined at the top
    level of its module (not in a function, not nested, not renamed)."""
    module = sys.modules.get(cls.__module__)
    name = cls.__qualname__
    return module is not None and name.isidentifier() and getattr(module, name, None) is cls


def _recorded_class_imports(kind: str) -> bool:
    """True when ``kind`` (``module.Class`` as the worker recorded it) names an exception class
    that ``import_string`` finds. Only modules already imported, or of an installed app or
    ``AWA["JOB_MODULES"]``, are imported."""

    found = attribute_at(kind)
    return isinstance(found, type) and issubclass(found, BaseException)


def exception_error(exc: BaseException) -> TaskError:
    """The ``TaskError`` of an exception, as Django's reference backends build it; an exception
    whose class does not import (one defined in a function, say) is named ``RecordedError``,
    as its stored entry reads back, and the traceback names the class."""
    cls = type(exc)
    return TaskError(
        exception_class_path=path_of(cls) if _names(cls) else _RECORDED,
        traceback="".join(traceback.format_exception(exc)),
    )


def _class_path(kind: str, message: str) -> str:
    """An importable exception class path for a stored error type."""
    if kind == "awa_django.Rescued":
        return path_of(_RESCUES.get(message, exceptions.AttemptRescued))
    module, _, name = kind.rpartition(".")
    mapped = _KINDS.get(kind) or (_OWN.get(name) if module in ("", "awa_django") else None)
    if mapped is not None:
        return path_of(mapped)
    if module == "awa_django":
        return _RECORDED  # a kind of awa_django's that names no class of its own
    if module:
        # An exception's module.qualname, as the worker recorded it, if it imports (a class
        # defined in a function does not: RecordedError, the traceback names it).
        return kind if _recorded_class_imports(kind) else _RECORDED
    builtin = getattr(builtins, kind, None) if kind else None
    if isinstance(builtin, type) and issubclass(builtin, BaseException):
        return f"builtins.{kind}"
    return _RECORDED


def task_error(entry: Mapping[str, Any]) -> TaskError | None:
    """The ``TaskError`` of one stored error entry, or None for an outcome that is no error.

    Never raises. The path always imports for awa_django's own kinds and builtins; an
    exception class of the project's code is named as recorded (``module.qualname``).
    """
    kind = str(entry.get("type") or "")
    if kind in NOT_ERRORS:
        return None
    message = str(entry.get("message") or "")
    path = _class_path(kind, message)
    text = str(entry.get("traceback") or "")
    if not text:
        unnamed = path == _RECORDED and kind
        when = ", ".join(
            f"{key} {entry[key]}" for key in ("attempt", "at") if entry.get(key) is not None
        )
        text = (
            "No Python traceback was recorded for this failure"
            + (f" ({when})" if when else "")
            + f".\n{path}: {f'{kind}: {message}' if unnamed else message}\n"
        )
    return TaskError(exception_class_path=path, traceback=text)


def task_errors(entries: Iterable[Any] | None) -> list[TaskError]:
    """The ``TaskError`` list of a job's stored errors, oldest first (outcomes left out)."""
    errors: list[TaskError] = []
    for entry in entries or ():
        if isinstance(entry, Mapping):
            error = task_error(entry)
            if error is not None:
                errors.append(error)
    return errors
