"""Jobs with application side effects, for the test kit's tests (tests/django/test_test_kit*,
tests/django/test_drain_keeps_the_test_transaction.py): they read and write ``Order`` rows,
enqueue one another, and touch the transaction as handlers do."""

from __future__ import annotations

from django.db import close_old_connections, connection, transaction

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


# Handler habits that touch the transaction (tests/django/test_drain_keeps_the_test_transaction.py).


@job(queue="habits", max_attempts=1)
def flags_rollback() -> None:
    """Writes, then asks for a rollback outside any block of its own."""
    Order.objects.create(note="flagged")
    transaction.set_rollback(True)


@job(queue="habits")
def closes_connections() -> str:
    """Tidies up as a long job does, then writes."""
    close_old_connections()
    connection.close()
    Order.objects.create(note="after close")
    return "closed"


@job(queue="habits")
def notes_on_commit() -> None:
    """Registers callbacks for its commit: outside any block, and in a block of its own."""
    Order.objects.create(note="committed")
    transaction.on_commit(lambda: Order.objects.create(note="on commit, outside"))
    with transaction.atomic():
        transaction.on_commit(lambda: Order.objects.create(note="on commit, in a block"))


@job(queue="habits", max_attempts=1)
def interrupted() -> None:
    raise KeyboardInterrupt
