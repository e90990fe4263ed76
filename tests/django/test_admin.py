"""The admin pages: read-only lists and details, permissions, escaping, tags, search and filters
that never fail, no history scans, the dashboard. Actions: tests/django/test_admin_actions.py."""

from __future__ import annotations

import io
import re
from typing import Any

import pytest
from django.contrib.admin.models import LogEntry
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from awa_django.admin.base import CappedPaginator, search_jobs
from awa_django.db import storage
from awa_django.db.storage import Finalization
from awa_django.models import DeadLetter, LiveJob, ReadOnlyError, TerminalJob
from tests.jobs import common as testjobs
from tests.support.admin_client import changelist, confirmed, messages_of, post_action
from tests.support.awa_schema import job_state
from tests.support.database import pg
from tests.support.factories import HOSTILE, TAGS, WORKER, enqueue_sql, staff, tagged_jobs
from tests.support.factories import hostile_dead_letter as dead_letter

pytestmark = [pytest.mark.usefixtures("clean_awa")]

MODELS = (
    "deadletter",
    "terminaljob",
    "livejob",
    "queuestat",
    "worker",
    "cronschedule",
    "callbackwait",
    "kindlimit",
    "descriptor",
    "workflowrecord",
)
JOB_MODELS = ("deadletter", "terminaljob", "livejob")


def detail_urls(ids: dict[str, int]) -> list[str]:
    """The detail and history page of every tagged job, of a queue and of a worker."""
    with pg() as conn:
        conn.execute(
            "INSERT INTO awa.runtime_instances (instance_id, hostname, pid) VALUES (%s, 'h', 1)",
            [WORKER],
        )
    objects = [
        ("deadletter", ids["dead"]),
        ("terminaljob", ids["completed"]),
        *[("livejob", ids[p]) for p in ("available", "scheduled", "running")],
        ("queuestat", "default"),
        ("worker", str(WORKER)),
    ]
    return [
        reverse(f"admin:awa_django_{model}_{page}", args=[pk])
        for model, pk in objects
        for page in ("change", "history")
    ]


def test_every_page_shows_tagged_jobs() -> None:
    ids = tagged_jobs()
    client = staff()
    urls = [changelist(m) for m in MODELS] + detail_urls(ids)
    urls.append(reverse("admin:awa_django_dashboard"))
    for url in urls:
        response = client.get(url)
        assert response.status_code == 200, url
        assert HOSTILE not in response.content.decode(), url
    for model, pk in (("deadletter", ids["dead"]), ("livejob", ids["available"])):
        body = client.get(reverse(f"admin:awa_django_{model}_change", args=[pk])).content.decode()
        assert "<code>billing</code>" in body and "&lt;script&gt;" in body


def test_tags_load_as_lists_of_text() -> None:
    ids = tagged_jobs()
    assert LiveJob.objects.get(pk=ids["scheduled"]).tags == TAGS
    assert TerminalJob.objects.get(pk=ids["completed"]).tags == TAGS
    assert DeadLetter.objects.get(pk=ids["dead"]).tags == TAGS
    assert set(LiveJob.objects.filter(tags=TAGS).values_list("pk", flat=True)) == {
        ids["available"],
        ids["scheduled"],
        ids["running"],
    }
    assert LiveJob.objects.filter(tags__isnull=True).count() == 0


def test_staff_without_view_permission_get_403_on_every_page() -> None:
    ids = tagged_jobs()
    client = staff(view=False)
    urls = [changelist(m) for m in MODELS] + detail_urls(ids)
    urls += [
        reverse("admin:awa_django_dashboard"),
        reverse("admin:awa_django_livejob_delete", args=[ids["available"]]),
        reverse("admin:awa_django_deadletter_add"),
    ]
    for url in urls:
        assert client.get(url).status_code == 403, url
    detail = reverse("admin:awa_django_livejob_change", args=[ids["available"]])
    assert client.post(detail, {}).status_code == 403


