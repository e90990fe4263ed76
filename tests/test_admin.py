"""The admin: read-only lists and details, permission-gated actions, escaping, the dashboard."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.urls import reverse

from awa_django.db import storage
from awa_django.db.storage import Finalization
from awa_django.models import DeadLetter, ReadOnlyError
from tests import storage_support, testjobs
from tests.storage_support import WORKER, job_state, pg

pytestmark = [pytest.mark.usefixtures("clean_awa")]

HOSTILE = "<script>alert('x')</script>"


def staff(*perms: str) -> Client:
    user = User.objects.create_user(f"u{User.objects.count()}", password="x", is_staff=True)
    views = Permission.objects.filter(
        content_type__app_label="awa_django", codename__startswith="view_"
    )
    user.user_permissions.add(
        *views, *Permission.objects.filter(content_type__app_label="awa_django", codename__in=perms)
    )
    client = Client()
    client.force_login(user)
    return client


def dead_letter(n: int = 1, queue: str = "default") -> list[int]:
    return storage_support.dead_letter(n, queue, kind=f"hostile.{HOSTILE}", text=HOSTILE)


def action(client: Client, model: str, name: str, ids: list[Any], **extra: Any) -> Any:
    url = reverse(f"admin:awa_django_{model}_changelist")
    return client.post(url, {"action": name, "_selected_action": [str(i) for i in ids], **extra})


def test_view_only_staff_sees_lists_but_no_actions() -> None:
    [job] = dead_letter()
    testjobs.noop.enqueue()
    client = staff()
    for model in ("deadletter", "terminaljob", "job", "queuestat", "worker"):
        response = client.get(reverse(f"admin:awa_django_{model}_changelist"))
        assert response.status_code == 200, model
    page = client.get(reverse("admin:awa_django_deadletter_changelist")).content.decode()
    assert "retry_jobs" not in page and "purge_jobs" not in page
    detail = client.get(reverse("admin:awa_django_deadletter_change", args=[job]))
    assert detail.status_code == 200
    # A forged POST changes nothing.
    for name in ("retry_jobs", "purge_jobs"):
        action(client, "deadletter", name, [job], confirm="yes")
    assert DeadLetter.objects.filter(job_id=job).exists()
    live = testjobs.noop.enqueue().id
    action(client, "job", "cancel_jobs", [live], confirm="yes")
    action(client, "queuestat", "pause_queues", ["default"])
    with pg() as conn:
        assert job_state(conn, live)["state"] == "available"  # type: ignore[index]
        assert conn.execute(
            "SELECT paused FROM awa.queue_meta WHERE queue = 'default'"
        ).fetchone() == (False,)
    assert not LogEntry.objects.exists()


def test_retry_through_the_confirmation_page_writes_a_log_entry() -> None:
    ids = dead_letter(2)
    client = staff("retry_dlq")
    confirm = action(client, "deadletter", "retry_jobs", ids)
    assert confirm.status_code == 200 and 'name="confirm"' in confirm.content.decode()
    assert DeadLetter.objects.count() == 2  # nothing happens before confirmation
    done = action(
        client, "deadletter", "retry_jobs", ids, confirm="yes", queue="again", priority="5"
    )
    assert done.status_code == 302
    assert DeadLetter.objects.count() == 0
    with pg() as conn:
        state = job_state(conn, ids[0])
    assert state is not None and (state["state"], state["queue"], state["priority"]) == (
        "available",
        "again",
        5,
    )
    entry = LogEntry.objects.get(object_id=str(ids[0]))
    assert "retried job ids" in entry.change_message and str(ids[1]) in entry.change_message


def test_purge_cancel_and_queue_actions_with_permissions() -> None:
    [dead] = dead_letter()
    client = staff("purge_dlq", "cancel_job", "manage_queue")
    action(client, "deadletter", "purge_jobs", [dead], confirm="yes")
    assert not DeadLetter.objects.exists()
    live = testjobs.noop.enqueue().id
    action(client, "job", "cancel_jobs", [live], confirm="yes")
    action(client, "queuestat", "pause_queues", ["default"])
    with pg() as conn:
        assert job_state(conn, live)["state"] == "cancelled"  # type: ignore[index]
        assert conn.execute(
            "SELECT paused FROM awa.queue_meta WHERE queue = 'default'"
        ).fetchone() == (True,)
    messages = list(LogEntry.objects.values_list("change_message", flat=True))
    assert any("purged job ids" in m for m in messages)
    assert any("cancelled job ids" in m for m in messages)
    assert any("paused queues" in m for m in messages)


def test_hostile_job_data_is_escaped_everywhere() -> None:
    [job] = dead_letter()
    client = staff()
    pages = [
        client.get(reverse("admin:awa_django_deadletter_changelist")),
        client.get(reverse("admin:awa_django_deadletter_change", args=[job])),
        client.get(reverse("admin:awa_django_dashboard")),
    ]
    for response in pages:
        body = response.content.decode()
        assert response.status_code == 200
        assert HOSTILE not in body
    assert "&lt;script&gt;" in pages[1].content.decode()


def test_dashboard_renders_counts_and_a_sparkline() -> None:
    testjobs.noop.enqueue()
    with pg() as conn:
        [c] = storage.claim(conn, "default", 1, WORKER)
        storage.finalize(conn, [Finalization(c.job_id, c.run_lease, c.claim_slot, "completed")])
    body = staff().get(reverse("admin:awa_django_dashboard")).content.decode()
    assert "<svg" in body and "default" in body and "peak 1" in body


def test_models_are_read_only() -> None:
    [job] = dead_letter()
    entry = DeadLetter.objects.get(job_id=job)
    with pytest.raises(ReadOnlyError):
        entry.save()
    with pytest.raises(ReadOnlyError):
        entry.delete()
    with pytest.raises(ReadOnlyError):
        DeadLetter.objects.filter(job_id=job).update(queue="x")
    with pytest.raises(ReadOnlyError):
        DeadLetter.objects.all().delete()
    assert staff().get(reverse("admin:awa_django_deadletter_add")).status_code == 403
