"""django.tasks on awa_django: the semantics django-tasks checks for its own backends."""

from __future__ import annotations

import json
import math
import signal
import uuid
from collections import OrderedDict
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.db import transaction
from django.test import override_settings
from django.utils import timezone

from awa_django.backends.compat import (
    InvalidTask,
    TaskError,
    TaskResultDoesNotExist,
    TaskResultStatus,
)
from awa_django.backends.tasks import AwaTaskBackend
from awa_django.db import storage
from awa_django.db.storage import Finalization
from tests.jobs import tasks as t
from tests.jobs import worker_env
from tests.support.database import pg
from tests.support.factories import WORKER, enqueue_sql
from tests.support.polling import wait_for
from tests.support.processes import ManagedProcess
from tests.testapp.models import Ledger

pytestmark = [pytest.mark.worker, pytest.mark.usefixtures("clean_awa")]

Start = Callable[..., ManagedProcess]


def worker(
    start: Start,
    *queues: str,
    burst: bool = False,
    settings: str | None = None,
    overrides: dict[str, Any] | None = None,
) -> ManagedProcess:
    """An ``awa_worker`` of ``queues`` (default: ``default``), with other settings if asked."""
    env = {"DJANGO_SETTINGS_MODULE": settings} if settings else {}
    env.update(worker_env(**(overrides or {})))
    args = [arg for q in (queues or ("default",)) for arg in ("--queue", q)]
    return start("awa_worker", *(["--burst"] if burst else []), *args, extra_env=env or None)


def run_worker(start: Start, *queues: str, **options: Any) -> None:
    proc = worker(start, *queues, burst=True, **options)
    wait_for(
        lambda: proc.proc.poll() is not None,
        timeout=60,
        message=lambda: f"the burst worker to finish:\n{proc.output()}",
    )
    assert proc.proc.returncode == 0, proc.output()


def stop(proc: ManagedProcess) -> None:
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0, proc.output()


def result_of(result_id: str) -> Any:
    """The result of any task of the default backend."""
    return t.add.get_backend().get_result(result_id)


def finished(*ids: str) -> bool:
    return all(result_of(i).is_finished for i in ids)


def notes(job_id: str) -> list[str]:
    """What the signal receivers of tests/jobs/tasks.py noted for a task, in order."""
    rows = Ledger.objects.filter(job_id=int(job_id)).order_by("id")
    return [f"{r.attempt}:{r.note}" for r in rows]


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
    from tests.jobs.tasks import task

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


# -- other backends, failures, signals, options as enqueued, normalisation, worker ids ------------

SECONDARY = "tests.settings_tasks"


def test_a_task_enqueued_on_a_secondary_backend_runs_there_and_is_found_only_there(
    manage_py: Start,
) -> None:
    from tests.settings_tasks import TASKS

    with override_settings(TASKS=TASKS):
        on_secondary = t.add.using(backend="secondary")
        result = on_secondary.enqueue(2, 3)
        assert result.backend == "secondary" and result.task == on_secondary
        run_worker(manage_py, settings=SECONDARY)
        done = on_secondary.get_result(result.id)
        assert (done.status, done.return_value) == (TaskResultStatus.SUCCESSFUL, 5)
        assert done.task == on_secondary and done.backend == "secondary"
        result.refresh()
        assert result.status == TaskResultStatus.SUCCESSFUL
        with pytest.raises(TaskResultDoesNotExist):
            t.add.get_result(result.id)  # the default backend's results are its own


def test_a_stored_task_naming_a_backend_that_is_not_awa_is_refused(manage_py: Start) -> None:
    from tests.settings_tasks import TASKS

    rows = [
        {
            "kind": "tests.jobs.tasks.ordered",
            "queue": "ordered",
            "args": {"args": [f"pwned-{alias}"], "kwargs": {}, "task": {"backend": alias}},
        }
        for alias in ("immediate", "nope", "")
    ]
    with pg() as conn:
        ids = [job_id for job_id, _ in enqueue_sql(conn, json.dumps(rows))]
    run_worker(manage_py, "ordered", settings=SECONDARY)
    assert not Ledger.objects.filter(note__startswith="pwned").exists()
    with pg() as conn:
        found = conn.execute(
            "SELECT state, errors FROM awa.jobs WHERE id = ANY(%s)", [ids]
        ).fetchall()
    assert [(state, errors[-1]["type"]) for state, errors in found] == [
        ("failed", "awa_django.SuspiciousTask")
    ] * 3
    with override_settings(TASKS=TASKS):
        for job_id in ids:
            with pytest.raises(TaskResultDoesNotExist):
                t.ordered.get_result(str(job_id))