def test_view_only_staff_sees_lists_but_no_actions() -> None:
    [job] = dead_letter()
    testjobs.noop.enqueue()
    client = staff()
    for model in MODELS:
        assert client.get(changelist(model)).status_code == 200, model
    page = client.get(changelist("deadletter")).content.decode()
    assert "retry_jobs" not in page and "purge_jobs" not in page
    assert client.get(reverse("admin:awa_django_deadletter_change", args=[job])).status_code == 200
    # Forged confirmations change nothing.
    forged = {"confirm": "yes", "select_across": "1"}
    for name in ("retry_jobs", "purge_jobs"):
        post_action(client, "deadletter", name, [job], awa_selected=str(job), **forged)
    assert DeadLetter.objects.filter(job_id=job).exists()
    live = testjobs.noop.enqueue().id
    post_action(client, "livejob", "cancel_jobs", [live], awa_selected=str(live), **forged)
    post_action(client, "queuestat", "pause_queues", ["default"], awa_selected="default", **forged)
    with pg() as conn:
        assert job_state(conn, live)["state"] == "available"  # type: ignore[index]
        assert conn.execute("SELECT count(*) FROM awa.queue_meta WHERE paused").fetchone() == (0,)
    assert not LogEntry.objects.exists()


def test_retry_through_the_confirmation_page_writes_a_log_entry_per_job() -> None:
    ids = dead_letter(2)
    client = staff("retry_dlq")
    page = post_action(client, "deadletter", "retry_jobs", ids)
    assert page.status_code == 200 and 'name="confirm"' in page.content.decode()
    assert DeadLetter.objects.count() == 2  # nothing happens before confirmation
    _, done = confirmed(client, "deadletter", "retry_jobs", ids, queue="again", priority="5")
    assert done.status_code == 302
    assert DeadLetter.objects.count() == 0
    with pg() as conn:
        state = job_state(conn, ids[0])
    assert state is not None and (state["state"], state["queue"], state["priority"]) == (
        "available",
        "again",
        5,
    )
    entries = LogEntry.objects.order_by("object_id")
    assert sorted(e.object_id for e in entries) == sorted(str(i) for i in ids)
    assert {e.change_message for e in entries} == {
        "retried into queue again with priority 5 (one of 2 in one admin action)"
    }


def test_purge_and_cancel_with_permissions() -> None:
    [dead] = dead_letter()
    client = staff("purge_dlq", "cancel_job")
    confirmed(client, "deadletter", "purge_jobs", [dead])
    assert not DeadLetter.objects.exists()
    live = testjobs.noop.enqueue().id
    confirmed(client, "livejob", "cancel_jobs", [live])
    with pg() as conn:
        assert job_state(conn, live)["state"] == "cancelled"  # type: ignore[index]
    assert {(e.object_id, e.change_message) for e in LogEntry.objects.all()} == {
        (str(dead), "purged"),
        (str(live), "cancelled"),
    }


def test_hostile_job_data_is_escaped_everywhere() -> None:
    [job] = dead_letter()
    client = staff()
    pages = [
        client.get(changelist("deadletter")),
        client.get(reverse("admin:awa_django_deadletter_change", args=[job])),
        client.get(reverse("admin:awa_django_dashboard")),
    ]
    for response in pages:
        assert response.status_code == 200
        assert HOSTILE not in response.content.decode()
    assert "&lt;script&gt;" in pages[1].content.decode()


SEARCH_TERMS = [
    "²",  # str.isdigit() is True, int() fails
    "١٢٣",  # Arabic-Indic digits
    "12²",
    "9" * 19,  # above bigint
    str(2**63),
    "1" * 5000,  # beyond int()'s default digit limit
    "-1",
    "a\x00b",
    "\x00",
    "\ud800",  # a lone surrogate (cannot arrive through a URL, can through code)
    "x" * 300,  # longer than any kind
    "%",
    "_",
    "'; SELECT 1; --",
    " \t ",
    HOSTILE,
]


