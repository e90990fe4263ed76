"""Admin actions end to end through the test client: the confirmation page, the 1,000-row limit
under Django's default field limit, queue actions, and the LogEntry that commits with them."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.conf import settings
from django.contrib.admin.models import LogEntry
from django.test import override_settings

from awa_django.admin.selection import BULK_LIMIT, SELECTION_FIELD
from awa_django.models import DeadLetter
from tests.jobs import common as testjobs
from tests.support.admin_client import changelist, confirmed, form_fields, messages_of, post_action
from tests.support.awa_schema import job_state
from tests.support.database import pg
from tests.support.factories import claim_and_finish, enqueue_sql, staff
from tests.support.factories import hostile_dead_letter as dead_letter

pytestmark = [pytest.mark.usefixtures("clean_awa")]


def paused(queue: str) -> bool:
    with pg() as conn:
        row = conn.execute("SELECT paused FROM awa.queue_meta WHERE queue = %s", [queue]).fetchone()
    return bool(row and row[0])


def waiting(queue: str) -> int:
    with pg() as conn:
        row = conn.execute(
            "SELECT count(*) FROM awa.live_jobs WHERE queue = %s"
            " AND state IN ('available', 'scheduled', 'retryable')",
            [queue],
        ).fetchone()
    return int(row[0]) if row else 0


def test_confirming_the_limit_selected_across_a_filter_fits_djangos_field_limit() -> None:
    assert settings.DATA_UPLOAD_MAX_NUMBER_FIELDS == 1000  # Django's default
    bulk = dead_letter(BULK_LIMIT, queue="bulk")
    others = dead_letter(150, queue="other")
    client = staff("retry_dlq")
    query = "?queue=bulk"
    # The list shows 50 of them; "select all" across the filtered list.
    page = post_action(client, "deadletter", "retry_jobs", bulk[:50], query, select_across="1")
    assert page.status_code == 200
    fields = form_fields(page)
    assert len(fields) < 10  # one field carries the 1,000 ids
    assert sorted(int(i) for i in fields[SELECTION_FIELD].split(",")) == sorted(bulk)
    # A field per job, as the page used to post, is more than Django accepts.
    one_field_each = {**fields, "_selected_action": [str(i) for i in bulk], "select_across": "0"}
    assert client.post(changelist("deadletter") + query, one_field_each).status_code == 400
    assert f"{BULK_LIMIT} jobs selected" in page.content.decode()
    done = client.post(changelist("deadletter") + query, {**fields, "priority": "7"})
    assert done.status_code == 302, done
    assert messages_of(done) == [f"Retried {BULK_LIMIT} job(s)."]
    assert sorted(DeadLetter.objects.values_list("job_id", flat=True)) == sorted(others)
    assert LogEntry.objects.count() == BULK_LIMIT
    with pg() as conn:
        assert job_state(conn, bulk[-1])["priority"] == 7  # type: ignore[index]


def test_selecting_more_than_the_limit_is_refused_and_changes_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from awa_django.admin import actions
    from tests.support.callbacks import parked

    ids = dead_letter(BULK_LIMIT + 1)
    # An action that takes at most BULK_LIMIT rows (those of the DLQ, the live jobs and history
    # take them all): extend callback waits, past a limit of 2.
    monkeypatch.setattr(actions, "BULK_LIMIT", 2)
    client = staff("resolve_callback", "purge_dlq")
    with pg() as conn:
        waits = [parked(conn)[0].job_id for _ in range(3)]
    refused = post_action(client, "callbackwait", "extend_jobs", waits[:1], select_across="1")
    assert refused.status_code == 302
    assert messages_of(refused) == [
        "Select at most 2 waiting jobs at a time (narrow the list with its filters); nothing "
        "was changed."
    ]
    monkeypatch.undo()
    # A forged confirmation naming too many ids is refused as well.
    forged = {
        "action": "purge_jobs",
        "select_across": "1",
        "_selected_action": str(ids[0]),
        SELECTION_FIELD: ",".join(map(str, ids)),
        "confirm": "yes",
    }
    client.post(changelist("deadletter"), forged)
    assert DeadLetter.objects.count() == BULK_LIMIT + 1
    assert not LogEntry.objects.exists()


def test_select_all_cancels_every_live_job_a_filter_matches() -> None:
    with pg() as conn:
        jobs = json.dumps([{"kind": "k", "queue": "stuck"}] * (BULK_LIMIT + 3))
        live = [i for i, _ in enqueue_sql(conn, jobs)]
        enqueue_sql(conn, '[{"kind": "k", "queue": "other"}]')
    client = staff("cancel_job")
    query = "?queue=stuck"
    page = post_action(client, "livejob", "cancel_jobs", live[:50], query, select_across="1")
    assert f"<strong>{BULK_LIMIT + 3:,} jobs</strong> match" in page.content.decode()
    response = client.post(changelist("livejob") + query, form_fields(page))
    while response.status_code == 200:
        response = client.post(changelist("livejob") + query, form_fields(response))
    assert messages_of(response)[-1] == f"Cancel jobs: cancelled {BULK_LIMIT + 3:,} jobs."
    assert waiting("stuck") == 0 and waiting("other") == 1


def test_select_all_retries_more_than_the_limit_of_one_action() -> None:
    over = dead_letter(BULK_LIMIT + 7, queue="after-a-fix")
    client = staff("retry_dlq")
    query = "?queue=after-a-fix"
    page = post_action(client, "deadletter", "retry_jobs", over[:50], query, select_across="1")
    assert f"<strong>{BULK_LIMIT + 7:,} jobs</strong> match" in page.content.decode()
    response = client.post(changelist("deadletter") + query, form_fields(page))
    while response.status_code == 200:  # a progress page, if a batch took longer than 8 s
        response = client.post(changelist("deadletter") + query, form_fields(response))
    assert (
        messages_of(response)[-1] == f"Retry dead-lettered jobs: retried {BULK_LIMIT + 7:,} jobs."
    )
    assert not DeadLetter.objects.filter(queue="after-a-fix").exists()
    assert LogEntry.objects.count() == BULK_LIMIT + 7


def test_retry_and_purge_of_everything_a_filter_matches_run_in_batches_with_progress(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from awa_django.admin import bulk

    many = dead_letter(7, queue="many")
    [other] = dead_letter(1, queue="other")
    monkeypatch.setattr(bulk, "BULK_LIMIT", 3)  # past 3 rows, "select all" runs in batches
    monkeypatch.setattr(bulk, "BATCH", 2)
    monkeypatch.setattr(bulk, "BUDGET", 0.0)  # a progress page after every batch
    viewer = staff()
    forged = post_action(
        viewer,
        "deadletter",
        "retry_jobs",
        many[:1],
        "?queue=many",
        select_across="1",
        confirm="yes",
        awa_after="0",
    )
    assert forged.status_code in (200, 302, 403) and DeadLetter.objects.count() == 8
    client = staff("retry_dlq", "purge_dlq")
    url = changelist("deadletter") + "?queue=many"
    page = post_action(
        client, "deadletter", "retry_jobs", many[:1], "?queue=many", select_across="1"
    )
    assert page.status_code == 200 and "<strong>7 jobs</strong> match" in page.content.decode()
    assert DeadLetter.objects.count() == 8  # nothing before confirming
    response = client.post(url, {**form_fields(page), "queue": "fixed"})
    pages = 0
    while response.status_code == 200:  # each progress page posts the next batch
        pages += 1
        assert "so far" in response.content.decode()
        response = client.post(url, form_fields(response))
    assert pages == 4, messages_of(response)  # after each batch: 2, 2, 2 and 1; then the end
    assert messages_of(response) == ["Retry dead-lettered jobs: retried 7 jobs."]
    assert list(DeadLetter.objects.values_list("job_id", flat=True)) == [other]
    assert LogEntry.objects.count() == 7
    with pg() as conn:
        assert {job_state(conn, j)["queue"] for j in many} == {"fixed"}  # type: ignore[index]
    # A forged run (a count or a key that is not one) changes nothing more.
    forged_run = dead_letter(4, queue="forged")
    url = changelist("deadletter") + "?queue=forged"
    page = post_action(
        client, "deadletter", "purge_jobs", forged_run[:1], "?queue=forged", select_across="1"
    )
    for field, value in [
        ("awa_done", "-5"),
        ("awa_left", "x"),
        ("awa_after", "1;2"),
        ("awa_done", "9" * 30),
        ("awa_after", "\x00"),
    ]:
        forged = client.post(url, {**form_fields(page), "awa_after": "0", field: value})
        assert messages_of(forged)[-1] == "The run was not understood; nothing more was changed."
    assert DeadLetter.objects.filter(queue="forged").count() == 4
    # Purge of everything matching: no form, same batches.
    more = dead_letter(5, queue="again")
    page = post_action(
        client, "deadletter", "purge_jobs", more[:1], "?queue=again", select_across="1"
    )
    response = client.post(changelist("deadletter") + "?queue=again", form_fields(page))
    while response.status_code == 200:
        response = client.post(changelist("deadletter") + "?queue=again", form_fields(response))
    assert messages_of(response) == ["Purge dead-lettered jobs: purged 5 jobs."]
    assert sorted(DeadLetter.objects.values_list("job_id", flat=True)) == sorted(
        [other, *forged_run]
    )


def test_select_all_retries_every_failed_or_cancelled_job_of_filtered_history(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """History too, past the limit of one action: every failed or cancelled job the filter
    matches is retried once, in batches; completed ones are passed over and counted."""
    from awa_django.admin import bulk
    from awa_django.operator import cancel

    monkeypatch.setattr(bulk, "BULK_LIMIT", 3)
    monkeypatch.setattr(bulk, "BATCH", 2)
    monkeypatch.setattr(bulk, "COUNT_CAP", 6)
    with pg() as conn:
        ids = [i for i, _ in enqueue_sql(conn, json.dumps([{"kind": "k", "queue": "hist"}] * 9))]
        done = claim_and_finish(conn, "hist", 2, "completed")
    cancelled = [i for i in ids if i not in done]
    assert all(cancel(i) for i in cancelled)
    client = staff("retry_job")
    query = "?queue=hist"
    page = post_action(client, "terminaljob", "retry_jobs", ids[:1], query, select_across="1")
    assert "<strong>more than 6 jobs</strong> match" in page.content.decode()
    response = client.post(changelist("terminaljob") + query, form_fields(page))
    while response.status_code == 200:
        response = client.post(changelist("terminaljob") + query, form_fields(response))
    assert messages_of(response)[-1] == (
        "Retry jobs from history: retried 7 jobs; 2 left in place (completed, already "
        "retried, or unique jobs whose key another job holds)."
    )
    with pg() as conn:
        [[retries, live]] = conn.execute(
            "SELECT (SELECT count(*) FROM awa.history_retries),"
            " (SELECT count(*) FROM awa.live_jobs WHERE queue = 'hist')"
        ).fetchall()
    assert (retries, live) == (7, 7)
    assert LogEntry.objects.count() == 7
    # Again: each job is retried from history at most once.
    page = post_action(client, "terminaljob", "retry_jobs", ids[:1], query, select_across="1")
    response = client.post(changelist("terminaljob") + query, form_fields(page))
    while response.status_code == 200:
        response = client.post(changelist("terminaljob") + query, form_fields(response))
    assert messages_of(response)[-1].startswith("Retry jobs from history: retried 0 jobs; 9 left")


def test_select_all_under_a_search_django_refuses_acts_on_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A NUL in the search: Django's form refuses it and would list every row; select-all
    must then act on none, not on the whole DLQ."""
    from awa_django.admin import bulk

    monkeypatch.setattr(bulk, "BULK_LIMIT", 2)  # past 2 rows, select-all runs on all matching
    ids = dead_letter(3)
    client = staff("purge_dlq")
    for query in ("?q=%00", "?q=tests.jobs.common.noop%00"):
        response = client.post(
            changelist("deadletter") + query,
            {
                "action": "purge_jobs",
                "_selected_action": [str(ids[0])],
                "select_across": "1",
                "index": "0",
                "confirm": "yes",
            },
        )
        assert response.status_code in (200, 302)
    assert DeadLetter.objects.count() == 3 and not LogEntry.objects.exists()


