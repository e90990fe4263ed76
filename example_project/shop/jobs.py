"""The shop's job kinds. Placing an order enqueues all three in the order's own transaction."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from awa_django import TerminalError, job
from shop.models import Order


@job(takes_context=True, queue="orders", max_attempts=5, deadline=60)
def fulfil_order(ctx: Any, order_id: int) -> dict[str, Any]:
    """Pack and ship an order, reporting progress; "flaky" orders fail their first two tries."""
    order = Order.objects.get(pk=order_id)
    for step in range(1, 5):
        if ctx.is_cancelled():
            return {"order": order_id, "status": "stopped"}
        ctx.set_progress(step * 25, f"packing step {step} of 4")
        time.sleep(0.1)
    if order.note == "flaky" and ctx.attempt < 3:
        raise ConnectionError("warehouse API timed out")
    return {"order": order_id, "status": "shipped"}


@job(queue="emails")
async def send_confirmation(order_id: int, email: str) -> str:
    """Send the order confirmation (an async handler)."""
    await asyncio.sleep(0.02)
    return f"confirmation for order {order_id} sent to {email}"


@job(queue="payments", max_attempts=3)
def charge_card(order_id: int) -> dict[str, Any]:
    """Charge the customer; a "fraud" order is refused for good (it lands in the DLQ)."""
    order = Order.objects.get(pk=order_id)
    if order.note == "fraud":
        raise TerminalError(f"card declined for order {order_id}: suspected fraud")
    return {"order": order_id, "charged": True}


@job(queue="reports", cron="* * * * *")
def sales_summary() -> dict[str, int]:
    """Every minute, a periodic job (docs/periodic.md): the number of orders so far. The admin's
    "Periodic schedules" page shows its next fire and its last job."""
    return {"orders": Order.objects.count()}
