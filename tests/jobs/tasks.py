"""django.tasks tasks used by the backend tests (imported by workers through JOB_MODULES)."""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import Any

from django.db import models
from django.dispatch import receiver

from awa_django.backends.compat import signals

try:
    from django.tasks import task
except ImportError:
    from django_tasks import task


def _note(task_result: Any, note: str) -> None:
    from tests.testapp.models import Ledger

    Ledger.objects.create(
        job_id=int(task_result.id),
        run_lease=0,
        attempt=len(task_result.worker_ids),
        queue="tasks",
        note=note,
    )


@receiver(signals.task_enqueued)
def _enqueued(sender: Any, task_result: Any, **kwargs: Any) -> None:
    _note(task_result, "enqueued")


@receiver(signals.task_started)
def _started(sender: Any, task_result: Any, **kwargs: Any) -> None:
    _note(task_result, "started")


@receiver(signals.task_finished)
def _finished(sender: Any, task_result: Any, **kwargs: Any) -> None:
    # The status, and the class of the last error when the task did not succeed.
    errors = task_result.errors
    failed = errors and task_result.status != "SUCCESSFUL"
    cause = f":{errors[-1].exception_class_path.rpartition('.')[2]}" if failed else ""
    _note(task_result, f"finished:{task_result.status}{cause}")


@task
def add(a: int, b: int) -> int:
    return a + b


@task(priority=10)
def shout(word: str) -> dict[str, Any]:
    return {"word": word.upper(), "letters": list(word)}


@task(takes_context=True)
def with_context(context: Any, value: int) -> dict[str, Any]:
    return {"attempt": context.attempt, "id": context.task_result.id, "value": value}


@task
async def async_add(a: int, b: int) -> int:
    return a + b


@task
def explode() -> None:
    raise ValueError("task exploded on purpose")


@task(queue_name="ordered")
def ordered(label: str) -> str:
    from tests.testapp.models import Ledger

    Ledger.objects.create(job_id=0, run_lease=0, attempt=0, queue="ordered", note=label)
    return label


@task(max_attempts=3)
def retried() -> None:
    raise RuntimeError("always fails")


# -- other backends, failures, signals, options as enqueued, normalisation, worker ids ------------


class Bail(BaseException):
    """A ``BaseException`` of the project's own (not an ``Exception``)."""


class Colour(models.TextChoices):
    RED = "red"


class Size(models.IntegerChoices):
    BIG = 3


@task
def exits(code: int) -> None:
    raise SystemExit(code)


@task
async def bails() -> None:
    raise Bail("bailing out")


@task(max_attempts=3)
def returns_set() -> Any:
    return {1, 2}


@task(max_attempts=2, takes_context=True)
def flaky(context: Any) -> int:
    if context.attempt == 1:
        raise RuntimeError("the first attempt fails")
    return int(context.attempt)


@task(max_attempts=3, takes_context=True)
def steered(context: Any) -> Any:
    """Chooses outcomes that are not errors: retry after 0 s, then cancel."""
    from awa_django import Cancel, RetryAfter

    return RetryAfter(0) if context.attempt == 1 else Cancel("enough")


@task(takes_context=True)
def introspect(context: Any) -> dict[str, Any]:
    """What the task sees of itself through its context."""
    result = context.task_result
    return {
        "priority": result.task.priority,
        "queue_name": result.task.queue_name,
        "run_after": result.task.run_after.isoformat() if result.task.run_after else None,
        "backend": result.task.backend,
        "enqueued_at": result.enqueued_at.isoformat() if result.enqueued_at else None,
        "worker_ids": list(result.worker_ids),
        "attempt": context.attempt,
    }


@task
def normalised(*args: Any, **kwargs: Any) -> Any:
    """Reports the types it received, and returns values that Django normalises."""
    return OrderedDict(
        [
            ("args", [type(a).__name__ for a in args]),
            ("kwargs", {k: type(v).__name__ for k, v in kwargs.items()}),
            ("echo", (args, kwargs)),
            ("colour", Colour.RED),
            ("size", Size.BIG),
        ]
    )


@task(queue_name="hang")
def hangs() -> None:
    """Runs until its worker is killed."""
    time.sleep(120)


def _local_error() -> type[Exception]:
    class LocalError(ValueError):
        pass

    return LocalError


@task
def raises_a_local_class() -> None:
    raise _local_error()("defined in a function")


@task(unique=True)
def unique_add(a: int, b: int) -> int:
    return a + b


# -- retry policies (tests/worker/test_worker_retry.py) --------------------------------------------

from awa_django import RetryPolicy  # noqa: E402


@task(max_attempts=3, retry=RetryPolicy("constant", base=900, jitter=0, retry_on=[KeyError]))
def picky_task(error: str) -> None:
    raise {"key": KeyError, "value": ValueError}[error](error)


# -- drained inside a test's transaction (tests/django/test_drain_keeps_the_test_transaction.py)


@task(queue_name="drained")
def records(label: str) -> str:
    """Writes a Ledger row through the ORM and returns its label."""
    from tests.testapp.models import Ledger

    Ledger.objects.create(job_id=0, run_lease=0, attempt=0, queue="drained", note=label)
    return label


@task(queue_name="drained")
async def records_async(label: str) -> str:
    from asgiref.sync import sync_to_async

    return str(await sync_to_async(records.func)(label))


@task(queue_name="drained")
async def explodes_async() -> None:
    raise ValueError("async task exploded on purpose")


@task(queue_name="drained")
def leaves_a_transaction_open(label: str) -> str:
    """Enters an atomic block, writes, and returns without leaving it."""
    from django.db import transaction

    transaction.atomic().__enter__()
    records.func(label)
    return "returned"


@task(queue_name="drained")
def fails_a_statement(label: str) -> None:
    """Writes, then runs a statement that fails outside any atomic block of its own."""
    from django.db import connection

    records.func(label)
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1 / 0")


# -- tasks the worker could not find by their path (tests/django/test_tasks_enqueue_readable.py)


def not_a_task(value: int) -> int:
    """A plain function: the task below is bound to another name, so its path names this."""
    return value


bound_to_another_name = task(not_a_task)
