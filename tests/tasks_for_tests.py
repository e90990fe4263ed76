"""django.tasks tasks used by the backend tests (imported by workers through JOB_MODULES)."""

from __future__ import annotations

from typing import Any

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
    _note(task_result, f"finished:{task_result.status}")


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
