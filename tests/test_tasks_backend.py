"""django.tasks on awa_django: the semantics django-tasks checks for its own backends."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime, timedelta

import pytest
from django.db import transaction
from django.test import override_settings
from django.utils import timezone

from awa_django.backends.compat import InvalidTask, TaskResultDoesNotExist, TaskResultStatus
from awa_django.backends.tasks import AwaTaskBackend
from tests import tasks_for_tests as t
from tests.helpers import ManagedProcess, wait_for
from tests.storage_support import enqueue_sql, pg
from tests.testapp.models import Ledger

pytestmark = [pytest.mark.worker, pytest.mark.usefixtures("clean_awa")]

Start = Callable[..., ManagedProcess]


def run_worker(start: Start, *queues: str) -> None:
    args = [arg for q in (queues or ("default",)) for arg in ("--queue", q)]
    proc = start("awa_worker", "--burst", *args)
    wait_for(
        lambda: proc.proc.poll() is not None,
        timeout=60,
        message=lambda: f"the burst worker to finish:\n{proc.output()}",
    )
    assert proc.proc.returncode == 0, proc.output()


def test_backend_flags() -> None:
    backend = t.add.get_backend()
    assert isinstance(backend, AwaTaskBackend)
    assert backend.supports_defer and backend.supports_async_task
    assert backend.supports_get_result and backend.supports_priority


def test_enqueue_and_get_result_before_and_after_running(manage_py: Start) -> None:
    result = t.add.enqueue(2, 3)
    assert result.status == TaskResultStatus.READY
    assert result.args == [2, 3] and result.kwargs == {}
    fetched = t.add.get_result(result.id)
    assert (fetched.status, fetched.attempts, fetched.is_finished) == (
        TaskResultStatus.READY,
        0,
        False,
    )
    run_worker(manage_py)
    done = t.add.get_result(result.id)
    assert done.status == TaskResultStatus.SUCCESSFUL
    assert done.return_value == 5
    assert done.attempts == 1 and len(done.worker_ids) == 1
    assert done.enqueued_at is not None and done.finished_at is not None
    assert done.started_at is not None and done.finished_at >= done.started_at
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL and result.return_value == 5


def test_return_values_round_trip_through_json(manage_py: Start) -> None:
    result = t.shout.enqueue("hi")
    run_worker(manage_py)
    assert t.shout.get_result(result.id).return_value == {"word": "HI", "letters": ["h", "i"]}


def test_context_async_and_signals(manage_py: Start) -> None:
    ctx = t.with_context.enqueue(7)
    aio = t.async_add.enqueue(1, 2)
    run_worker(manage_py)
    value = t.with_context.get_result(ctx.id).return_value
    assert value == {"attempt": 1, "id": ctx.id, "value": 7}
    assert t.async_add.get_result(aio.id).return_value == 3
    notes = sorted(Ledger.objects.filter(job_id=int(ctx.id)).values_list("note", flat=True))
    assert notes == ["enqueued", "finished:SUCCESSFUL", "started"]


def test_exception_gives_failed_with_traceback_and_class(manage_py: Start) -> None:
    result = t.explode.enqueue()
    run_worker(manage_py)
    failed = t.explode.get_result(result.id)
    assert failed.status == TaskResultStatus.FAILED
    assert failed.attempts == 1
    [error] = failed.errors
    assert error.exception_class_path == "builtins.ValueError"
    assert error.exception_class is ValueError
    assert "task exploded on purpose" in error.traceback
    with pytest.raises(ValueError):
        _ = failed.return_value


def test_backend_options_through_task_kwargs(manage_py: Start) -> None:
    result = t.retried.enqueue()
    with pg() as conn:
        row = conn.execute(
            "SELECT max_attempts FROM awa.jobs WHERE id = %s", [int(result.id)]
        ).fetchone()
    assert row == (3,)


def test_run_after_defers() -> None:
    later = t.add.using(run_after=timezone.now() + timedelta(hours=1)).enqueue(1, 1)
    with pg() as conn:
        row = conn.execute("SELECT state FROM awa.jobs WHERE id = %s", [int(later.id)]).fetchone()
    assert row == ("scheduled",)
    assert t.add.get_result(later.id).status == TaskResultStatus.READY


def test_priority_order(manage_py: Start) -> None:
    t.ordered.using(priority=-5).enqueue("low")
    t.ordered.using(priority=50).enqueue("high")
    t.ordered.enqueue("normal")
    proc = manage_py("awa_worker", "--burst", "--queue", "ordered=1")
    wait_for(lambda: proc.proc.poll() is not None, timeout=60, message="the worker")
    assert list(
        Ledger.objects.filter(queue="ordered").order_by("id").values_list("note", flat=True)
    ) == ["high", "normal", "low"]


def test_invalid_tasks_are_rejected() -> None:
    from tests.tasks_for_tests import task

    with pytest.raises(InvalidTask):

        @task
        def nested() -> None: ...

    with pytest.raises(InvalidTask):
        t.add.using(priority=500)
    with pytest.raises(InvalidTask):
        t.add.using(run_after=datetime(2030, 1, 1))
    with pytest.raises(InvalidTask):
        t.add.using(queue_name="Not Valid")
    with (
        override_settings(
            TASKS={
                "default": {
                    "BACKEND": "awa_django.backends.tasks.AwaTaskBackend",
                    "QUEUES": ["default"],
                }
            }
        ),
        pytest.raises(InvalidTask),
    ):
        t.add.using(queue_name="elsewhere")


def test_rolled_back_task_never_runs(manage_py: Start) -> None:
    with pytest.raises(RuntimeError), transaction.atomic():
        rolled = t.add.enqueue(1, 1)
        raise RuntimeError("rollback")
    with pytest.raises(TaskResultDoesNotExist):
        t.add.get_result(rolled.id)
    run_worker(manage_py)
    with pytest.raises(TaskResultDoesNotExist):
        t.add.get_result(rolled.id)


def test_unknown_ids_raise() -> None:
    for bad in ("999999999", "not-a-number"):
        with pytest.raises(TaskResultDoesNotExist):
            t.add.get_result(bad)


def test_stored_path_naming_a_plain_function_is_refused(manage_py: Start) -> None:
    doc = {"args": [["touch", "/tmp/awa-pwned"]], "kwargs": {}, "task": {"backend": "default"}}
    with pg() as conn:
        [(evil, _)] = enqueue_sql(
            conn, json.dumps([{"kind": "subprocess.check_output", "queue": "default", "args": doc}])
        )
        [(outside, _)] = enqueue_sql(
            conn, json.dumps([{"kind": "http.server.test", "queue": "default", "args": doc}])
        )
    run_worker(manage_py)
    import os

    assert not os.path.exists("/tmp/awa-pwned")
    with pg() as conn:
        rows = dict(
            conn.execute(
                "SELECT id, errors FROM awa.jobs WHERE id = ANY(%s)", [[evil, outside]]
            ).fetchall()
        )
    for job_id in (evil, outside):
        assert rows[job_id][-1]["type"] == "awa_django.SuspiciousTask"
        assert "refused without running it" in rows[job_id][-1]["message"]


def test_backend_check_reports_misconfiguration() -> None:
    backend = AwaTaskBackend("x", {"OPTIONS": {"database": "nope", "colour": "red"}})
    ids = {m.id for m in backend.check()}
    assert ids == {"awa.E102", "awa.E103"}
    assert list(AwaTaskBackend("y", {"OPTIONS": {}}).check()) == []


def test_worker_serves_the_queues_of_tasks_backends_by_default() -> None:
    from django.test import override_settings

    from awa_django.worker.config import build_config

    tasks = {
        "default": {
            "BACKEND": "awa_django.backends.tasks.AwaTaskBackend",
            "QUEUES": ["default", "reports", "Bad Name"],
        }
    }
    with override_settings(TASKS=tasks):
        names = {q.name for q in build_config().queues}
    assert {"default", "reports"} <= names and "Bad Name" not in names