@pytest.mark.parametrize("model", JOB_MODELS)
def test_search_never_fails_whatever_the_term(model: str) -> None:
    ids = tagged_jobs()
    client = staff()
    for term in SEARCH_TERMS:
        if term == "\ud800":
            continue  # the test client cannot encode it; see the next test
        response = client.get(changelist(model), {"q": term})
        assert response.status_code == 200, repr(term)
    # Through a URL, bytes that are not UTF-8 arrive as U+FFFD.
    for raw in ("%ED%A0%80", "%FF", "%00", "%C2%B2"):
        assert client.get(f"{changelist(model)}?q={raw}").status_code == 200, raw
    # A search Django's form refuses (NUL) lists nothing, not everything.
    for raw in ("%00", "a%00", "noop%00"):
        assert client.get(f"{changelist(model)}?q={raw}").context["cl"].result_count == 0, raw
    # The terms that name a row still find it.
    place = {"deadletter": "dead", "terminaljob": "completed", "livejob": "available"}[model]
    found = client.get(changelist(model), {"q": str(ids[place])})
    assert [row.pk for row in found.context["cl"].result_list] == [ids[place]]
    if model == "terminaljob":
        # History is searched by a whole kind (an index range), never by part of one.
        whole = client.get(changelist(model), {"q": "tests.jobs.common.noop"})
        assert ids["completed"] in [row.pk for row in whole.context["cl"].result_list]
        assert client.get(changelist(model), {"q": "NOOP"}).context["cl"].result_count == 0
    else:
        assert client.get(changelist(model), {"q": "NOOP"}).context["cl"].result_count >= 1


@pytest.mark.parametrize("term", ["²", "9" * 19, "\ud800", "a\x00b", "x" * 300])
def test_search_of_an_impossible_term_finds_nothing(term: str) -> None:
    tagged_jobs()
    assert list(search_jobs(LiveJob.objects.all(), term)) == []


def test_url_filters_with_impossible_values_never_fail() -> None:
    tagged_jobs()
    client = staff()
    for model in JOB_MODELS:
        for query in (
            "queue=NOT%20A%20QUEUE",
            "queue=" + "a" * 5000,
            "state=exploded",
            "kind=" + "k" * 300,
            "id=99999999999999999999999",
            "id__in=1,%C2%B2",
            "p=999999",
            "o=99",
            "_facets=1",
        ):
            if model == "deadletter" and query.startswith(("state=", "id")):
                continue  # no state filter and no id field in the DLQ: refused below
            response = client.get(f"{changelist(model)}?{query}")
            assert response.status_code in (200, 302), (model, query)
        for query in ("queue=a%00b", "kind=a%00b", "dlq_reason=%00"):
            # A value PostgreSQL cannot hold is refused before it reaches the database.
            assert client.get(f"{changelist(model)}?{query}").status_code == 400, (model, query)
        for query in (
            "attempt=99999999999999999999999",
            "kind__regex=(",
            "kind__icontains=noop",
            "args__contains=%5B1%5D",
            "finalized_at__year=99999",
            "dlq_at__year=99999",
            "queue__startswith=d",
            *(["state=failed", "id=1"] if model == "deadletter" else []),
        ):
            # Only the list's own filters: any other lookup would read a whole history, or fail
            # in the database (an invalid regex, a year Python cannot hold).
            assert client.get(f"{changelist(model)}?{query}").status_code == 400, (model, query)


def test_detail_pages_of_impossible_keys_never_fail() -> None:
    tagged_jobs()
    client = staff()
    for model in (*JOB_MODELS, "queuestat"):
        for key in ("%00", "a%00b", "%ED%A0%80", "99999999999999999999999", "-1", "x" * 300):
            response = client.get(f"{changelist(model)}{key}/change/")
            assert response.status_code in (302, 404), (model, key, response.status_code)


def test_queue_filter_offers_registered_queues_and_filters_by_any_name() -> None:
    ids = tagged_jobs()
    client = staff()
    page = client.get(changelist("livejob")).content.decode()
    for queue in ("default", "run", "done", "dead"):
        assert f'href="?queue={queue}"' in page, queue
    listed = client.get(changelist("livejob"), {"queue": "run"}).context["cl"].result_list
    assert [j.id for j in listed] == [ids["running"]]
    assert (
        client.get(changelist("livejob"), {"queue": "never-seen"}).context["cl"].result_count == 0
    )
    listed = client.get(changelist("terminaljob"), {"state": "completed", "queue": "done"})
    assert [j.id for j in listed.context["cl"].result_list] == [ids["completed"]]
    listed = client.get(
        changelist("livejob"), {"kind": "tests.jobs.common.noop", "state": "scheduled"}
    )
    assert [j.id for j in listed.context["cl"].result_list] == [ids["scheduled"]]


def awa_queries(queries: list[dict[str, Any]]) -> list[str]:
    return [q["sql"] for q in queries if "awa." in q["sql"] or '"awa".' in q["sql"]]


