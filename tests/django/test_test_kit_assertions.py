"""The test kit's reads and assertions (enqueued_jobs, assert_enqueued, assert_not_enqueued),
drain()'s kind filter and with_scheduled, and the pytest fixtures, in a test's transaction."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, transaction

from awa_django import IsolationLevelError, enqueue
from awa_django.testing import (
    assert_enqueued,
    assert_not_enqueued,
    drain,
    enqueued_jobs,
)
from tests.jobs import common as testjobs
from tests.jobs import order_flow
from tests.support.polling import wait_for
from tests.testapp.models import Order

pytestmark = pytest.mark.django_db  # a TestCase-style transaction, never committed


def test_enqueued_jobs_lists_what_waits_with_decoded_arguments() -> None:
    sent = testjobs.send_email.enqueue("a@example.com", subject="hi")
    later = testjobs.renamed.using(run_after=timedelta(hours=1)).enqueue((1, 2))
    [first, second] = enqueued_jobs()
    assert (first.id, first.kind, first.queue, first.state) == (
        sent.id,
        "tests.jobs.common.send_email",
        "emails",
        "available",
    )
    assert (first.args, first.kwargs, first.priority, first.tags) == (
        ["a@example.com"],
        {"subject": "hi"},
        5,
        ["mail"],
    )
    assert (second.id, second.state, second.args) == (later.id, "scheduled", [[1, 2]])
    assert [j.id for j in enqueued_jobs(testjobs.renamed)] == [later.id]
    assert [j.id for j in enqueued_jobs("tests.renamed", queue="emails")] == []
    assert [j.id for j in enqueued_jobs(queue=["emails", "x"])] == [sent.id]
    drain()
    assert [j.id for j in enqueued_jobs()] == [later.id]  # the scheduled one still waits


def test_assert_enqueued_matches_fields_counts_and_returns_the_jobs() -> None:
    order_flow.ship.enqueue(7, carrier="van")
    order_flow.ship.enqueue(8)
    [job] = assert_enqueued(order_flow.ship, args=(7,), kwargs={"carrier": "van"})
    assert job.args == [7]
    assert len(assert_enqueued("tests.jobs.order_flow.ship", queue="orders", count=2)) == 2
    assert_enqueued(order_flow.ship, kwargs={}, count=2)  # no keyword asked: any match
    assert_not_enqueued(order_flow.ship, args=[9])
    assert_not_enqueued(order_flow.notify)
    assert_enqueued(order_flow.notify, count=0)


def test_a_failed_assertion_lists_each_job_with_what_differs() -> None:
    with pytest.raises(AssertionError, match="Nothing is enqueued"):
        assert_enqueued(order_flow.ship)
    order_flow.ship.enqueue(7, carrier="van")
    testjobs.noop.enqueue()
    with pytest.raises(AssertionError) as failed:
        assert_enqueued(order_flow.ship, args=[8], kwargs={"carrier": "bike"}, queue="mail")
    text = str(failed.value)
    assert text.startswith(
        "expected at least 1 enqueued job of kind tests.jobs.order_flow.ship, args [8], "
        'kwargs including {"carrier": "bike"}, in queue \'mail\'; found 0.'
    )
    assert "args [7]; kwarg 'carrier' is \"van\", not \"bike\"; queue 'orders'" in text
    assert "Other enqueued jobs (1): tests.jobs.common.noop x1" in text
    with pytest.raises(AssertionError, match=r"expected 2 enqueued .*found 1"):
        assert_enqueued(order_flow.ship, count=2)
    with pytest.raises(AssertionError, match=r"No job of that kind is enqueued"):
        assert_enqueued(order_flow.refuse)
    with pytest.raises(AssertionError, match=r"expected no enqueued .*found 1:\n  #\d+ "):
        assert_not_enqueued(order_flow.ship, kwargs={"carrier": "van"})
    [run] = drain("orders")  # order 7 does not exist: a retry, which still waits to run
    [job] = assert_enqueued(order_flow.ship, args=[7])
    assert (run.outcome, job.state) == ("retry", "retryable")


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda: assert_enqueued(None), TypeError),
        (lambda: assert_enqueued(42), TypeError),
        (lambda: assert_enqueued("k", args="ab"), TypeError),
        (lambda: assert_enqueued("k", kwargs=[1]), TypeError),
        (lambda: assert_enqueued("k", queue=1), TypeError),
        (lambda: assert_enqueued("k", tags="mail"), TypeError),
        (lambda: assert_enqueued("k", count=-1), ValueError),
        (lambda: assert_enqueued("k", count=True), ValueError),
        (lambda: drain(max_jobs=-1), ValueError),
        (lambda: drain(max_jobs=1.5), ValueError),
        (lambda: drain(with_scheduled="yes"), TypeError),
        (lambda: drain(kinds=[None]), TypeError),
        (lambda: drain(queues=[1]), TypeError),
        (lambda: drain(queues=b"emails"), TypeError),
        (lambda: drain("BAD QUEUE"), ValueError),
        (lambda: drain(""), ValueError),
        (lambda: enqueued_jobs(queue="BAD Q"), ValueError),
        (lambda: assert_not_enqueued("k", queue="BAD Q"), ValueError),
        (lambda: assert_not_enqueued("k", args=[Order()]), TypeError),  # not its id
        (lambda: assert_not_enqueued("k", args=[float("nan")]), TypeError),
        (lambda: assert_not_enqueued("k", args=[{1}]), TypeError),
        (lambda: assert_not_enqueued("k", args=[b"x"]), TypeError),
        (lambda: assert_not_enqueued("k", kwargs={"b": object()}), TypeError),
        (lambda: assert_not_enqueued("k", priority="0"), TypeError),
        (lambda: assert_not_enqueued("k", priority=False), TypeError),
    ],
)
def test_bad_arguments_are_refused_with_nothing_run(call: Any, error: type[Exception]) -> None:
    sent = testjobs.noop.enqueue()
    with pytest.raises(error):
        call()
    assert [j.id for j in enqueued_jobs()] == [sent.id]


@pytest.mark.django_db(transaction=True, databases=["default", "repeatable"])
def test_drain_on_an_alias_that_is_not_read_committed_is_refused_before_it_claims() -> None:
    with transaction.atomic(using="repeatable"):  # BEGIN ISOLATION LEVEL REPEATABLE READ
        with pytest.raises(IsolationLevelError, match="READ COMMITTED"):
            drain(using="repeatable")
        assert enqueued_jobs(using="repeatable") == []  # its transaction is still usable


def test_values_match_as_the_handler_sees_them_in_json() -> None:
    testjobs.renamed.enqueue(True)
    testjobs.renamed.enqueue(2.0)
    assert_enqueued(testjobs.renamed, args=[True], count=1)
    assert_not_enqueued(testjobs.renamed, args=[1])
    assert_not_enqueued(testjobs.renamed, args=[2])
    assert_enqueued(testjobs.renamed, args=(2.0,), count=1)
    assert drain([]) == [] and len(enqueued_jobs()) == 2  # no queue named: nothing runs


def due_by_the_clock(job_id: int) -> bool:
    """Whether the job's run_at has passed by the database's clock (not the transaction's)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT run_at <= clock_timestamp() FROM awa.jobs WHERE id = %s", [job_id])
        row = cursor.fetchone()
    return bool(row and row[0])


def test_due_jobs_run_by_the_clock_and_kinds_keep_the_others_schedules() -> None:
    soon = testjobs.noop.using(run_after=timedelta(milliseconds=300)).enqueue()
    later = testjobs.renamed.using(run_after=timedelta(hours=1)).enqueue(1)
    assert drain() == []  # the test's transaction began before it was due...
    wait_for(lambda: due_by_the_clock(soon.id), timeout=5, message="the job's time to come")
    assert [r.id for r in drain()] == [soon.id]  # ...the clock says it is
    failing = order_flow.refuse.enqueue(9)
    runs = drain("orders", kinds=order_flow.refuse, with_scheduled=True)
    assert [r.outcome for r in runs] == ["retry", "retry", "fail"]
    [waiting] = enqueued_jobs()
    assert (waiting.id, waiting.state, failing.id != waiting.id) == (later.id, "scheduled", True)


def test_drain_runs_only_the_kinds_asked_for_and_puts_the_others_back() -> None:
    order = Order.objects.create()
    skipped = testjobs.renamed.using(queue="orders").enqueue("x")
    shipped = order_flow.ship.enqueue(order.id)
    runs = drain("orders", kinds=[order_flow.ship])
    assert [(r.id, r.outcome) for r in runs] == [(shipped.id, "completed")]
    [back] = enqueued_jobs(queue="orders")
    assert (back.id, back.state, back.attempt) == (skipped.id, "available", 0)
    assert_enqueued(order_flow.notify, args=[order.id])  # what the job enqueued
    assert [r.kind for r in drain(kinds="tests.renamed")] == ["tests.renamed"]
    assert [r.kind for r in drain()] == ["tests.jobs.order_flow.notify"]


def test_drain_with_scheduled_runs_future_jobs_and_retries_to_the_end() -> None:
    later = testjobs.noop.using(run_after=timedelta(days=1)).enqueue()
    failing = enqueue("tests.jobs.order_flow.refuse", args=[1])  # 3 attempts
    assert [r.outcome for r in drain()] == ["retry"]
    runs = drain(with_scheduled=True)
    assert sorted((r.id, r.outcome) for r in runs) == sorted(
        [(later.id, "completed"), (failing.id, "retry"), (failing.id, "fail")]
    )
    assert enqueued_jobs() == []


def test_the_fixtures_are_the_kit(awa_drain: Any, awa_jobs: Any, awa_immediate: Any) -> None:
    order = Order.objects.create()
    order_flow.ship.enqueue(order.id)  # immediate: ran, and so did what it enqueued
    assert [r.kind for r in awa_immediate] == [
        "tests.jobs.order_flow.ship",
        "tests.jobs.order_flow.notify",
    ]
    order.refresh_from_db()
    assert order.note == "shipped, notified"
    awa_jobs.assert_not_enqueued(order_flow.notify)
    assert awa_jobs.enqueued() == [] and awa_drain() == []