def test_a_task_raising_system_exit_or_another_base_exception_fails_and_the_worker_goes_on(
    manage_py: Start,
) -> None:
    exits = t.exits.enqueue(3)
    bails = t.bails.enqueue()
    later = t.add.enqueue(1, 1)
    run_worker(manage_py)  # exits 0: neither task stopped the worker
    for task, result, cls in ((t.exits, exits, SystemExit), (t.bails, bails, t.Bail)):
        failed = task.get_result(result.id)
        assert failed.status == TaskResultStatus.FAILED and failed.attempts == 1
        [error] = failed.errors
        assert error.exception_class is cls
        assert "Traceback (most recent call last)" in error.traceback
        assert notes(result.id)[-1] == f"1:finished:FAILED:{cls.__name__}"
    assert t.add.get_result(later.id).return_value == 2


def test_an_exception_class_defined_in_a_function_is_recorded_under_an_importable_path(
    manage_py: Start,
) -> None:
    from awa_django.exceptions import RecordedError

    result = t.raises_a_local_class.enqueue()
    run_worker(manage_py)
    failed = t.raises_a_local_class.get_result(result.id)
    assert failed.status == TaskResultStatus.FAILED
    [error] = failed.errors
    # import_string cannot find "tests.jobs.tasks._local_error.<locals>.LocalError".
    assert error.exception_class is RecordedError
    assert "LocalError: defined in a function" in error.traceback
    # task_finished named the same class as the stored result reads back.
    assert notes(result.id)[-1] == "1:finished:FAILED:RecordedError"


def test_a_return_value_that_is_not_json_fails_at_once_with_an_importable_error(
    manage_py: Start,
) -> None:
    from awa_django.exceptions import InvalidResultError

    result = t.returns_set.enqueue()  # max_attempts=3, but such a value is not retried
    run_worker(manage_py)
    failed = t.returns_set.get_result(result.id)
    assert failed.status == TaskResultStatus.FAILED and failed.attempts == 1
    [error] = failed.errors
    assert error.exception_class_path == "awa_django.exceptions.InvalidResultError"
    assert error.exception_class is InvalidResultError
    assert "Traceback (most recent call last)" in error.traceback
    assert "is a set, which is not JSON" in error.traceback


def test_every_recorded_failure_kind_names_an_importable_exception_and_a_traceback() -> None:
    from awa_django import exceptions as e
    from awa_django.backends.errors import task_error

    def entry(kind: str, message: str) -> dict[str, Any]:
        return {"type": kind, "message": message, "attempt": 2, "at": "2030-01-01T00:00:00Z"}

    # What the worker, awa_django's SQL and resolve_callback store for failures of their own.
    recorded = {
        "awa_django.SuspiciousTask": ("'x.y' is not a task", e.SuspiciousTask),
        "awa_django.UnknownKind": ("job kind 'x' is not registered", e.UnknownKindError),
        "awa_django.InvalidArguments": ("cannot be decoded", e.InvalidArgumentsError),
        "awa_django.InvalidJob": ("could not be prepared", e.InvalidJobError),
        "awa_django.InvalidOutcome": ("could not be recorded", e.InvalidOutcomeError),
        "awa_django.InvalidCallback": ("needs ctx.callback_id", e.InvalidCallbackError),
        "awa_django.CallbackError": ("the payment was declined", e.CallbackError),
        "Cancelled": ("queue drained", e.JobCancelled),
        "InvalidArgumentsError": ("result: is a set", e.InvalidArgumentsError),
        "LimitExceededError": ("result: too big", e.LimitExceededError),
        "InvalidOptionError": ("seconds: not finite", e.InvalidOptionError),
        "awa_django.TerminalError": ("gave up", e.TerminalError),
        "awa_django.SomethingNew": ("a kind with no class", e.RecordedError),
        "Boom": ("a raw-SQL finalizer's own type", e.RecordedError),
        "": ("retry", e.RecordedError),
    }
    rescues = {
        "heartbeat stale: worker presumed dead": e.HeartbeatStale,
        "hard deadline exceeded": e.DeadlineExceeded,
        "callback timed out": e.CallbackTimedOut,
        "something new": e.AttemptRescued,
    }
    cases = [(entry(k, m), cls) for k, (m, cls) in recorded.items()]
    cases += [(entry("awa_django.Rescued", m), cls) for m, cls in rescues.items()]
    for stored, cls in cases:
        error = task_error(stored)
        assert error is not None
        assert error.exception_class is cls, stored
        assert error.exception_class_path == f"{cls.__module__}.{cls.__qualname__}"
        assert error.traceback.startswith("No Python traceback was recorded for this failure")
        assert "attempt 2" in error.traceback and stored["message"] in error.traceback
        named = f"{stored['type']}: " if cls is e.RecordedError and stored["type"] else ""
        assert error.traceback.endswith(
            f"{error.exception_class_path}: {named}{stored['message']}\n"
        )
    # An exception recorded by the worker keeps its class path and traceback.
    raised = {"type": "ValueError", "message": "bad", "traceback": "Traceback ...\nValueError: bad"}
    assert task_error(raised) == TaskError(
        exception_class_path="builtins.ValueError", traceback=raised["traceback"]
    )
    # Outcomes a handler chose are no errors, and get no invented class.
    assert task_error({"type": "awa_django.RetryAfter", "message": "retry after 1 s"}) is None
    assert task_error({"type": "awa_django.Cancel", "message": "enough"}) is None


