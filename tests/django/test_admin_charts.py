"""A queue's charts page and the dashboard's refresh in place: what the maintenance leader rolled
up (awa.queue_minutes) drawn per minute over the last hour or day, as escaped SVG, behind the
queues' view permission."""

from __future__ import annotations

import io
import json
import re

import pytest
from django.contrib.staticfiles import finders
from django.core.management import call_command
from django.urls import reverse

from awa_django.admin.charts import series_chart
from tests.support.database import pg
from tests.support.factories import claim_and_finish, enqueue_sql, staff

pytestmark = [pytest.mark.usefixtures("clean_awa")]


def charts_url(queue: str) -> str:
    return reverse("admin:awa_django_queue_charts", args=[queue])


def rolled_up(queue: str) -> None:
    """Three jobs of ``queue`` finished three minutes ago, one left available, and the
    roll-up run over them."""
    with pg() as conn:
        enqueue_sql(conn, json.dumps([{"kind": "k", "queue": queue}] * 4))
        claim_and_finish(conn, queue, 2, "completed")
        claim_and_finish(
            conn, queue, 1, "cancel", error={"type": "X", "message": "", "traceback": ""}
        )
        conn.execute("UPDATE awa.done_entries SET finalized_at = finalized_at - interval '3 min'")
        conn.execute(
            "SELECT awa.queue_minutes_record_v1(date_trunc('minute', now()) - interval '110 s')"
        )
        conn.execute("SELECT awa.queue_minutes_record_v1(now())")


def test_a_queues_charts_show_the_last_hour_and_day_and_refresh_in_place() -> None:
    rolled_up("shop")
    client = staff()
    page = client.get(charts_url("shop")).content.decode()
    assert page.count("<figure") == 5
    for title in ("Throughput per minute", "Depth", "Age of the oldest available job"):
        assert title in page
    assert "Queue wait" in page and "Run time" in page
    assert 'data-awa-refresh="15"' in page and "awa_django/refresh.js" in page
    assert finders.find("awa_django/refresh.js")  # shipped as a static file of the app
    assert re.search(r"of the 60 minutes rolled up", page)
    assert '<span style="color:#417690">completed</span> (peak 2)' in page
    day = client.get(charts_url("shop") + "?span=day").content.decode()
    assert "of the 1440 minutes rolled up" in day and "<strong>the last day</strong>" in day
    fragment = client.get(charts_url("shop") + "?fragment=1").content.decode()
    assert "<figure" in fragment and "<html" not in fragment and "breadcrumbs" not in fragment
    # An unknown span reads as the hour; a queue without a row draws empty charts.
    assert "of the 60 minutes" in client.get(charts_url("shop") + "?span=week").content.decode()
    assert client.get(charts_url("nothing-here")).status_code == 200


def test_the_dashboard_links_each_queue_to_its_charts_and_refreshes_in_place() -> None:
    rolled_up("shop")
    client = staff()
    url = reverse("admin:awa_django_dashboard")
    page = client.get(url).content.decode()
    assert f'href="{charts_url("shop")}"' in page and 'data-awa-refresh="15"' in page
    fragment = client.get(url + "?fragment=1").content.decode()
    assert "<table>" in fragment and "<html" not in fragment
    detail = client.get(reverse("admin:awa_django_queuestat_change", args=["shop"]))
    assert f'href="{charts_url("shop")}?span=day"' in detail.content.decode()


def test_the_charts_need_the_queues_view_permission_and_a_queue_name() -> None:
    rolled_up("shop")
    assert staff(view=False).get(charts_url("shop")).status_code == 403
    assert staff().get(charts_url("Not%20A%20Queue")).status_code == 400
    assert staff().get(charts_url("x" * 64)).status_code == 400


def test_awa_maintenance_rolls_up_the_minute_that_ended() -> None:
    call_command("awa_maintenance", "--once", stderr=io.StringIO())
    with pg() as conn:
        [[last, expected]] = conn.execute(
            "SELECT max(minute), date_trunc('minute', now() - interval '70 s')"
            " FROM awa.queue_minutes WHERE queue = ''"
        ).fetchall()
    assert last is not None and abs((expected - last).total_seconds()) <= 60


def test_a_chart_escapes_its_labels_and_breaks_its_line_where_a_minute_is_missing() -> None:
    from datetime import UTC, datetime, timedelta

    start = datetime(2026, 1, 1, tzinfo=UTC)
    minutes = [start + timedelta(minutes=i) for i in range(4)]
    svg = series_chart("<b>t</b>", [("<i>x</i>", "#000", [1.0, None, 3.0, 2.0])], minutes)
    assert "<b>t</b>" not in svg and "&lt;b&gt;t&lt;/b&gt;" in svg and "<i>" not in svg
    assert svg.count("<polyline") == 1 and svg.count("<circle") == 1  # a dot, a gap, a line
    empty = series_chart("t", [("x", "#000", [None, None])], minutes[:2], unit="s")
    assert "<polyline" not in empty


def test_the_charts_read_where_this_request_reads_not_where_the_last_one_did() -> None:
    from awa_django.admin.read_alias import _read_alias

    rolled_up("shop")
    _read_alias.set("repeatable")  # left by an earlier request served by this thread
    page = staff().get(charts_url("shop"))
    assert page.status_code == 200 and "(peak 2)" in page.content.decode()
