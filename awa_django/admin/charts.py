"""A queue's charts page in the admin: over the last hour or day, per minute, its outcomes, its
depth and the age of its oldest job, and the p50/p95 of its queue wait and run time, read from
the maintenance leader's roll-up (``operator.queue_minutes``) and drawn as server-rendered SVG
(no JavaScript library, no CDN). The page refreshes its charts in place every
:data:`REFRESH_SECONDS` (``static/awa_django/refresh.js`` fetches ``?fragment=1``).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.contrib.admin import ModelAdmin
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe

from awa_django.admin.read_alias import admin_read_alias, choose_read_alias
from awa_django.exceptions import JobValidationError
from awa_django.limits import check_queue_name
from awa_django.operator import QueueMinute, queue_minutes
from awa_django.timetext import duration

__all__ = ["REFRESH_SECONDS", "SPANS", "live_page", "queue_charts", "series_chart"]

#: The spans a page shows: ``?span=`` to minutes.
SPANS = {"hour": 60, "day": 1440}
#: How often an open charts page (and the dashboard) fetches its charts again.
REFRESH_SECONDS = 15

Series = tuple[str, str, Sequence[float | None]]  # label, colour, one value per minute

_WIDTH, _HEIGHT, _PAD = 600, 110, 4


def _segments(values: Sequence[float | None], step: float, top: float) -> list[str]:
    """The polyline points of each run of known values (a None, a minute not rolled up or not
    measured, breaks the line)."""
    runs: list[str] = []
    points: list[str] = []
    for i, value in enumerate(values):
        if value is None:
            if points:
                runs.append(" ".join(points))
                points = []
            continue
        y = _HEIGHT - _PAD - (value / top) * (_HEIGHT - 2 * _PAD)
        points.append(f"{i * step:.1f},{y:.1f}")
    if points:
        runs.append(" ".join(points))
    return runs


def _mark(colour: str, points: str) -> SafeString:
    """A run of points as a line; a lone point (a minute between two gaps) as a dot."""
    if " " in points:
        return format_html(
            '<polyline fill="none" stroke="{}" stroke-width="1.5" points="{}"/>', colour, points
        )
    x, y = points.split(",")
    return format_html('<circle cx="{}" cy="{}" r="2" fill="{}"/>', x, y, colour)


def _amount(value: float, unit: str) -> str:
    return duration(value) if unit == "s" else f"{value:,.0f}"


def series_chart(
    title: str, series: Sequence[Series], minutes: Sequence[datetime], *, unit: str = ""
) -> SafeString:
    """One chart: a line per series on one scale, the peak on the left, the first and last
    minute below; ``unit`` "s" shows values as durations. Everything is escaped."""
    known = [v for _, _, values in series for v in values if v is not None]
    top = max(max(known, default=0.0), 1e-9 if unit == "s" else 1.0)
    step = _WIDTH / max(len(minutes) - 1, 1)
    lines = format_html_join(
        "",
        "{}",
        (
            (_mark(colour, points),)
            for _, colour, values in series
            for points in _segments(values, step, top)
        ),
    )
    legend = format_html_join(
        ", ",
        '<span style="color:{}">{}</span> (peak {})',
        (
            (colour, label, _amount(max((v for v in values if v is not None), default=0), unit))
            for label, colour, values in series
        ),
    )
    first = timezone.localtime(minutes[0]).strftime("%H:%M") if minutes else ""
    last = timezone.localtime(minutes[-1]).strftime("%H:%M %Z") if minutes else ""
    return format_html(
        '<figure class="awa-chart"><figcaption><strong>{}</strong>: {}</figcaption>'
        '<svg width="{}" height="{}" viewBox="0 0 {} {}" role="img" aria-label="{}">'
        '<rect width="100%" height="100%" fill="none" stroke="#ccc"/>{}</svg>'
        '<div style="display:flex;justify-content:space-between;width:{}px">'
        "<small>{}</small><small>top of the chart: {}</small><small>{}</small></div></figure>",
        title,
        legend,
        _WIDTH,
        _HEIGHT,
        _WIDTH,
        _HEIGHT,
        f"{title}, per minute",
        lines,
        _WIDTH,
        first,
        _amount(top, unit),
        last,
    )


def _charts(rows: Sequence[QueueMinute]) -> list[SafeString]:
    minutes = [r.minute for r in rows]

    def column(name: str) -> list[float | None]:
        return [getattr(r, name) for r in rows]

    failures = [
        None if r.failed is None else r.failed + (r.dead_lettered or 0) + (r.cancelled or 0)
        for r in rows
    ]
    return [
        series_chart(
            "Throughput per minute",
            [
                ("completed", "#417690", column("completed")),
                ("failed", "#ba2121", failures),
                ("retried", "#c77c02", column("retried")),
            ],
            minutes,
        ),
        series_chart(
            "Depth",
            [
                ("available", "#417690", column("available")),
                ("retryable", "#c77c02", column("retryable")),
            ],
            minutes,
        ),
        series_chart(
            "Age of the oldest available job",
            [("oldest", "#6f42c1", column("oldest_seconds"))],
            minutes,
            unit="s",
        ),
        series_chart(
            "Queue wait",
            [("p50", "#417690", column("wait_p50")), ("p95", "#ba2121", column("wait_p95"))],
            minutes,
            unit="s",
        ),
        series_chart(
            "Run time",
            [("p50", "#417690", column("run_p50")), ("p95", "#ba2121", column("run_p95"))],
            minutes,
            unit="s",
        ),
    ]


def queue_charts(model_admin: ModelAdmin[Any], request: HttpRequest, queue: str) -> HttpResponse:
    """The charts page of ``queue`` (``?span=hour`` or ``day``; ``?fragment=1``: only the
    charts, for the refresh in place). Needs the view permission of queues."""
    if not model_admin.has_view_permission(request):
        raise PermissionDenied
    try:
        check_queue_name(queue)
    except JobValidationError as exc:
        return HttpResponse(f"Not a queue name: {exc}", status=400, content_type="text/plain")
    span = request.GET.get("span", "hour")
    if span not in SPANS:
        span = "hour"
    banner = choose_read_alias()  # where this request reads: a replica, or the primary
    rows = queue_minutes(queue, SPANS[span], using=admin_read_alias())
    recorded = sum(r.recorded for r in rows)
    context = {
        "queue": queue,
        "span": span,
        "spans": list(SPANS),
        "charts": mark_safe("".join(_charts(rows))),  # each escaped by format_html
        "recorded": recorded,
        "minutes": len(rows),
        "refresh": REFRESH_SECONDS,
    }
    return live_page(
        model_admin,
        request,
        "admin/awa_django/queue_charts",
        context,
        title=f"Queue {queue}: the last {span}",
        banner=banner,
    )


def live_page(
    model_admin: ModelAdmin[Any],
    request: HttpRequest,
    template: str,
    context: dict[str, Any],
    *,
    title: str,
    banner: tuple[int, str] | None,
) -> TemplateResponse:
    """A page whose live part refreshes in place (``static/awa_django/refresh.js``): for
    ``?fragment=1`` only that part, ``<template>_body.html``; otherwise the whole admin page,
    ``<template>.html``, with the read alias's ``banner`` as a message."""
    if request.GET.get("fragment") == "1":
        return TemplateResponse(request, f"{template}_body.html", context)
    if banner is not None:
        model_admin.message_user(request, banner[1], banner[0])
    return TemplateResponse(
        request,
        f"{template}.html",
        {
            **model_admin.admin_site.each_context(request),
            **context,
            "title": title,
            "opts": model_admin.model._meta,
        },
    )