def test_a_task_the_worker_refused_reads_back_failed_as_suspicious(manage_py: Start) -> None:
    from awa_django.exceptions import SuspiciousTask

    result = t.add.enqueue(1, 2)
    # This worker does not load tests.jobs.tasks (not an installed app's module here).
    run_worker(manage_py, overrides={"JOB_MODULES": ["tests.jobs.common"]})
    refused = t.add.get_result(result.id)
    assert refused.status == TaskResultStatus.FAILED
    [error] = refused.errors
    assert error.exception_class is SuspiciousTask
    assert "refused without running it" in error.traceback
    assert len(refused.worker_ids) == 1


def test_a_rescued_attempt_fails_with_an_importable_error_and_keeps_its_worker_id(
    manage_py: Start,
) -> None:
    from awa_django.exceptions import HeartbeatStale

    result = t.hangs.enqueue()
    first = worker(manage_py, "hang")

    def recorded_progress() -> Any:
        with pg() as conn:
            row = conn.execute(
                "SELECT progress FROM awa.jobs WHERE id = %s AND state = 'running'",
                [int(result.id)],
            ).fetchone()
        return row and row[0]

    progress = wait_for(recorded_progress, timeout=30, message=first.output)
    with pg() as conn:
        [(dead,)] = conn.execute(
            "SELECT worker_id::text FROM awa.claims WHERE job_id = %s", [int(result.id)]
        ).fetchall()
    assert progress["metadata"]["worker_ids"] == [dead]
    first.kill()
    rescuer = worker(manage_py, "hang")
    wait_for(lambda: finished(result.id), timeout=30, message=rescuer.output)
    stop(rescuer)
    prune_claims(result.id)
    failed = t.hangs.get_result(result.id)
    assert failed.status == TaskResultStatus.FAILED
    [error] = failed.errors
    assert error.exception_class is HeartbeatStale
    assert "heartbeat stale: worker presumed dead" in error.traceback
    assert failed.worker_ids == [dead]


