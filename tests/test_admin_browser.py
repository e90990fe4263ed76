"""A real browser in the admin: Playwright driving Debian's Chromium headless.

Logs in, opens the DLQ, retries a job through the confirmation page, sees it leave the DLQ, and
saves screenshots of the dashboard and the DLQ list under tests/artifacts/. The test installs
Chromium with apt when it can; it is skipped, saying why, only where Chromium cannot be had.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User

from tests.admin_support import dead_letter
from tests.storage_support import pg

pytestmark = [pytest.mark.usefixtures("clean_awa")]

ARTIFACTS = Path(__file__).resolve().parent / "artifacts"
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


def chromium() -> str:
    path = shutil.which("chromium")
    if path is None and os.geteuid() == 0 and shutil.which("apt-get"):
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update", "-qq"], env=env, check=False, timeout=600)
        subprocess.run(
            ["apt-get", "install", "-y", "-qq", "chromium"], env=env, check=False, timeout=900
        )
        path = shutil.which("chromium")
    if path is None:
        pytest.skip("Chromium is not installed and cannot be installed here (not root, no apt)")
    return path


def log_in(browser: Any, url: str) -> Any:
    """A new page, logged in as the superuser ``admin`` (create it before Playwright starts:
    its event loop forbids the ORM)."""
    page = browser.new_page()
    page.goto(f"{url}/admin/login/")
    page.fill("#id_username", "admin")
    page.fill("#id_password", "secret-pass")
    page.click("input[type=submit]")
    return page


def test_retry_from_the_dlq_in_a_real_browser(live_server: Any) -> None:
    executable = chromium()
    playwright = pytest.importorskip("playwright.sync_api")
    User.objects.create_superuser("admin", "admin@example.com", "secret-pass")
    [job] = dead_letter()
    ARTIFACTS.mkdir(exist_ok=True)
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, args=BROWSER_FLAGS)
        try:
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
            page.goto(f"{live_server.url}/admin/awa_django/queuestat/dashboard/")
            page.wait_for_selector("svg")
            page.screenshot(path=str(ARTIFACTS / "dashboard.png"), full_page=True)
        finally:
            browser.close()
    with pg() as conn:
        row = conn.execute("SELECT state, in_dlq FROM awa.jobs WHERE id = %s", [job]).fetchone()
    assert row == ("available", False)
    assert (ARTIFACTS / "dashboard.png").stat().st_size > 0


def test_purge_all_of_a_filtered_list_with_select_all_in_a_real_browser(live_server: Any) -> None:
    executable = chromium()
    playwright = pytest.importorskip("playwright.sync_api")
    User.objects.create_superuser("admin", "admin@example.com", "secret-pass")
    dead_letter(60, queue="many")
    [other] = dead_letter(1, queue="other")
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, args=BROWSER_FLAGS)
        try:
            page = log_in(browser, live_server.url)
            page.goto(f"{live_server.url}/admin/awa_django/deadletter/?queue=many")
            page.check("#action-toggle")  # the 50 rows of this page...
            page.click(".question a")  # ...then "Select all 60"
            page.select_option("select[name=action]", "purge_jobs")
            page.click("button[name=index]")
            page.wait_for_selector("text=60 jobs selected")
            page.click('input[type=submit][value="Yes, I\'m sure"]')
            page.wait_for_selector("text=Purged 60 job(s).")
        finally:
            browser.close()
    with pg() as conn:
        rows = conn.execute("SELECT job_id FROM awa.dlq_entries").fetchall()
    assert rows == [(other,)]