def test_lists_never_scan_history_for_choices_nor_count_whole_tables() -> None:
    tagged_jobs()
    client = staff("retry_dlq", "purge_dlq", "cancel_job", "manage_queue")
    requests: list[tuple[str, dict[str, Any]]] = [(changelist(m), {}) for m in MODELS]
    requests += [
        (changelist("terminaljob"), {"state": "failed", "queue": "done", "q": "noop"}),
        (
            changelist("terminaljob"),
            {"finalized_at__gte": "2000-01-01 00:00:00+00:00", "_facets": "1"},
        ),
        (changelist("livejob"), {"state": "available", "kind": "tests.jobs.common.noop", "q": "1"}),
        (changelist("deadletter"), {"queue": "dead", "_facets": "1"}),
    ]
    captured: list[str] = []
    for url, params in requests:
        with CaptureQueriesContext(connection) as queries:
            assert client.get(url, params).status_code == 200
        captured += awa_queries(queries.captured_queries)
    with CaptureQueriesContext(connection) as queries:  # an action on "all" of a filtered list
        page = post_action(client, "livejob", "cancel_jobs", [1], "?queue=run", select_across="1")
        assert page.status_code == 200
    captured += awa_queries(queries.captured_queries)
    assert any("COUNT(" in sql.upper() for sql in captured)
    for sql in captured:
        # Only the workers' hostname filter lists DISTINCT values: of runtime_instances, one
        # row per running process.
        assert "DISTINCT" not in sql.upper() or "runtime_instances" in sql, sql
        if "COUNT(" in sql.upper():
            assert f"LIMIT {CappedPaginator.CAP + 1}" in sql, sql


def test_every_list_counts_at_most_the_cap_and_never_facets() -> None:
    from django.contrib import admin

    registered = [a for m, a in admin.site._registry.items() if m._meta.app_label == "awa_django"]
    assert len(registered) == len(MODELS)
    for model_admin in registered:
        assert model_admin.paginator is CappedPaginator, model_admin
        assert model_admin.show_full_result_count is False, model_admin
        assert model_admin.show_facets is admin.ShowFacets.NEVER, model_admin


def test_capped_paginator_counts_at_most_cap_plus_one(monkeypatch: pytest.MonkeyPatch) -> None:
    dead_letter(7)
    monkeypatch.setattr(CappedPaginator, "CAP", 5)
    assert CappedPaginator(DeadLetter.objects.all(), 2).count == 6
    monkeypatch.setattr(CappedPaginator, "CAP", 50)
    assert CappedPaginator(DeadLetter.objects.all(), 2).count == 7


def test_times_read_relative_with_the_second_on_hover_and_runs_show_their_spans() -> None:
    job = testjobs.noop.enqueue().id
    with pg() as conn:
        [c] = storage.claim(conn, "default", 1, WORKER)
        storage.finalize(conn, [Finalization(c.job_id, c.run_lease, c.claim_slot, "completed")])
    client = staff()
    listed = client.get(changelist("terminaljob")).content.decode()
    assert re.search(
        r'<time datetime="[0-9T:+-]+" title="\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC">'
        r"(just now|\d+ s ago)</time>",
        listed,
    ), listed
    page = client.get(f"{changelist('terminaljob')}{job}/change/").content.decode()
    assert "Queue wait (last attempt)" in page and "Claimed to finished (last attempt)" in page
    assert re.search(r"\d+\.\d ms", page)
    assert page.count("<time ") >= 3  # created, attempted, finalized: one format


def test_a_jobs_page_shows_each_attempt_and_how_it_ended() -> None:
    job = testjobs.noop.using(queue="tl").enqueue().id
    with pg() as conn:
        [c] = storage.claim(conn, "tl", 1, WORKER)
        error = {"type": "ValueError", "message": "<b>boom</b>", "traceback": "tb"}
        storage.finalize(
            conn, [Finalization(c.job_id, c.run_lease, c.claim_slot, "retry", error=error, delay=0)]
        )
        conn.execute("SELECT awa.promote_v1()")
        [c] = storage.claim(conn, "tl", 1, WORKER)
        storage.finalize(conn, [Finalization(c.job_id, c.run_lease, c.claim_slot, "completed")])
    page = staff().get(f"{changelist('terminaljob')}{job}/change/").content.decode()
    assert re.search(
        r"<b>attempt 1</b>, <time [^>]+>[^<]+</time>: failed with ValueError: &lt;b&gt;boom", page
    ), page
    assert re.search(
        r"<b>attempt 2</b>, claimed <time [^>]+>[^<]+</time>: completed after \d+\.\d ms", page
    ), page
    # A handler's Cancel: one entry, saying so (not "failed", not twice).
    cancelled = testjobs.noop.using(queue="tl").enqueue().id
    with pg() as conn:
        [c] = storage.claim(conn, "tl", 1, WORKER)
        reason = {"type": "awa_django.Cancel", "message": "not needed", "traceback": ""}
        storage.finalize(
            conn, [Finalization(c.job_id, c.run_lease, c.claim_slot, "cancel", error=reason)]
        )
    page = staff().get(f"{changelist('terminaljob')}{cancelled}/change/").content.decode()
    assert page.count("<b>attempt 1</b>") == 1
    assert "cancelled by its handler: awa_django.Cancel: not needed" in page