def test_task_finished_reports_the_status_that_is_stored_and_the_error(manage_py: Start) -> None:
    unstorable = t.returns_set.enqueue()
    flaky = t.flaky.enqueue()
    steered = t.steered.enqueue()
    exploded = t.explode.enqueue()
    proc = worker(manage_py)
    ids = (unstorable.id, flaky.id, steered.id, exploded.id)
    wait_for(lambda: finished(*ids), timeout=30, message=proc.output)
    stop(proc)
    assert notes(unstorable.id) == [
        "0:enqueued",
        "1:started",
        "1:finished:FAILED:InvalidResultError",
    ]
    assert notes(flaky.id) == [
        "0:enqueued",
        "1:started",
        "1:finished:READY:RuntimeError",  # it is retried: READY, as stored
        "2:started",
        "2:finished:SUCCESSFUL",
    ]
    assert notes(exploded.id)[-1] == "1:finished:FAILED:ValueError"
    # RetryAfter and Cancel are outcomes the task chose, not errors.
    assert notes(steered.id)[1:] == [
        "1:started",
        "1:finished:READY",
        "2:started",
        "2:finished:FAILED",
    ]
    cancelled = t.steered.get_result(steered.id)
    assert (cancelled.status, cancelled.errors, cancelled.attempts) == (
        TaskResultStatus.FAILED,
        [],
        2,
    )
    stored = {i: result_of(i).status for i in ids}
    assert stored == {
        unstorable.id: TaskResultStatus.FAILED,
        flaky.id: TaskResultStatus.SUCCESSFUL,
        steered.id: TaskResultStatus.FAILED,
        exploded.id: TaskResultStatus.FAILED,
    }


def test_results_and_the_task_context_carry_the_task_as_enqueued(manage_py: Start) -> None:
    run_after = timezone.now() - timedelta(seconds=1)  # in the past: runs at once
    task = t.introspect.using(priority=7, queue_name="introspect", run_after=run_after)
    result = task.enqueue()
    assert result.enqueued_at is not None
    assert t.introspect.get_result(result.id) == result  # one enqueued_at, the database's
    later_task = t.add.using(run_after=timezone.now() + timedelta(hours=1), priority=-3)
    later = later_task.enqueue(1, 1)
    assert t.add.get_result(later.id) == later
    assert t.add.get_result(later.id).task == later_task
    run_worker(manage_py, "introspect")
    done = t.introspect.get_result(result.id)
    assert done.task == task and done.enqueued_at == result.enqueued_at
    assert done.return_value == {
        "priority": 7,
        "queue_name": "introspect",
        "run_after": run_after.isoformat(),
        "backend": "default",
        "enqueued_at": result.enqueued_at.isoformat(),
        "worker_ids": done.worker_ids,
        "attempt": 1,
    }


def test_arguments_and_return_values_are_normalised_as_django_normalises_them(
    manage_py: Start,
) -> None:
    result = t.normalised.enqueue(
        OrderedDict([("b", 1), ("a", t.Colour.RED)]),
        ("x", t.Size.BIG),
        t.Colour.RED,
        b"bytes",
        colour=t.Colour.RED,
        size=t.Size.BIG,
    )
    assert result.args == [{"b": 1, "a": "red"}, ["x", 3], "red", "bytes"]
    assert [type(a) for a in result.args] == [dict, list, str, str]
    assert result.kwargs == {"colour": "red", "size": 3}
    assert type(result.kwargs["size"]) is int
    assert t.normalised.get_result(result.id) == result
    for refused in (
        {1, 2},
        object(),
        b"\xff",
        math.nan,
        {1: "a", "1": "b"},
    ):  # Django's refusals, and JSON's
        with pytest.raises(InvalidTask):
            t.normalised.enqueue(refused)
    run_worker(manage_py)
    assert t.normalised.get_result(result.id).return_value == {
        "args": ["dict", "list", "str", "str"],
        "kwargs": {"colour": "str", "size": "int"},
        "echo": [[{"b": 1, "a": "red"}, ["x", 3], "red", "bytes"], {"colour": "red", "size": 3}],
        "colour": "red",
        "size": 3,
    }


def prune_claims(*job_ids: str) -> None:
    """Rotate the claim ring once around, pruning each slot as it comes up oldest: what
    maintenance does in time to the claims of finished work (tests/worker/test_maintenance.py)."""
    with pg() as conn:
        [(count,)] = conn.execute("SELECT slot_count FROM awa.rings WHERE ring = 'claim'")
        for _ in range(count):
            enqueue_sql(conn, json.dumps([{"kind": "filler", "queue": "filler"}]))
            done = [
                Finalization(c.job_id, c.run_lease, c.claim_slot, "completed")
                for c in storage.claim(conn, "filler", 1, WORKER)
            ]
            storage.finalize(conn, done)
            assert conn.execute("SELECT awa.prune_v1('claim')").fetchone() in (
                ("pruned",),
                ("empty",),
            )
            assert conn.execute("SELECT awa.rotate_v2('claim')").fetchone() == ("rotated",)
        left = conn.execute(
            "SELECT count(*) FROM awa.claims WHERE job_id = ANY(%s)", [[int(i) for i in job_ids]]
        ).fetchone()
    assert left == (0,)


