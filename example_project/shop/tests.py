"""The shop's tests, written with awa_django's test kit (docs/testing.md): what placing an order
enqueues, and what its jobs do, without a worker."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import transaction
from django.test import TestCase

from awa_django.testing import (
    ImmediateJobFailed,
    assert_enqueued,
    assert_not_enqueued,
    drain,
    immediate,
)
from shop.jobs import charge_card, fulfil_order, send_confirmation
from shop.models import Order
from shop.services import place_order


class PlaceOrderTests(TestCase):
    def test_an_order_enqueues_its_jobs_in_its_transaction(self) -> None:
        order = place_order("a@example.com")
        assert_enqueued(charge_card, args=[order.id], queue="payments")
        assert_enqueued(fulfil_order, args=[order.id], queue="orders")
        assert_enqueued(send_confirmation, args=[order.id, "a@example.com"], count=1)

    def test_an_order_rolled_back_leaves_no_job(self) -> None:
        with self.assertRaises(RuntimeError), transaction.atomic():
            place_order("a@example.com")
            raise RuntimeError("payment page crashed")
        self.assertFalse(Order.objects.exists())
        assert_not_enqueued(charge_card)

    def test_the_jobs_charge_ship_and_confirm_when_the_order_commits(self) -> None:
        with immediate() as runs:
            order = place_order("a@example.com")
        results = {run.kind: run.result for run in runs}
        self.assertEqual(results["shop.jobs.charge_card"], {"order": order.id, "charged": True})
        self.assertEqual(
            results["shop.jobs.fulfil_order"], {"order": order.id, "status": "shipped"}
        )
        self.assertEqual(
            results["shop.jobs.send_confirmation"],
            f"confirmation for order {order.id} sent to a@example.com",
        )

    def test_a_fraud_order_is_refused_for_good(self) -> None:
        with immediate(), self.assertRaises(ImmediateJobFailed) as failed:
            place_order("a@example.com", note="fraud")
        [run] = failed.exception.runs
        self.assertEqual((run.kind, run.outcome), ("shop.jobs.charge_card", "fail"))
        self.assertIn("suspected fraud", str(failed.exception))

    def test_a_flaky_order_ships_on_its_third_attempt(self) -> None:
        place_order("a@example.com", note="flaky")
        runs = drain("orders", with_scheduled=True)
        self.assertEqual([run.outcome for run in runs], ["retry", "retry", "completed"])


@pytest.mark.django_db
def test_the_order_form_places_an_order(client: Any, awa_jobs: Any, awa_drain: Any) -> None:
    response = client.post("/orders/new/", {"email": "b@example.com", "note": ""})
    assert response.status_code == 302
    order = Order.objects.get()
    awa_jobs.assert_enqueued(charge_card, args=[order.id])
    assert {run.outcome for run in awa_drain(kinds=[charge_card, send_confirmation])} == {
        "completed"
    }
    awa_jobs.assert_enqueued(fulfil_order, count=1)  # the only one not run
