"""``drain()`` inside the test's own transaction, as users write tests: pytest-django's
``django_db`` and ``django.test.TestCase``; django.tasks tasks and ``@job`` handlers, sync and
async, that succeed and that fail, with django.tasks' signals.

The invariant: the test's transaction is never the handler's. It is still open, at the same
depth and usable after ``drain()``, with the test's rows and the handlers' writes in it; only a
transaction a handler leaves open is rolled back (the job then fails with
``TransactionLeftOpen``, as in a worker), and the test's teardown rolls back cleanly.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test import TestCase

from awa_django.backends.compat import TaskResultStatus
from awa_django.exceptions import TransactionLeftOpen
from awa_django.testing import JobRun, drain
from tests.jobs import common as testjobs
from tests.jobs import order_flow
from tests.jobs import tasks as t
from tests.testapp.models import Ledger, Order


def transaction_of_the_test() -> tuple[bool, int, bool]:
    """What the test's transaction looks like from Django: in an atomic block, how deep, and
    whether it must be rolled back."""
    return connection.in_atomic_block, len(connection.atomic_blocks), connection.needs_rollback


def signals_of(result_id: str) -> list[str]:
    """The django.tasks signals sent for a task, in order (tests/jobs/tasks.py notes
    them)."""
    rows = Ledger.objects.filter(job_id=int(result_id), queue="tasks").order_by("id")
    return list(rows.values_list("note", flat=True))


def written() -> list[str]:
    """The labels the drained tasks wrote (``tasks_for_tests.records``)."""
    rows = Ledger.objects.filter(queue="drained").order_by("id")
    return list(rows.values_list("note", flat=True))


def only_run(queue: str) -> JobRun:
    [run] = drain(queue)
    return run


@pytest.fixture
def test_transaction(db: None) -> Any:
    """The test's transaction with a row of the test's in it; after the test body, the
    transaction must look exactly as it did and still hold (and read) that row."""
    order = Order.objects.create(note="the test's own row")
    before = transaction_of_the_test()
    assert before[0], "pytest-django's db fixture runs the test in an atomic block"
    yield
    assert transaction_of_the_test() == before
    assert Order.objects.filter(pk=order.pk).exists()


#: For the pytest-django tests (the TestCase below checks the same in setUp and tearDown).
in_the_test_transaction = pytest.mark.usefixtures("test_transaction")


@in_the_test_transaction
@pytest.mark.parametrize("task", [t.records, t.records_async], ids=["sync", "async"])
def test_a_drained_task_runs_in_the_test_transaction_and_keeps_it(task: Any) -> None:
    result = task.enqueue("written by the task")
    run = only_run("drained")
    assert (run.id, run.outcome, run.result) == (int(result.id), "completed", "written by the task")
    assert written() == ["written by the task"]
    done = task.get_result(result.id)
    assert (done.status, done.return_value) == (TaskResultStatus.SUCCESSFUL, "written by the task")
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert signals_of(result.id) == ["enqueued", "started", "finished:SUCCESSFUL"]


@in_the_test_transaction
@pytest.mark.parametrize(
    ("task", "queue"),
    [(t.explode, "default"), (t.explodes_async, "drained")],
    ids=["sync", "async"],
)
def test_a_drained_task_that_raises_is_failed_and_the_test_transaction_is_kept(
    task: Any, queue: str
) -> None:
    result = task.enqueue()
    run = only_run(queue)
    assert run.outcome == "fail" and run.error is not None
    assert run.error["type"] == "ValueError"
    failed = task.get_result(result.id)
    assert failed.status == TaskResultStatus.FAILED
    assert [e.exception_class for e in failed.errors] == [ValueError]
    assert signals_of(result.id) == ["enqueued", "started", "finished:FAILED:ValueError"]


@in_the_test_transaction
@pytest.mark.parametrize(
    ("job", "queue", "outcome"),
    [
        (testjobs.ledger_sync, "work", "completed"),
        (testjobs.ledger_async, "work-async", "completed"),
        (testjobs.terminal, "work", "fail"),
    ],
    ids=["sync", "async", "failing"],
)
def test_a_drained_job_keeps_the_test_transaction(job: Any, queue: str, outcome: str) -> None:
    enqueued = job.enqueue() if job is testjobs.terminal else job.enqueue(7)
    run = only_run(queue)
    assert (run.id, run.outcome) == (enqueued.id, outcome)
    if outcome == "completed":
        assert run.result == 7
        assert Ledger.objects.filter(job_id=enqueued.id).count() == 1


@in_the_test_transaction
def test_only_the_transaction_a_drained_task_leaves_open_is_rolled_back() -> None:
    leaky = t.leaves_a_transaction_open.enqueue("rolled back with the leaked block")
    later = t.records.enqueue("written after it")
    first, second = drain("drained")
    assert (first.id, first.outcome) == (int(leaky.id), "fail")
    assert first.error is not None and "left a transaction open" in first.error["message"]
    assert (second.id, second.outcome) == (int(later.id), "completed")
    assert written() == ["written after it"]
    failed = t.leaves_a_transaction_open.get_result(leaky.id)
    assert [e.exception_class for e in failed.errors] == [TransactionLeftOpen]
    assert signals_of(leaky.id) == ["enqueued", "started", "finished:FAILED:TransactionLeftOpen"]


@in_the_test_transaction
def test_only_the_transaction_a_drained_job_leaves_open_is_rolled_back() -> None:
    leaky = testjobs.leaves_transaction_open.enqueue()
    later = testjobs.innocent.enqueue()
    first, second = drain("leaky")
    assert (first.id, first.outcome) == (leaky.id, "fail")
    assert first.error is not None and "left a transaction open" in first.error["message"]
    assert (second.id, second.outcome) == (later.id, "completed")
    assert list(Ledger.objects.values_list("note", flat=True)) == ["innocent"]


@in_the_test_transaction
def test_a_statement_that_fails_in_a_drained_task_aborts_only_the_task_s_part() -> None:
    broken = t.fails_a_statement.enqueue("undone with the failed statement")
    later = t.records.enqueue("written after it")
    first, second = drain("drained")
    assert (first.id, first.outcome) == (int(broken.id), "fail")
    assert first.error is not None and first.error["type"] == "django.db.utils.DataError"
    assert (second.id, second.outcome) == (int(later.id), "completed")
    assert written() == ["written after it"]
    assert signals_of(broken.id) == ["enqueued", "started", "finished:FAILED:DataError"]


class DrainInATestCase(TestCase):
    """The same, in a ``django.test.TestCase``: its teardown rolls the test back cleanly."""

    def setUp(self) -> None:
        self.order = Order.objects.create(note="the test's own row")
        self.before = transaction_of_the_test()

    def tearDown(self) -> None:
        assert transaction_of_the_test() == self.before
        assert Order.objects.filter(pk=self.order.pk).exists()

    def test_tasks_and_jobs_sync_and_async_succeed_and_fail_in_the_test_transaction(
        self,
    ) -> None:
        sync = t.records.enqueue("sync")
        aio = t.records_async.enqueue("async")
        failing = t.explodes_async.enqueue()
        job = testjobs.send_email.enqueue("a@example.com", subject="hi")
        runs = {run.id: run for run in drain()}
        assert {i: runs[int(r.id)].outcome for i, r in enumerate([sync, aio, failing])} == {
            0: "completed",
            1: "completed",
            2: "fail",
        }
        assert runs[job.id].result == "sent hi to a@example.com"
        assert sorted(written()) == ["async", "sync"]
        assert signals_of(aio.id) == ["enqueued", "started", "finished:SUCCESSFUL"]
        assert signals_of(failing.id) == ["enqueued", "started", "finished:FAILED:ValueError"]
        assert t.records.get_result(sync.id).return_value == "sync"

    def test_a_task_that_leaves_a_transaction_open_fails_and_the_test_goes_on(self) -> None:
        leaky = t.leaves_a_transaction_open.enqueue("rolled back")
        later = t.records.enqueue("kept")
        assert [run.outcome for run in drain("drained")] == ["fail", "completed"]
        assert written() == ["kept"]
        assert t.leaves_a_transaction_open.get_result(leaky.id).status == TaskResultStatus.FAILED
        assert t.records.get_result(later.id).return_value == "kept"


@in_the_test_transaction
def test_a_rollback_flag_outside_the_handler_s_blocks_undoes_only_its_part() -> None:
    order_flow.flags_rollback.enqueue()
    run = only_run("habits")
    assert (run.outcome, run.error and run.error["type"]) == (
        "fail",
        "django.db.transaction.TransactionManagementError",
    )
    assert not Order.objects.filter(note="flagged").exists()


@in_the_test_transaction
def test_closing_connections_in_a_handler_leaves_the_test_s_open() -> None:
    order_flow.closes_connections.enqueue()
    run = only_run("habits")
    assert (run.outcome, run.result) == ("completed", "closed")
    assert Order.objects.filter(note="after close").exists()


@in_the_test_transaction
def test_a_handler_s_on_commit_callbacks_run_when_it_returns() -> None:
    order_flow.notes_on_commit.enqueue()
    assert only_run("habits").outcome == "completed"
    notes = set(Order.objects.values_list("note", flat=True))
    assert {"committed", "on commit, outside", "on commit, in a block"} <= notes
    assert connection.run_on_commit == []


@in_the_test_transaction
def test_ctrl_c_in_a_handler_writes_its_outcome_and_puts_set_aside_jobs_back() -> None:
    other = order_flow.notify.using(queue="habits").enqueue(1)
    stopped = order_flow.interrupted.enqueue()
    with pytest.raises(KeyboardInterrupt):
        drain("habits", kinds=order_flow.interrupted)
    states = dict(enqueued_state(other.id, stopped.id))
    assert states == {other.id: "available", stopped.id: "failed"}


def enqueued_state(*ids: int) -> list[tuple[int, str]]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT id, state FROM awa.jobs WHERE id = ANY(%s)", [list(ids)])
        return [(int(i), str(state)) for i, state in cursor.fetchall()]


@pytest.mark.usefixtures("clean_awa")  # a transactional test: autocommit, rows committed
def test_drain_in_autocommit_replaces_a_connection_a_task_leaves_in_a_transaction() -> None:
    assert not connection.in_atomic_block and connection.get_autocommit()
    leaky = t.leaves_a_transaction_open.enqueue("rolled back")
    later = t.records.enqueue("committed")
    assert [run.outcome for run in drain("drained")] == ["fail", "completed"]
    assert written() == ["committed"]
    assert t.leaves_a_transaction_open.get_result(leaky.id).status == TaskResultStatus.FAILED
    assert t.records.get_result(later.id).status == TaskResultStatus.SUCCESSFUL