def _with_perms(client: Client, *codenames: str) -> Any:
    from django.contrib.auth.models import Permission, User

    user = User.objects.get(pk=client.session["_auth_user_id"])
    user.user_permissions.add(*Permission.objects.filter(codename__in=codenames))
    return User.objects.get(pk=user.pk)  # a fresh object: permissions are cached per object


def test_the_find_box_leads_to_a_job_wherever_it_is() -> None:
    [dead] = dead_letter()
    live = testjobs.noop.enqueue().id
    client: Client = staff()
    find = reverse("admin:awa_django_find_job")
    assert (
        client.get(find, {"id": str(live)})["Location"] == f"{changelist('livejob')}{live}/change/"
    )
    assert client.get(find, {"id": f" {dead} "})["Location"] == (
        f"{changelist('deadletter')}{dead}/change/"
    )
    for text in ("987654321", "abc", "9" * 30, "1\x00"):
        missing = client.get(find, {"id": text, "next": changelist("terminaljob")})
        assert missing["Location"] == changelist("terminaljob"), text
        assert "No job" in messages_of(missing)[0]
    offsite = client.get(find, {"id": "x", "next": "//evil.example/"})
    assert offsite["Location"] == changelist("livejob")
    assert 'action="' + find in client.get(changelist("deadletter")).content.decode()
    assert 'action="' + find in client.get(reverse("admin:awa_django_dashboard")).content.decode()
    assert staff(view=False).get(find, {"id": str(live)}).status_code == 403
    # Only the jobs of the pages the user may view.
    only_live = staff(view=False)
    only_live.force_login(_with_perms(only_live, "view_livejob"))
    assert only_live.get(find, {"id": str(live)})["Location"] == (
        f"{changelist('livejob')}{live}/change/"
    )
    hidden = only_live.get(find, {"id": str(dead), "next": changelist("livejob")})
    assert hidden["Location"] == changelist("livejob")
    assert "on a page you may not view (the DLQ)" in messages_of(hidden)[0]


def test_pages_past_the_end_and_past_the_count_say_so(monkeypatch: pytest.MonkeyPatch) -> None:
    from django.contrib import admin

    dead_letter(7)
    monkeypatch.setattr(admin.site._registry[DeadLetter], "list_per_page", 2)
    client = staff()
    url = changelist("deadletter")
    last = client.get(url + "?p=9")
    assert last.status_code == 200 and last.context["cl"].page_num == 4
    assert "There is no page 9: this is the last page, 4." in messages_of(last)
    assert "7 jobs" in last.content.decode()
    monkeypatch.setattr(CappedPaginator, "CAP", 5)
    page = client.get(url + "?p=3")
    text = page.content.decode()
    assert "more than 5 jobs" in text
    assert len(page.context["cl"].result_list) == 2  # pages go on past the count
    assert len(client.get(url + "?p=4").context["cl"].result_list) == 1
    acting = staff("retry_dlq").get(url).content.decode()
    assert "Select all more than 5 jobs</a> (an action takes at most 1,000" not in acting
    assert "Select all more than 5 jobs</a>" in acting
    past = client.get(url + "?p=9")  # past the end of a list longer than the count
    assert past.status_code == 200 and past.context["cl"].page_num == 4
    assert len(past.context["cl"].result_list) == 1
    assert messages_of(past) == ["There is no page 9: this is the last page, 4."]
    monkeypatch.setattr(CappedPaginator, "MAX_PAGE", 3)
    assert (
        "There is no page 9: this is the last page, 3" in messages_of(client.get(url + "?p=9"))[0]
    )


