"""Jobs with application side effects, for the test kit's tests (tests/django/test_test_kit*):
they read and write ``Order`` rows and enqueue one another."""

from __future__ import annotations

from awa_django import job
from tests.testapp.models import Order


@job(queue="orders")
def ship(order_id: int, *, carrier: str = "post") -> str:
    """Mark the order shipped; the order must exist when the job runs."""
    order = Order.objects.get(pk=order_id)
    order.note = f"shipped by {carrier}"
    order.save(update_fields=["note"])
    notify.enqueue(order_id)  # a job of the job: immediate mode runs it too
    return order.note


@job(queue="mail")
def notify(order_id: int) -> str:
    Order.objects.filter(pk=order_id).update(note="shipped, notified")
    return "notified"


@job(queue="orders", max_attempts=3)
def refuse(order_id: int) -> None:
    raise ValueError(f"order {order_id} cannot ship")


@job(queue="loop")
def again() -> None:
    """Enqueues itself, for ever."""
    again.enqueue()
