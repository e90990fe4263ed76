"""The shop's pages: place an order (the order row and its jobs in one transaction), and watch
its jobs' progress."""

from __future__ import annotations

from django import forms
from django.db import connection
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render

from shop.models import Order
from shop.services import place_order


class OrderForm(forms.Form):
    email = forms.EmailField()
    note = forms.ChoiceField(
        choices=[("", "normal"), ("flaky", "flaky (retries twice)"), ("fraud", "fraud (DLQ)")],
        required=False,
    )


def new_order(request: HttpRequest) -> HttpResponse:
    form = OrderForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        order = place_order(form.cleaned_data["email"], form.cleaned_data["note"])
        return redirect("order", order_id=order.id)
    return render(request, "shop/new_order.html", {"form": form})


def order_detail(request: HttpRequest, order_id: int) -> HttpResponse:
    order = get_object_or_404(Order, pk=order_id)
    with connection.cursor() as cursor:
        # The order's jobs, from every plane (awa.jobs): their arguments name the order.
        cursor.execute(
            "SELECT id, kind, state, attempt, max_attempts, progress, result, in_dlq "
            "FROM awa.jobs WHERE (args -> 'args' ->> 0)::bigint = %s "
            "AND kind LIKE 'shop.jobs.%%' ORDER BY id",
            [order.id],
        )
        names = ["id", "kind", "state", "attempt", "max_attempts", "progress", "result", "in_dlq"]
        jobs = [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
    return render(request, "shop/order.html", {"order": order, "jobs": jobs})
