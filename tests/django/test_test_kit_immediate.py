"""Immediate mode (awa_django.testing.immediate, AWA["TESTING"]["MODE"]): a job runs in-process
when the transaction that enqueued it commits, in a TestCase-style test (the outermost block of
the code under test stands for the commit) and in a transactional one (the real commit)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.conf import settings
from django.db import transaction
from django.test import TestCase, override_settings

from awa_django.testing import (
    ImmediateJobFailed,
    assert_enqueued,
    assert_not_enqueued,
    enqueued_jobs,
    immediate,
    immediate_mode,
)
from tests.jobs import order_flow
from tests.testapp.models import Order

IMMEDIATE = {**settings.AWA, "TESTING": {"MODE": "immediate"}}


def note(order: Order) -> str:
    order.refresh_from_db()
    return order.note


@pytest.mark.django_db
def test_outside_a_block_a_job_runs_as_it_is_enqueued() -> None:
    order = Order.objects.create()
    with immediate() as runs:
        order_flow.ship.enqueue(order.id, carrier="van")
        assert note(order) == "shipped, notified"  # ship, then the job ship enqueued
    assert [(r.kind, r.outcome) for r in runs] == [
        ("tests.jobs.order_flow.ship", "completed"),
        ("tests.jobs.order_flow.notify", "completed"),
    ]
    assert enqueued_jobs() == []


@pytest.mark.django_db
def test_in_blocks_jobs_run_when_the_outermost_commits_and_see_its_rows() -> None:
    with immediate() as runs:
        with transaction.atomic():
            with transaction.atomic():
                order = Order(note="new")
                order.save()
                shipped = order_flow.ship.enqueue(order.id)
            assert_enqueued(order_flow.ship, args=[order.id])  # the inner block is no commit
            Order.objects.filter(pk=order.id).update(note="paid")  # written after the enqueue
            assert runs == []
        assert [r.id for r in runs][:1] == [shipped.id]
        assert note(order) == "shipped, notified"
        # The same block object entered again (a decorated view called twice) is plain again.
        block = transaction.atomic()
        for _ in range(2):
            with block:
                order_flow.notify.enqueue(order.id)
        assert len(runs) == 4


@pytest.mark.django_db
def test_a_block_that_rolls_back_runs_nothing() -> None:
    with immediate() as runs:
        with pytest.raises(ZeroDivisionError), transaction.atomic():
            order_flow.notify.enqueue(1)
            _ = 1 / 0
        with transaction.atomic():
            try:
                with transaction.atomic():
                    order_flow.notify.enqueue(2)
                    raise KeyError
            except KeyError:
                pass
            order_flow.notify.enqueue(3)
        scheduled = order_flow.notify.using(run_after=timedelta(hours=1)).enqueue(4)
    assert [r.kind for r in runs] == ["tests.jobs.order_flow.notify"]  # job 3's
    assert_not_enqueued(order_flow.notify, args=[2])
    assert [j.id for j in enqueued_jobs()] == [scheduled.id]  # not due: not run


@pytest.mark.django_db
def test_a_failed_job_fails_the_commit_with_its_traceback_unless_told_not_to() -> None:
    with immediate(), pytest.raises(ImmediateJobFailed) as failed, transaction.atomic():
        order_flow.refuse.enqueue(5)
    [run] = failed.value.runs
    assert (run.outcome, run.error and run.error["type"]) == ("retry", "ValueError")
    assert "order 5 cannot ship" in str(failed.value)
    assert "Traceback" in str(failed.value) and "raise ValueError" in str(failed.value)
    with immediate(raise_failures=False) as runs:
        sixth = order_flow.refuse.enqueue(6)
    # Job 5's retry runs too once its backoff has passed by the clock, as a worker's would.
    assert sixth.id in {r.id for r in runs} and {r.outcome for r in runs} == {"retry"}
    with pytest.raises(TypeError), immediate(raise_failures="no"):  # type: ignore[arg-type]
        pass


@pytest.mark.django_db
def test_nested_blocks_each_keep_their_own_runs_and_mode() -> None:
    with immediate(raise_failures=False) as outer:
        with immediate(raise_failures=False) as inner:  # alike, yet another block
            pass
        order_flow.refuse.enqueue(2)  # after the inner block: the outer's
        with immediate() as strict, pytest.raises(ImmediateJobFailed):
            order_flow.refuse.enqueue(3)
    assert inner == [] and [r.outcome for r in outer] == ["retry"]
    assert [r.outcome for r in strict][:1] == ["retry"]


@pytest.mark.django_db
def test_a_job_that_enqueues_itself_is_stopped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(immediate_mode, "MAX_RUNS", 5)
    with immediate(), pytest.raises(RuntimeError, match="more than 5 jobs for one commit"):
        order_flow.again.enqueue()


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("clean_awa")
def test_in_a_transactional_test_jobs_run_at_the_real_commit() -> None:
    with override_settings(AWA=IMMEDIATE):
        with transaction.atomic():
            order = Order.objects.create()
            order_flow.ship.enqueue(order.id)
            assert note(order) == ""
        assert note(order) == "shipped, notified"
        with pytest.raises(ImmediateJobFailed), transaction.atomic():
            order_flow.refuse.enqueue(order.id)
        assert_enqueued(order_flow.refuse, args=[order.id])  # committed, and waits to retry
        order_flow.notify.enqueue(order.id)  # autocommit: at once
        # A failed job is raised once the commit's other callbacks ran: the code's own too.
        ran: list[str] = []
        with pytest.raises(ImmediateJobFailed), transaction.atomic():
            order_flow.refuse.enqueue(order.id)
            transaction.on_commit(lambda: ran.append("the application's callback"))
        assert ran == ["the application's callback"]
    order_flow.notify.enqueue(order.id)  # the mode is off again
    assert_enqueued(order_flow.notify)


@override_settings(AWA=IMMEDIATE)
class ImmediateModeInATestCase(TestCase):
    """The settings' mode, in Django's own TestCase."""

    def test_the_view_s_block_is_the_commit(self) -> None:
        with transaction.atomic():
            order = Order.objects.create()
            order_flow.ship.enqueue(order.id)
            self.assertEqual(note(order), "")
        self.assertEqual(note(order), "shipped, notified")

    def test_a_failure_raises_at_the_enqueue_outside_blocks(self) -> None:
        with self.assertRaises(ImmediateJobFailed):
            order_flow.refuse.enqueue(1)
        with override_settings(
            AWA={**IMMEDIATE, "TESTING": {**IMMEDIATE["TESTING"], "RAISE_FAILURES": False}}
        ):
            order_flow.refuse.enqueue(2)
        self.assertEqual(len(enqueued_jobs()), 2)


def test_immediate_mode_is_off_by_default(settings: Any) -> None:
    assert settings.AWA.get("TESTING") is None
