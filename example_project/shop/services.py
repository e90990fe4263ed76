"""Placing an order: the order row and its jobs commit (or roll back) together."""

from __future__ import annotations

from django.db import transaction

from shop.jobs import charge_card, fulfil_order, send_confirmation
from shop.models import Order


def place_order(email: str, note: str = "") -> Order:
    """Create the order and enqueue its jobs in one transaction: no on_commit needed."""
    with transaction.atomic():
        order = Order.objects.create(customer_email=email, note=note)
        charge_card.enqueue(order.id)
        fulfil_order.using(metadata={"order_id": order.id}).enqueue(order.id)
        send_confirmation.enqueue(order.id, email)
    return order