def test_select_all_acts_only_on_the_rows_that_matched_at_its_confirmation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Jobs that join the filtered list after the confirmation page (new ones, and an older
    job dead-lettered meanwhile) are left for another run; so are jobs enqueued after a live
    cancel was confirmed."""
    from awa_django.admin import bulk
    from tests.support.factories import dead_letter as dead_letter_of

    monkeypatch.setattr(bulk, "BULK_LIMIT", 2)
    kind = "tests.late"
    with pg() as conn:  # an older job (a lower id), of the kind, in another queue
        [(older, _)] = enqueue_sql(conn, json.dumps([{"kind": kind, "queue": "elsewhere"}]))
    ids = dead_letter_of(3, queue="late", kind=kind)
    client = staff("retry_dlq", "cancel_job")
    url = changelist("deadletter") + f"?kind={kind}"
    page = post_action(
        client, "deadletter", "retry_jobs", ids[:1], f"?kind={kind}", select_across="1"
    )
    assert "<strong>3 jobs</strong> match" in page.content.decode()
    newer = dead_letter_of(2, queue="late", kind=kind)
    with pg() as conn:
        error = {"type": "E", "message": "", "traceback": ""}
        assert claim_and_finish(conn, "elsewhere", 1, "fail", error=error) == [older]
    response = client.post(url, form_fields(page))
    while response.status_code == 200:
        response = client.post(url, form_fields(response))
    assert messages_of(response)[-1] == "Retry dead-lettered jobs: retried 3 jobs."
    assert sorted(DeadLetter.objects.values_list("job_id", flat=True)) == sorted([older, *newer])
    # Live jobs: those enqueued after the confirmation stay, and so does a job retried from
    # the DLQ into the queue meanwhile (it keeps its lower id).
    [back] = dead_letter_of(1, queue="c0")
    with pg() as conn:
        first = [i for i, _ in enqueue_sql(conn, json.dumps([{"kind": "k", "queue": "c"}] * 3))]
    page = post_action(client, "livejob", "cancel_jobs", first[:1], "?queue=c", select_across="1")
    # The confirmation is of this list: posted to another (no filter), it changes nothing.
    elsewhere = client.post(changelist("livejob"), form_fields(page))
    assert messages_of(elsewhere)[-1] == "The run was not understood; nothing more was changed."
    with pg() as conn:
        later = [i for i, _ in enqueue_sql(conn, json.dumps([{"kind": "k", "queue": "c"}] * 2))]
    from awa_django.operator import dlq_retry

    assert dlq_retry([back], queue="c") == [back]
    later = sorted([back, *later])
    response = client.post(changelist("livejob") + "?queue=c", form_fields(page))
    while response.status_code == 200:
        response = client.post(changelist("livejob") + "?queue=c", form_fields(response))
    assert messages_of(response)[-1] == "Cancel jobs: cancelled 3 jobs."
    with pg() as conn:
        left = conn.execute("SELECT id FROM awa.live_jobs WHERE queue = 'c' ORDER BY id")
        assert [r[0] for r in left] == later
    # A confirmation without its bounds (forged, or from an older page) changes nothing.
    with pg() as conn:
        enqueue_sql(conn, json.dumps([{"kind": "k", "queue": "c"}] * 3))
    bare = {k: v for k, v in form_fields(page).items() if k not in ("awa_upto", "awa_before")}
    response = client.post(changelist("livejob") + "?queue=c", bare)
    assert messages_of(response)[-1] == "The run was not understood; nothing more was changed."
    with pg() as conn:
        [[left_now]] = conn.execute("SELECT count(*) FROM awa.live_jobs WHERE queue = 'c'")
        assert left_now == len(later) + 3


def test_the_confirmation_acts_only_on_the_rows_it_named() -> None:
    shown = dead_letter(3, queue="q")
    client = staff("purge_dlq")
    page = post_action(client, "deadletter", "purge_jobs", shown[:1], "?queue=q", select_across="1")
    late = dead_letter(1, queue="q")  # matches the filter, arrived after the page was shown
    done = client.post(changelist("deadletter") + "?queue=q", form_fields(page))
    assert messages_of(done) == ["Purged 3 job(s)."]
    assert list(DeadLetter.objects.values_list("job_id", flat=True)) == late


@pytest.mark.parametrize(
    "selection", ["", "abc", "1,²", "-1", "1,,2", str(2**63), ",".join(["1"] * (BULK_LIMIT + 1))]
)
def test_a_garbled_selection_changes_nothing(selection: str) -> None:
    [job] = dead_letter()
    client = staff("purge_dlq")
    forged = {
        "action": "purge_jobs",
        "select_across": "1",
        "_selected_action": str(job),
        SELECTION_FIELD: selection,
        "confirm": "yes",
    }
    response = client.post(changelist("deadletter"), forged)
    assert response.status_code == 302
    assert messages_of(response) == ["The selection was not understood; nothing was changed."]
    assert DeadLetter.objects.filter(job_id=job).exists()


@pytest.mark.parametrize("ticked", ["abc", "²", str(2**64), "1\x00"])
def test_a_garbled_ticked_row_is_refused_not_an_error(ticked: str) -> None:
    dead_letter()
    response = post_action(staff("purge_dlq"), "deadletter", "purge_jobs", [ticked])
    assert response.status_code == 302
    assert messages_of(response) == ["The selection was not understood; nothing was changed."]


def test_rows_gone_before_the_confirmation_change_nothing() -> None:
    ids = dead_letter(2)
    client = staff("purge_dlq")
    page = post_action(client, "deadletter", "purge_jobs", ids)
    other = staff("purge_dlq")
    confirmed(other, "deadletter", "purge_jobs", ids)
    done = client.post(changelist("deadletter"), form_fields(page))
    assert messages_of(done) == ["None of the selected jobs is left; nothing was changed."]
    assert LogEntry.objects.count() == 2  # the other operator's purge only


def test_pause_resume_and_drain_are_confirmed_then_logged() -> None:
    testjobs.noop.enqueue()
    testjobs.noop.using(run_after=timedelta(hours=1)).enqueue()
    client = staff("manage_queue")
    page = post_action(client, "queuestat", "pause_queues", ["default"])
    assert page.status_code == 200 and 'name="confirm"' in page.content.decode()
    assert not paused("default")  # nothing happens before confirmation
    client.post(changelist("queuestat"), form_fields(page))
    assert paused("default")
    confirmed(client, "queuestat", "resume_queues", ["default"])
    assert not paused("default")
    page = post_action(client, "queuestat", "drain_queues", ["default"])
    assert "default: 2 waiting job(s)" in page.content.decode()
    assert waiting("default") == 2
    done = client.post(changelist("queuestat"), form_fields(page))
    assert messages_of(done) == ["Drain queues: default drained: cancelled 2 waiting job(s)"]
    assert waiting("default") == 0
    assert list(LogEntry.objects.order_by("pk").values_list("object_id", "change_message")) == [
        ("default", "paused"),
        ("default", "resumed"),
        ("default", "drained: cancelled 2 job(s)"),
    ]


def test_drain_cancels_every_waiting_job_beyond_ten_thousand_in_logged_batches() -> None:
    n = 10_050
    with pg() as conn:
        job = {"kind": "tests.jobs.common.noop", "queue": "big", "args": {"args": [], "kwargs": {}}}
        enqueue_sql(conn, json.dumps([job] * n))
    _, done = confirmed(staff("manage_queue"), "queuestat", "drain_queues", ["big"])
    assert messages_of(done) == [f"Drain queues: big drained: cancelled {n} waiting job(s)"]
    assert waiting("big") == 0
    # Batches of 1,000, each committed with its own log entry: a drain never holds the
    # queue's lanes for the whole run.
    logged = [int(m.split()[2]) for m in LogEntry.objects.values_list("change_message", flat=True)]
    assert sorted(logged) == [50] + [1000] * 10 and sum(logged) == n


@pytest.mark.parametrize("name", ["pause_queues", "drain_queues"])
def test_a_queue_action_whose_log_entry_fails_changes_nothing(name: str) -> None:
    testjobs.noop.enqueue()
    client = staff("manage_queue")
    client.raise_request_exception = False
    page = post_action(client, "queuestat", name, ["default"])
    with pg() as conn:
        conn.execute(
            "CREATE FUNCTION public.awa_test_refuse() RETURNS trigger LANGUAGE plpgsql AS"
            " $$ BEGIN RAISE EXCEPTION 'log refused'; END $$"
        )
        conn.execute(
            "CREATE TRIGGER awa_test_refuse BEFORE INSERT ON django_admin_log"
            " FOR EACH ROW EXECUTE FUNCTION public.awa_test_refuse()"
        )
    try:
        response = client.post(changelist("queuestat"), form_fields(page))
    finally:
        with pg() as conn:
            conn.execute("DROP TRIGGER awa_test_refuse ON django_admin_log")
            conn.execute("DROP FUNCTION public.awa_test_refuse()")
    assert response.status_code == 500
    assert not paused("default") and waiting("default") == 1
    assert not LogEntry.objects.exists()


@pytest.mark.django_db(transaction=True, databases=["default", "repeatable"])
def test_cancel_and_drain_work_when_the_queue_database_defaults_to_repeatable_read() -> None:
    with override_settings(AWA={**settings.AWA, "DATABASE_ALIAS": "repeatable"}):
        live = testjobs.noop.enqueue().id
        testjobs.noop.enqueue()
        client = staff("cancel_job", "manage_queue")
        _, done = confirmed(client, "livejob", "cancel_jobs", [live])
        assert messages_of(done) == ["Cancelled 1 job(s)."]
        _, done = confirmed(client, "queuestat", "drain_queues", ["default"])
        assert messages_of(done) == ["Drain queues: default drained: cancelled 1 waiting job(s)"]
    assert waiting("default") == 0