def test_dashboard_charts_each_queues_outcomes_per_minute() -> None:
    dead_letter()
    testjobs.noop.enqueue()
    with pg() as conn:
        [c] = storage.claim(conn, "default", 1, WORKER)
        storage.finalize(conn, [Finalization(c.job_id, c.run_lease, c.claim_slot, "completed")])
        rows = conn.execute("SELECT * FROM awa.outcomes_per_minute_v1('default')").fetchall()
    assert len(rows) == 60 and sum(r[1] for r in rows) == 1 and sum(r[4] for r in rows) == 1
    body = staff().get(reverse("admin:awa_django_dashboard")).content.decode()
    assert "<svg" in body and "default" in body
    assert "completed (blue, 1 in all), failed (red, 1 in all), peak 1" in body


def test_every_overview_counts_each_state_and_shows_a_pause_as_a_status() -> None:
    """One vocabulary on the Queues page, the dashboard, awa_status and the jobs list: a job
    waiting for a callback and a cancelled job are counted; a paused queue says so."""
    from django.core.management import call_command

    from awa_django.operator import cancel, queue_pause
    from tests.support.callbacks import parked

    with pg() as conn:
        parked(conn, queue="ops")
        enqueue_sql(conn, '[{"kind": "k", "queue": "ops"}, {"kind": "k", "queue": "ops"}]')
        ready = conn.execute(
            "SELECT id FROM awa.live_jobs WHERE queue = 'ops' AND state = 'available' ORDER BY id"
        ).fetchall()
    assert cancel(ready[0][0])
    queue_pause("ops")
    client = staff()
    queues = client.get(changelist("queuestat")).content.decode()
    for field, value in [
        ("status", "paused"),
        ("available", "1"),
        ("waiting", "1"),
        ("running", "0"),
        ("cancelled_count", "1"),
        ("in_dlq", "0"),
    ]:
        assert f'<td class="field-{field}">{value}</td>' in queues, field
    dashboard = client.get(reverse("admin:awa_django_dashboard")).content.decode()
    assert "<th>waiting</th>" in dashboard and "<th>cancelled</th>" in dashboard
    assert "<strong>paused</strong>" in dashboard
    jobs = client.get(changelist("livejob")).content.decode()
    assert "available (queue paused" in jobs
    out = io.StringIO()
    call_command("awa_status", stdout=out)
    assert (
        "ops: paused, 1 available, 0 running, 1 waiting, 0 scheduled, 0 retryable, "
        "0 completed, 0 failed, 1 cancelled, 0 in DLQ" in out.getvalue()
    )


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


def test_unknown_and_malformed_detail_ids_redirect_to_the_list() -> None:
    client: Client = staff()
    for pk in ("99999999999999999999999", "abc", "%C2%B2", "1"):
        response = client.get(f"{changelist('livejob')}{pk}/change/")
        assert response.status_code == 302, pk
        assert response["Location"] == changelist("livejob"), pk


def test_a_job_page_that_no_longer_has_the_job_leads_to_the_page_that_does() -> None:
    job = testjobs.noop.enqueue().id
    with pg() as conn:
        [c] = storage.claim(conn, "default", 1, WORKER)
        storage.finalize(conn, [Finalization(c.job_id, c.run_lease, c.claim_slot, "completed")])
    [dead] = dead_letter()
    client: Client = staff()
    moved = client.get(f"{changelist('livejob')}{job}/change/")
    assert moved["Location"] == f"{changelist('terminaljob')}{job}/change/"
    assert client.get(moved["Location"]).status_code == 200
    assert client.get(f"{changelist('livejob')}{dead}/change/")["Location"] == (
        f"{changelist('deadletter')}{dead}/change/"
    )
    assert client.get(f"{changelist('deadletter')}{job}/change/")["Location"] == (
        f"{changelist('terminaljob')}{job}/change/"
    )


def test_the_models_pass_system_checks_without_contrib_postgres() -> None:
    from django.apps import apps
    from django.core import checks

    assert not apps.is_installed("django.contrib.postgres")
    config = apps.get_app_config("awa_django")
    assert [e for e in checks.run_checks(app_configs=[config]) if e.is_serious()] == []
