"""Actions on an object's own page (docs/admin.md): each detail page offers, as buttons, the
list actions that apply to its row and that the user may run; a button goes through the same
confirmation page, permission check and ``LogEntry`` as the list action."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.admin.models import LogEntry
from django.test import Client

from awa_django.operator import queue_pause
from tests.jobs import common as testjobs
from tests.support.admin_client import buttons, changelist, messages_of, press
from tests.support.callbacks import parked
from tests.support.database import pg
from tests.support.factories import dead_letter, staff

pytestmark = pytest.mark.usefixtures("clean_awa")


def detail(client: Client, model: str, key: Any) -> Any:
    page = client.get(f"{changelist(model)}{key}/change/")
    assert page.status_code == 200, page
    return page


def test_a_dead_letter_is_retried_from_its_own_page_and_logged() -> None:
    [job] = dead_letter()
    operator = staff("retry_dlq", "purge_dlq")
    page = detail(operator, "deadletter", job)
    assert {n: b[2] for n, b in buttons(page).items()} == {
        "retry_jobs": "Retry",
        "purge_jobs": "Purge",
    }
    confirmation, done = press(operator, page, "retry_jobs", queue="elsewhere")
    assert f"{job}" in confirmation.content.decode()
    assert messages_of(done) == ["Retried 1 job(s)."]
    with pg() as conn:
        row = conn.execute("SELECT queue, state FROM awa.jobs WHERE id = %s", [job]).fetchone()
    assert row == ("elsewhere", "available")
    assert list(LogEntry.objects.values_list("object_id", "change_message")) == [
        (str(job), "retried into queue elsewhere")
    ]


def test_staff_without_the_permission_see_no_button_and_a_forged_post_changes_nothing() -> None:
    [job] = dead_letter()
    viewer = staff()
    assert buttons(detail(viewer, "deadletter", job)) == {}
    forged = viewer.post(
        changelist("deadletter"),
        {"action": "purge_jobs", "index": "0", "_selected_action": str(job), "confirm": "yes"},
    )
    assert forged.status_code == 403
    # Two actions in one POST, the first withheld: refused too, whichever Django would run.
    doubled = staff("retry_dlq").post(
        changelist("deadletter"),
        {"action": ["purge_jobs", "retry_jobs"], "index": "0", "_selected_action": str(job)},
    )
    assert doubled.status_code == 403
    with pg() as conn:
        assert conn.execute("SELECT count(*) FROM awa.dlq_entries").fetchone() == (1,)
    assert not LogEntry.objects.exists()
    # Only the permission held is offered.
    assert set(buttons(detail(staff("purge_dlq"), "deadletter", job))) == {"purge_jobs"}


def test_each_page_offers_what_applies_to_its_row() -> None:
    live = testjobs.noop.enqueue().id
    with pg() as conn:
        waiting, _ = parked(conn, queue="ops")
    queue_pause("ops")
    everything = staff(
        "cancel_job", "retry_job", "retry_dlq", "purge_dlq", "resolve_callback", "manage_queue"
    )
    assert set(buttons(detail(everything, "livejob", live))) == {"cancel_jobs"}
    assert set(buttons(detail(everything, "callbackwait", waiting.job_id))) == {
        "resolve_jobs",
        "fail_jobs",
        "extend_jobs",
    }
    ops = {n: b[2] for n, b in buttons(detail(everything, "queuestat", "ops")).items()}
    assert ops == {
        "resume_queues": "Resume",  # paused: no Pause
        "drain_queues": "Drain (cancel waiting jobs)",
        "limit_queues": "Set flow limits",
        "dlq_off_queues": "Turn the DLQ off (failures stay in history)",  # on: no "on"
    }
    default = set(buttons(detail(everything, "queuestat", "default")))
    assert "pause_queues" in default and "resume_queues" not in default
    # A failed job of history is retried as a new job; a completed one is not offered that.
    with pg() as conn:
        conn.execute("SELECT awa.cancel_v1(%s, %s)", [live, "test"])
    cancelled = {n: b[2] for n, b in buttons(detail(everything, "terminaljob", live)).items()}
    assert cancelled == {"retry_jobs": "Retry (as a new job)"}


def test_buttons_that_could_not_act_are_not_offered() -> None:
    from django.conf import settings
    from django.test import override_settings

    from awa_django.operator import history_retry

    failed = testjobs.noop.enqueue().id
    with pg() as conn:
        conn.execute("SELECT awa.cancel_v1(%s, %s)", [failed, "test"])
    operator = staff("retry_job", "manage_queue")
    assert "retry_jobs" in buttons(detail(operator, "terminaljob", failed))
    [done] = history_retry([failed], by="test")
    page = detail(operator, "terminaljob", failed)
    assert "retry_jobs" not in buttons(page)  # a job is retried from history at most once
    assert f">{done.retry_job_id}<" in page.content.decode()  # "retried from history as"
    pinned = {**settings.AWA, "QUEUES": {"default": {"dlq": False}}}
    with override_settings(AWA=pinned):
        offered = set(buttons(detail(operator, "queuestat", "default")))
    assert not offered & {"dlq_on_queues", "dlq_off_queues"}  # the settings set it
    assert "pause_queues" in offered
