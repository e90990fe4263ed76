"""The admin's callback waits (docs/callbacks.md, docs/admin.md): the list with the time left, and
the resolve, fail and extend actions, gated by awa_django.resolve_callback, confirmed and logged."""

from __future__ import annotations

import pytest
from django.contrib.admin.models import LogEntry

import awa_django
from tests.support.admin_client import changelist, confirmed, messages_of, post_action
from tests.support.callbacks import job_row, parked, scalar
from tests.support.database import pg
from tests.support.factories import staff

pytestmark = [pytest.mark.usefixtures("clean_awa"), pytest.mark.pooler]


def test_the_list_shows_each_waiting_job_with_its_time_left() -> None:
    with pg() as conn:
        soon, _ = parked(conn, timeout=90)
        later, _ = parked(conn, timeout=7200, resume=True)
        hostile, _ = parked(conn, timeout=60, metadata={"x": "<script>alert(1)</script>"})
    client = staff()
    page = client.get(changelist("callbackwait"))
    assert page.status_code == 200
    text = page.content.decode()
    order = [text.index(link(c.job_id)) for c in (hostile, soon, later)]
    assert order == sorted(order)  # soonest timeout first
    assert "completes the job" in text and "resumes the job" in text
    assert "1m " in text and "1h 59m" in text
    detail = client.get(f"{changelist('callbackwait')}{hostile.job_id}/change/")
    assert detail.status_code == 200
    assert "<script>alert(1)</script>" not in detail.content.decode()
    assert "&lt;script&gt;" in detail.content.decode()
    # Resolved jobs leave the list.
    assert awa_django.resolve_callback(scalar_callback(soon.job_id), result=1) == "resolved"
    assert link(soon.job_id) not in client.get(changelist("callbackwait")).content.decode()


def link(job_id: int) -> str:
    return f'href="{changelist("callbackwait")}{job_id}/change/'


def scalar_callback(job_id: int) -> str:
    with pg() as conn:
        return str(
            scalar(conn, "SELECT callback_id FROM awa.callback_waits WHERE job_id = %s", job_id)
        )


def test_resolving_from_the_admin_completes_or_resumes_and_logs_each_job() -> None:
    with pg() as conn:
        plain, _ = parked(conn)
        stepped, _ = parked(conn, resume=True)
    client = staff("resolve_callback")
    ids = [plain.job_id, stepped.job_id]
    page, done = confirmed(client, "callbackwait", "resolve_jobs", ids, result='{"approved": true}')
    assert "2 waiting jobs selected" in page.content.decode()
    assert done.status_code == 302, done.content.decode()[:2000]
    assert messages_of(done) == ["Resolve callback waits: 2 job(s) resolved with a result."]
    with pg() as conn:
        assert job_row(conn, plain.job_id)["result"] == {"approved": True}
        resumed = job_row(conn, stepped.job_id)
    assert resumed["metadata"]["awa:callback"]["result"] == {"approved": True}
    assert resumed["state"] in ("scheduled", "available")
    entries = LogEntry.objects.order_by("object_id")
    assert [e.object_id for e in entries] == [str(i) for i in sorted(ids)]
    assert all(e.change_message.startswith("resolved with a result (callback ") for e in entries)


@pytest.mark.parametrize(("terminal", "state"), [("", "retryable"), ("on", "failed")])
def test_failing_from_the_admin_retries_or_fails(terminal: str, state: str) -> None:
    with pg() as conn:
        c, _ = parked(conn, max_attempts=3)
    client = staff("resolve_callback")
    form = {"error": "refused by the reviewer"}
    if terminal:
        form["terminal"] = terminal
    _, done = confirmed(client, "callbackwait", "fail_jobs", [c.job_id], **form)
    assert messages_of(done) == ["Fail callback waits: 1 job(s) failed with an error."]
    with pg() as conn:
        job = job_row(conn, c.job_id)
    assert job["state"] == state
    assert job["errors"][-1]["message"] == "refused by the reviewer"


def test_extending_from_the_admin_moves_the_timeout() -> None:
    with pg() as conn:
        c, _ = parked(conn, timeout=60)
        before = scalar(conn, "SELECT timeout_at FROM awa.callback_waits")
    client = staff("resolve_callback")
    _, done = confirmed(client, "callbackwait", "extend_jobs", [c.job_id], seconds="86400")
    assert messages_of(done) == ["Extend callback waits: 1 job(s) extended."]
    with pg() as conn:
        after = scalar(conn, "SELECT timeout_at FROM awa.callback_waits")
    assert (after - before).total_seconds() > 80_000


def test_a_result_that_is_not_json_is_refused_on_the_form() -> None:
    with pg() as conn:
        c, _ = parked(conn)
    client = staff("resolve_callback")
    for bad in ("{not json", "NaN", '"\\u0000"', "[" * 40 + "]" * 40):
        _, done = confirmed(client, "callbackwait", "resolve_jobs", [c.job_id], result=bad)
        assert done.status_code == 200  # the confirmation page again, with the error
        assert "Not a result that can be stored" in done.content.decode()
    with pg() as conn:
        assert job_row(conn, c.job_id)["state"] == "waiting_external"
    assert LogEntry.objects.count() == 0


def test_a_wait_resolved_meanwhile_is_left_alone() -> None:
    with pg() as conn:
        c, callback = parked(conn)
    client = staff("resolve_callback")
    page = post_action(client, "callbackwait", "resolve_jobs", [c.job_id])
    assert page.status_code == 200
    assert awa_django.resolve_callback(callback, result="elsewhere") == "resolved"
    from tests.support.admin_client import form_fields

    done = client.post(changelist("callbackwait"), {**form_fields(page), "result": "1"})
    assert messages_of(done) == ["None of the selected waiting jobs is left; nothing was changed."]
    with pg() as conn:
        assert job_row(conn, c.job_id)["result"] == "elsewhere"
    assert LogEntry.objects.count() == 0


def test_the_actions_need_the_permission() -> None:
    with pg() as conn:
        c, _ = parked(conn)
    viewer = staff()
    page = viewer.get(changelist("callbackwait"))
    assert page.status_code == 200
    assert "resolve_jobs" not in page.content.decode()
    # Forged confirmations change nothing (the action is not offered to this user).
    forged = {"confirm": "yes", "select_across": "1", "result": "1", "error": "x"}
    for action in ("resolve_jobs", "fail_jobs", "extend_jobs"):
        post_action(
            viewer, "callbackwait", action, [c.job_id], awa_selected=str(c.job_id), **forged
        )
    with pg() as conn:
        assert job_row(conn, c.job_id)["state"] == "waiting_external"
    assert not LogEntry.objects.exists()
    nobody = staff(view=False)
    assert nobody.get(changelist("callbackwait")).status_code == 403