def test_worker_ids_name_the_real_worker_of_every_attempt_after_the_claim_ring_is_pruned(
    manage_py: Start,
) -> None:
    succeeded = t.flaky.enqueue()  # fails once, then succeeds
    failed = t.retried.enqueue()  # fails all of its 3 attempts
    proc = worker(manage_py)
    wait_for(lambda: finished(succeeded.id, failed.id), timeout=30, message=proc.output)
    stop(proc)
    with pg() as conn:
        claimed = {
            str(job): workers
            for job, workers in conn.execute(
                "SELECT job_id, array_agg(worker_id::text ORDER BY attempt) FROM awa.claims "
                "WHERE job_id = ANY(%s) GROUP BY job_id",
                [[int(succeeded.id), int(failed.id)]],
            )
        }
    prune_claims(succeeded.id, failed.id)
    for result, attempts in ((succeeded, 2), (failed, 3)):
        workers = result_of(result.id).worker_ids
        assert len(workers) == attempts
        assert workers == claimed[result.id]
        assert all(uuid.UUID(w) for w in workers)


def test_backend_check_reports_invalid_options_and_queues() -> None:
    backend = AwaTaskBackend(
        "x",
        {"QUEUES": ["default", "A", ""], "OPTIONS": {"deadline": math.nan, "tags": "abc"}},
    )
    messages = [m.msg for m in backend.check() if m.id == "awa.E103"]
    assert any("OPTIONS['deadline']" in m for m in messages)
    assert any("OPTIONS['tags']" in m for m in messages)
    assert any("'A' is not a valid queue name" in m for m in messages)
    assert any("'' is not a valid queue name" in m for m in messages)
    assert len(messages) == 4
    zero = AwaTaskBackend("z", {"OPTIONS": {"deadline": 0}})
    assert [m.id for m in zero.check()] == ["awa.E103"]
    fine = AwaTaskBackend("y", {"QUEUES": [], "OPTIONS": {"deadline": 30, "tags": ["a"]}})
    assert list(fine.check()) == []


def test_tags_given_as_one_string_are_refused_never_split_into_characters() -> None:
    import dataclasses

    from awa_django.backends.compat import InvalidTask

    with pytest.raises(InvalidTask, match="tags: must be a list of strings"):
        dataclasses.replace(t.add, tags="xyz").enqueue(1, 2)
    tasks = {
        "default": {
            "BACKEND": "awa_django.backends.tasks.AwaTaskBackend",
            "OPTIONS": {"tags": "abc"},
        }
    }
    with override_settings(TASKS=tasks), pytest.raises(InvalidTask, match="tags:"):
        t.add.enqueue(1, 2)
    with pg() as conn:
        assert conn.execute("SELECT count(*) FROM awa.jobs").fetchone() == (0,)


def test_a_priority_that_is_not_an_int_is_an_invalid_task_not_a_type_error() -> None:
    from awa_django.backends.compat import InvalidTask

    for priority in ("5", 5.0, True):
        with pytest.raises(InvalidTask, match="Priority must be an int"):
            t.add.using(priority=priority).enqueue(1, 2)  # type: ignore[arg-type]


@pytest.mark.django_db(transaction=True)
def test_a_unique_task_returns_the_existing_result_for_a_duplicate() -> None:
    import dataclasses

    from awa_django import DuplicateJobError

    first = t.unique_add.enqueue(1, 2)
    again = t.unique_add.enqueue(1, 2)
    other = t.unique_add.enqueue(2, 2)
    assert again.id == first.id and again.status == TaskResultStatus.READY
    assert again.args == [1, 2] and other.id != first.id
    keyed = dataclasses.replace(t.unique_add, unique_key="one-per-day")
    a, b = keyed.enqueue(5, 5), keyed.enqueue(6, 6)
    assert b.id == a.id and b.args == [5, 5]
    with pytest.raises(DuplicateJobError):
        dataclasses.replace(t.unique_add, on_conflict="raise").enqueue(1, 2)
    with pg() as conn:
        assert conn.execute("SELECT count(*) FROM awa.jobs").fetchone() == (3,)
