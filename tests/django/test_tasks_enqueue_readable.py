"""Every id ``AwaTaskBackend.enqueue`` returns can be read back (``get_result``,
``result.refresh()``) before any worker runs. A task the worker could not find again by its
path (it would fail it as suspicious, unrun) is refused at enqueue with ``InvalidTask``:
nothing written, no ``task_enqueued`` sent, the caller's transaction still usable."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.db import connection
from django.test import override_settings

from awa_django.backends.compat import InvalidTask, TaskResultStatus
from tests.jobs import tasks as t
from tests.jobs.tasks import task
from tests.testapp.models import Ledger, Order

pytestmark = pytest.mark.django_db


@task
def defined_in_a_test_module() -> None:
    """At module level, but of a module that is neither an installed app's nor in
    ``AWA["JOB_MODULES"]``: imported here, never by a worker."""


def _function_in(module: str, qualname: str) -> Callable[..., Any]:
    """A function made in a local scope that claims to be ``module.qualname``; Django's own
    check (no ``<locals>`` in the name) lets it through."""

    def made_here() -> None:
        pass

    made_here.__module__ = module
    made_here.__qualname__ = made_here.__name__ = qualname
    return made_here


UNRESOLVABLE: dict[str, tuple[Callable[[], Any], str]] = {
    "a module that does not exist": (
        lambda: task(_function_in("missing", "func")),
        "not defined in a module of an installed app",
    ),
    "a module that is imported but not an installed app's": (
        lambda: defined_in_a_test_module,
        "not defined in a module of an installed app",
    ),
    "a module attribute that is not a task": (
        lambda: t.bound_to_another_name,
        "is not the task found at that path",
    ),
    "a local function named like nothing in its module": (
        lambda: task(_function_in("tests.jobs.tasks", "made_in_a_function")),
        "is not the task found at that path",
    ),
    "a local function named like another task": (
        lambda: task(_function_in("tests.jobs.tasks", "add")),
        "is not the task found at that path",
    ),
}


def jobs_written() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM awa.jobs")
        row = cursor.fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.parametrize("make", list(UNRESOLVABLE.values()), ids=list(UNRESOLVABLE))
@pytest.mark.parametrize("enqueue", ["enqueue", "aenqueue"])
def test_a_task_the_worker_could_not_find_again_is_refused_at_enqueue(
    make: tuple[Callable[[], Any], str], enqueue: str
) -> None:
    build, reason = make
    unresolvable = build()
    order = Order.objects.create(note="the caller's row")
    jobs, notes = jobs_written(), Ledger.objects.count()
    call = unresolvable.enqueue if enqueue == "enqueue" else async_to_sync(unresolvable.aenqueue)
    with pytest.raises(InvalidTask, match=reason) as refused:
        call()
    assert repr(unresolvable.module_path) in str(refused.value)
    assert jobs_written() == jobs  # nothing written
    assert Ledger.objects.count() == notes  # no task_enqueued
    assert Order.objects.filter(pk=order.pk).exists()  # the transaction is still usable


@pytest.mark.parametrize(
    ("make", "args"),
    [
        (lambda: t.add, (1, 2)),
        (lambda: t.async_add, (1, 2)),
        (lambda: t.with_context, (3,)),
        (lambda: t.add.using(priority=7, queue_name="elsewhere"), (1, 2)),
        (lambda: dataclasses.replace(t.add, max_attempts=3), (1, 2)),
    ],
    ids=["sync", "async", "with context", "using", "replaced options"],
)
def test_every_id_enqueue_returns_reads_back_before_any_worker_runs(
    make: Callable[[], Any], args: tuple[int, ...]
) -> None:
    enqueued_task = make()
    result = enqueued_task.enqueue(*args)
    read = enqueued_task.get_result(result.id)
    assert read.status == TaskResultStatus.READY and read.task.func is enqueued_task.func
    assert (read.task.priority, read.task.queue_name) == (
        enqueued_task.priority,
        enqueued_task.queue_name,
    )
    assert (read.args, read.enqueued_at) == (result.args, result.enqueued_at)
    result.refresh()
    assert result.status == TaskResultStatus.READY


def test_a_task_enqueued_on_another_awa_backend_reads_back_through_it() -> None:
    from tests.settings_tasks import TASKS

    with override_settings(TASKS=TASKS):
        on_secondary = t.add.using(backend="secondary")
        result = on_secondary.enqueue(2, 3)
        assert on_secondary.get_result(result.id).status == TaskResultStatus.READY
        result.refresh()
        assert result.backend == "secondary"
