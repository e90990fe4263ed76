"""A real browser in the admin: Playwright driving Debian's Chromium headless.

Logs in, opens the DLQ, retries a job through the confirmation page, sees it leave the DLQ, and
saves screenshots of the main pages (the DLQ list and a DLQ job, the dashboard, the queues,
a retried job) under tests/artifacts/. Chromium is installed by scripts/bootstrap browser
(Debian's ``chromium`` package, as root); where it is missing the tests are skipped, saying
why.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User

from tests.support.database import pg
from tests.support.factories import hostile_dead_letter as dead_letter

ARTIFACTS = Path(__file__).resolve().parent.parent / "artifacts"
CHROMIUM = Path("/usr/bin/chromium")

# The tests never install a browser: scripts/bootstrap does (see docs/development.md). A
# browser's start-up makes them slow: the dj6 lane leaves them to the dj52 lane.
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not os.access(CHROMIUM, os.X_OK),
        reason=f"{CHROMIUM} is missing: scripts/bootstrap browser installs Debian's chromium "
        "package when it runs as root with apt-get (it failed or could not); install it by hand",
    ),
    pytest.mark.usefixtures("clean_awa"),
]
BROWSER_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@contextlib.contextmanager
def chromium() -> Iterator[Any]:
    """Debian's Chromium, headless, driven by Playwright (skipped when Playwright is missing);
    closed at the end."""
    playwright = pytest.importorskip("playwright.sync_api")
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=BROWSER_FLAGS)
        try:
            yield browser
        finally:
            browser.close()


def log_in(browser: Any, url: str, user: str = "admin") -> Any:
    """A new page in a context of its own, logged in as ``user`` (the superuser ``admin`` by
    default; create users before Playwright starts: its event loop forbids the ORM)."""
    page = browser.new_context().new_page()
    page.goto(f"{url}/admin/login/")
    page.fill("#id_username", user)
    page.fill("#id_password", "secret-pass")
    page.click("input[type=submit]")
    return page


def test_retry_from_the_dlq_in_a_real_browser(live_server: Any) -> None:
    User.objects.create_superuser("admin", "admin@example.com", "secret-pass")
    [job, own_page] = dead_letter(2)
    ARTIFACTS.mkdir(exist_ok=True)
    with chromium() as browser:
        page = log_in(browser, live_server.url)
        page.goto(f"{live_server.url}/admin/awa_django/deadletter/")
        assert page.locator(f"input[name=_selected_action][value='{job}']").count() == 1
        page.screenshot(path=str(ARTIFACTS / "dlq-list.png"), full_page=True)
        page.check(f"input[name=_selected_action][value='{job}']")
        page.select_option("select[name=action]", "retry_jobs")
        page.click("button[name=index]")
        page.wait_for_selector("input[name=confirm]", state="attached")
        page.click('input[type=submit][value="Yes, I\'m sure"]')
        page.wait_for_selector("text=Retried 1 job(s).")
        assert page.locator(f"input[name=_selected_action][value='{job}']").count() == 0
        # The other one from its own page: its Retry button, then the same confirmation.
        page.goto(f"{live_server.url}/admin/awa_django/deadletter/{own_page}/change/")
        page.screenshot(path=str(ARTIFACTS / "dlq-job.png"), full_page=True)
        page.click("form.awa-object-action button[value=retry_jobs]")
        page.wait_for_selector("input[name=confirm]", state="attached")
        page.click('input[type=submit][value="Yes, I\'m sure"]')
        page.wait_for_selector("text=Retried 1 job(s).")
        page.goto(f"{live_server.url}/admin/awa_django/queuestat/dashboard/")
        page.wait_for_selector("svg")
        page.screenshot(path=str(ARTIFACTS / "dashboard.png"), full_page=True)
        page.goto(f"{live_server.url}/admin/awa_django/queuestat/")
        page.screenshot(path=str(ARTIFACTS / "queues.png"), full_page=True)
        page.goto(f"{live_server.url}/admin/awa_django/livejob/{job}/change/")
        page.wait_for_selector("text=Attempts")
        page.screenshot(path=str(ARTIFACTS / "retried-job.png"), full_page=True)
    with pg() as conn:
        for retried in (job, own_page):
            row = conn.execute(
                "SELECT state, in_dlq FROM awa.jobs WHERE id = %s", [retried]
            ).fetchone()
            assert row == ("available", False), retried
    assert (ARTIFACTS / "dashboard.png").stat().st_size > 0


def test_purge_all_of_a_filtered_list_with_select_all_in_a_real_browser(live_server: Any) -> None:
    User.objects.create_superuser("admin", "admin@example.com", "secret-pass")
    dead_letter(60, queue="many")
    [other] = dead_letter(1, queue="other")
    with chromium() as browser:
        page = log_in(browser, live_server.url)
        page.goto(f"{live_server.url}/admin/awa_django/deadletter/?queue=many")
        page.check("#action-toggle")  # the 50 rows of this page...
        page.click(".question a")  # ...then "Select all 60"
        page.select_option("select[name=action]", "purge_jobs")
        page.click("button[name=index]")
        page.wait_for_selector("text=60 jobs selected")
        page.click('input[type=submit][value="Yes, I\'m sure"]')
        page.wait_for_selector("text=Purged 60 job(s).")
    with pg() as conn:
        rows = conn.execute("SELECT job_id FROM awa.dlq_entries").fetchall()
    assert rows == [(other,)]


def test_each_detail_page_action_is_clicked_through_and_hidden_from_a_viewer(
    live_server: Any,
) -> None:
    """As an operator, each action button on a row's own page, through its confirmation (with
    its form filled in where it has one) to its message; as a staff user who may only view,
    the same pages show no button."""
    from awa_django.operator import cancel
    from tests.jobs import common as testjobs
    from tests.support.callbacks import parked

    User.objects.create_superuser("admin", "admin@example.com", "secret-pass")
    viewer = User.objects.create_user("viewer", password="secret-pass", is_staff=True)
    viewer.user_permissions.add(*view_permissions())
    with pg() as conn:  # each claims a job of its queue: before the others are enqueued
        waiting, _ = parked(conn, queue="ops")
        resolved, _ = parked(conn, queue="ops")
        failed, _ = parked(conn, queue="ops")
    [dead] = dead_letter(1)
    live = testjobs.noop.enqueue(queue="ops").id
    finished = testjobs.noop.enqueue().id
    assert cancel(finished)
    admin_url = f"{live_server.url}/admin/awa_django"
    steps = [  # page, button, form fields, message
        (f"livejob/{live}", "cancel_jobs", {}, "Cancelled 1 job(s)."),
        (f"callbackwait/{waiting.job_id}", "extend_jobs", {"seconds": "600"}, "1 job(s) extended"),
        (
            f"callbackwait/{resolved.job_id}",
            "resolve_jobs",
            {"result": '{"ok": true}'},
            "1 job(s) resolved with a result",
        ),
        (
            f"callbackwait/{failed.job_id}",
            "fail_jobs",
            {"error": "the payment provider said no"},
            "1 job(s) failed with an error",
        ),
        (f"terminaljob/{finished}", "retry_jobs", {}, "Retried 1 job(s) as new jobs"),
        (f"deadletter/{dead}", "purge_jobs", {}, "Purged 1 job(s)."),
        ("queuestat/ops", "pause_queues", {}, "Pause queues: ops paused"),
        ("queuestat/ops", "resume_queues", {}, "Resume queues: ops resumed"),
        ("queuestat/ops", "limit_queues", {"global_concurrency": "4"}, "ops flow limits set"),
        ("queuestat/ops", "dlq_off_queues", {}, "Dead letter queue turned off for 1 queue(s)"),
        ("queuestat/ops", "drain_queues", {}, "Drain queues: ops drained"),
    ]
    with chromium() as browser:
        page = log_in(browser, live_server.url)
        for where, button, fields, message in steps:
            page.goto(f"{admin_url}/{where}/change/")
            page.click(f"form.awa-object-action button[value={button}]")
            page.wait_for_selector("input[name=confirm]", state="attached")
            for name, value in fields.items():
                page.fill(f"[name={name}]", value)
            page.click('input[type=submit][value="Yes, I\'m sure"]')
            page.wait_for_selector(f"text={message}")
        looker = log_in(browser, live_server.url, user="viewer")
        for where, *_ in steps:
            looker.goto(f"{admin_url}/{where}/change/")
            assert looker.locator("form.awa-object-action").count() == 0, where
    with pg() as conn:
        states = dict(
            conn.execute(
                "SELECT id, state FROM awa.jobs WHERE id = ANY(%s)", [[live, finished]]
            ).fetchall()
        )
        [[timeout_at]] = conn.execute(
            "SELECT timeout_at - now() FROM awa.callback_waits WHERE job_id = %s",
            [waiting.job_id],
        ).fetchall()
    assert states == {live: "cancelled", finished: "cancelled"}
    assert timeout_at.total_seconds() > 300  # extended from 60 s


def view_permissions() -> list[Any]:
    from django.contrib.auth.models import Permission

    return list(Permission.objects.filter(codename__startswith="view_"))


def test_a_queues_charts_refresh_in_place_in_a_real_browser(
    live_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from awa_django.admin import charts

    monkeypatch.setattr(charts, "REFRESH_SECONDS", 2)
    User.objects.create_superuser("admin", "admin@example.com", "secret-pass")
    viewer = User.objects.create_user("viewer", password="secret-pass", is_staff=True)
    viewer.user_permissions.add(*view_permissions())
    finished_minutes_ago("shop", 3, 4)
    ARTIFACTS.mkdir(exist_ok=True)
    with chromium() as browser:
        page = log_in(browser, live_server.url)
        page.goto(f"{live_server.url}/admin/awa_django/queuestat/shop/charts/")
        page.wait_for_selector("text=(peak 4)")
        page.screenshot(path=str(ARTIFACTS / "queue-charts.png"), full_page=True)
        finished_minutes_ago("shop", 2, 7)  # a later minute, rolled up while the page is open
        page.wait_for_selector("#awa-charts[data-awa-refreshed] >> text=(peak 7)")
        assert page.url.endswith("/shop/charts/")  # in place: the page was not reloaded
        # Logged out meanwhile (the session ended): the page reloads to the login page
        # rather than drawing it inside the charts' box.
        page.context.clear_cookies()
        page.wait_for_url("**/admin/login/**")
        assert page.locator("#awa-charts").count() == 0
        # The permission taken away meanwhile: the page reloads, to say so.
        looker = log_in(browser, live_server.url, user="viewer")
        looker.goto(f"{live_server.url}/admin/awa_django/queuestat/shop/charts/")
        looker.wait_for_selector("#awa-charts")
        with pg() as conn:
            conn.execute("DELETE FROM auth_user_user_permissions")
        looker.wait_for_selector("text=403 Forbidden")
        assert looker.locator("#awa-charts").count() == 0


def finished_minutes_ago(queue: str, minutes: int, n: int) -> None:
    """``n`` jobs of ``queue`` completed ``minutes`` minutes ago, and that minute rolled up."""
    from tests.support.factories import claim_and_finish, enqueue_sql

    with pg() as conn:
        enqueue_sql(conn, json.dumps([{"kind": "k", "queue": queue}] * n))
        ids = claim_and_finish(conn, queue, n, "completed")
        conn.execute(
            "UPDATE awa.done_entries SET finalized_at = date_trunc('minute', now())"
            " - make_interval(mins => %s) + interval '1 s' WHERE job_id = ANY(%s)",
            [minutes, ids],
        )
        conn.execute(
            "SELECT awa.queue_minutes_record_v1(date_trunc('minute', now())"
            " - make_interval(mins => %s) + interval '70 s')",
            [minutes],
        )
