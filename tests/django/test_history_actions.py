"""Operator actions on history and queues (docs/operations.md): retry failed and cancelled jobs from
terminal history (API, ``awa_job retry``, admin), a queue's DLQ on or off
(``AWA["QUEUES"][name]["dlq"]``, admin), ``awa_job list`` with filters, and tags in the admin
lists."""

from __future__ import annotations

import asyncio
import io
import json
import logging
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from django.contrib.admin.models import LogEntry
from django.core.exceptions import ImproperlyConfigured
from django.core.management import CommandError, call_command
from django.test import override_settings

from awa_django.conf import load_settings
from awa_django.exceptions import InvalidOptionError, JobValidationError
from awa_django.maintenance.queues import sync_queue_settings
from awa_django.operator import (
    cancel,
    history_retry,
    job_list,
    queue_dlq,
    queue_dlq_enabled,
)
from awa_django.states import JobState
from tests.jobs import common as testjobs
from tests.jobs import observability as obsjobs
from tests.jobs import worker_env
from tests.support.admin_client import changelist, confirmed, messages_of, post_action
from tests.support.awa_schema import job_state
from tests.support.database import conninfo, pg
from tests.support.factories import claim_and_finish, staff
from tests.support.polling import wait_for
from tests.support.processes import ManagedProcess

pytestmark = [pytest.mark.usefixtures("clean_awa")]

Start = Callable[..., ManagedProcess]

ARGS = {"nested": [1, 2.5, "three", {"four": None}], "unicode": "é✓"}


def failed_job(queue: str = "hist", **options: Any) -> int:
    """A job of ``queue`` that failed for good and stayed in history (its DLQ off)."""
    queue_dlq(queue, False)
    job = testjobs.send_email.using(queue=queue, **options).enqueue("a@example.com", subject="hi")
    with pg() as conn:
        error = {"type": "Boom", "message": "no", "traceback": "x"}
        assert claim_and_finish(conn, queue, 1, "fail", error=error) == [job.id]
    return job.id


def state(job_id: int) -> dict[str, Any]:
    with pg() as conn:
        found = job_state(conn, job_id)
    assert found is not None
    return found


def run(*args: str) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


# Retry from history ----------------------------------------------------------------------------


def test_history_retry_keeps_the_arguments_and_records_who_did_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    failed = failed_job(metadata={"tenant": "acme"}, tags=["vip"], priority=3)
    cancelled = testjobs.renamed.enqueue(ARGS).id
    assert cancel(cancelled) == JobState.AVAILABLE
    done = testjobs.noop.enqueue().id
    with pg() as conn:
        claim_and_finish(conn, "default", 1, "completed")
    with caplog.at_level(logging.INFO, "awa_django.operator"):
        rows = history_retry([cancelled, done, failed, 987654321, failed], by="alice")
    by_id = {r.job_id: r for r in rows}
    assert [r.job_id for r in rows] == sorted({cancelled, done, failed, 987654321})
    assert by_id[done].outcome == "not_retryable" and by_id[done].retry_job_id is None
    assert by_id[987654321].outcome == "not_found" and by_id[987654321].kind is None
    for original in (failed, cancelled):
        row = by_id[original]
        assert row.outcome == "retried" and row.retry_job_id not in (None, original)
        before, after = state(original), state(row.retry_job_id)  # type: ignore[arg-type]
        assert before["state"] in ("failed", "cancelled")  # the original stays as it was
        assert (after["state"], after["attempt"], after["run_lease"]) == ("available", 0, 0)
        for field in ("kind", "queue", "priority", "args", "max_attempts", "tags"):
            assert after[field] == before[field], field
        assert after["metadata"]["awa:retried_from"] == original
        assert after["metadata"]["awa:retried_by"] == "alice"
        assert after["metadata"]["awa:retried_at"]
    assert state(by_id[cancelled].retry_job_id)["args"] == {"args": [ARGS], "kwargs": {}}  # type: ignore[arg-type]
    assert state(by_id[failed].retry_job_id)["metadata"]["tenant"] == "acme"  # type: ignore[arg-type]
    # Logged with the job fields and who asked.
    logged = {r.job_id: r for r in caplog.records if r.getMessage().startswith("awa: job ")}  # type: ignore[attr-defined]
    assert set(logged) == {failed, cancelled}
    assert logged[failed].retried_by == "alice"  # type: ignore[attr-defined]
    assert logged[failed].retry_job_id == by_id[failed].retry_job_id  # type: ignore[attr-defined]
    assert (logged[failed].kind, logged[failed].queue) == (testjobs.send_email.kind, "hist")  # type: ignore[attr-defined]
    # At most once: the second call names the first retry.
    again = history_retry([failed, cancelled], by="bob")
    assert [(r.outcome, r.retry_job_id) for r in again] == [
        ("already_retried", by_id[r.job_id].retry_job_id) for r in again
    ]
    # The retried job runs like any other (a worker would claim it).
    assert state(by_id[failed].retry_job_id)["in_dlq"] is False  # type: ignore[arg-type]


def test_history_retry_into_another_queue_and_priority_and_bad_input() -> None:
    failed = failed_job()
    [row] = history_retry([failed], queue="elsewhere", priority=-5)
    new = state(row.retry_job_id)  # type: ignore[arg-type]
    assert (row.queue, new["queue"], new["priority"]) == ("elsewhere", "elsewhere", -5)
    assert new["metadata"]["awa:retried_by"] is None
    with pytest.raises(JobValidationError):
        history_retry([failed], queue="Bad Queue")
    with pytest.raises(JobValidationError):
        history_retry([failed], priority=101)
    with pytest.raises(JobValidationError):
        history_retry(["1"])  # type: ignore[list-item]
    with pytest.raises(JobValidationError):
        history_retry([failed], by="x" * 256)


def test_a_unique_job_retried_from_history_takes_its_key_or_is_refused() -> None:
    queue_dlq("uniq", False)
    first = testjobs.unique_noop.enqueue(1)
    with pg() as conn:
        claim_and_finish(conn, "uniq", 1, "fail", error={"type": "E", "message": "m"})
    holder = testjobs.unique_noop.enqueue(1)  # the failure released the key
    assert not holder.duplicate and holder.id != first.id
    [refused] = history_retry([first.id])
    assert (refused.outcome, refused.retry_job_id) == ("refused", holder.id)
    assert cancel(holder.id) is not None
    [retried] = history_retry([first.id])  # refused before: not recorded, so it may go now
    assert retried.outcome == "retried"
    assert testjobs.unique_noop.enqueue(1).duplicate  # the retry holds the key


def test_awa_job_retry_from_history_and_list_with_filters() -> None:
    failed = failed_job(tags=["vip"])
    other = testjobs.noop.using(tags=["batch"]).enqueue().id
    out = run("awa_job", "retry", str(failed), "--by", "carol")
    assert out.startswith(f"job {failed} retried as job ")
    new = int(out.split()[-1])
    assert state(new)["metadata"]["awa:retried_by"] == "carol"
    with pytest.raises(CommandError, match=f"already retried from history, as job {new}"):
        run("awa_job", "retry", str(failed))
    default_by = failed_job(queue="hist2")
    run("awa_job", "retry", str(default_by))
    [again] = [j for j in job_list(queue="hist2") if j.id != default_by]
    assert state(again.id)["metadata"]["awa:retried_by"].endswith(" (awa_job)")
    # list
    assert [j.id for j in job_list(tag="vip")] == [new, failed]
    assert [j.id for j in job_list(tag="batch")] == [other]
    assert [j.id for j in job_list(state="failed")] == [default_by, failed]
    assert [j.id for j in job_list(state="available", queue="hist")] == [new]
    assert job_list(kind="no.such.kind") == []
    assert len(job_list(limit=2)) == 2
    lines = run("awa_job", "list", "--tag", "vip").splitlines()
    assert [int(line.split()[0]) for line in lines] == [new, failed]
    assert " failed attempt 1/3 " in lines[1] and "tags vip" in lines[1]
    data = json.loads(run("awa_job", "list", "--queue", "hist", "--state", "failed", "--json"))
    assert [(d["id"], d["state"], d["tags"]) for d in data] == [(failed, "failed", ["vip"])]
    with pytest.raises(InvalidOptionError):
        job_list(state="lost")
    with pytest.raises(InvalidOptionError):
        job_list(limit=0)


# DLQ on or off per queue -----------------------------------------------------------------------


def test_dlq_setting_is_validated() -> None:
    assert load_settings({"QUEUES": {"q": {"dlq": False}}}).QUEUES["q"].dlq is False
    assert load_settings({"QUEUES": {"q": {}}}).QUEUES["q"].dlq is None
    with pytest.raises(
        ImproperlyConfigured, match=r"AWA\['QUEUES'\]\['q'\]\['dlq'\] must be a bool"
    ):
        load_settings({"QUEUES": {"q": {"dlq": "no"}}})


def test_queue_dlq_turns_dead_lettering_on_and_off() -> None:
    assert queue_dlq_enabled("toggle") is True
    assert queue_dlq("toggle", False) is True
    assert queue_dlq("toggle", False) is False  # unchanged
    assert queue_dlq_enabled("toggle") is False
    job = testjobs.noop.using(queue="toggle").enqueue().id
    with pg() as conn:
        claim_and_finish(conn, "toggle", 1, "fail", error={"type": "E", "message": "m"})
    assert (state(job)["state"], state(job)["in_dlq"]) == ("failed", False)
    assert queue_dlq("toggle", True) is True
    job = testjobs.noop.using(queue="toggle").enqueue().id
    with pg() as conn:
        claim_and_finish(conn, "toggle", 1, "fail", error={"type": "E", "message": "m"})
    assert (state(job)["state"], state(job)["in_dlq"]) == ("failed", True)
    with pytest.raises(JobValidationError):
        queue_dlq("Bad Queue", False)
    with pytest.raises(InvalidOptionError):
        queue_dlq("toggle", "no")  # type: ignore[arg-type]


def test_settings_sync_writes_each_declared_dlq(caplog: pytest.LogCaptureFixture) -> None:
    async def sync() -> None:
        async with await psycopg.AsyncConnection.connect(conninfo(), autocommit=True) as conn:
            await sync_queue_settings(conn)

    queues = {"off": {"dlq": False}, "on": {"dlq": True}, "free": {"concurrency": 2}}
    queue_dlq("on", False)
    queue_dlq("free", False)
    with override_settings(AWA={"QUEUES": queues}), caplog.at_level(logging.INFO):
        asyncio.run(sync())
        asyncio.run(sync())  # nothing changes, nothing is logged again
    assert (queue_dlq_enabled("off"), queue_dlq_enabled("on"), queue_dlq_enabled("free")) == (
        False,
        True,
        False,  # no setting: the database's value stays
    )
    assert [r.getMessage() for r in caplog.records if "dead letter queue" in r.getMessage()] == [
        "awa: queue off: dead letter queue turned off (AWA['QUEUES'])",
        "awa: queue on: dead letter queue turned on (AWA['QUEUES'])",
    ]


@pytest.mark.worker
def test_a_worker_applies_the_queue_dlq_setting_when_it_starts(manage_py: Start) -> None:
    job = obsjobs.fails.enqueue(1)
    env = worker_env(obsjobs, QUEUES={"obs": {"dlq": False}})
    proc = manage_py("awa_worker", "--queue", "obs", extra_env=env)
    wait_for(
        lambda: state(job.id)["state"] == "failed",
        timeout=30,
        message=lambda: f"the job to fail; {state(job.id)}\n{proc.output()}",
    )
    assert state(job.id)["in_dlq"] is False
    assert "queue obs: dead letter queue turned off" in proc.output()


# Admin -------------------------------------------------------------------------------------------


def test_admin_retries_from_history_with_permission_and_logs_who() -> None:
    failed = failed_job()
    done = testjobs.noop.enqueue().id
    with pg() as conn:
        claim_and_finish(conn, "default", 1, "completed")
    # Without the permission the action is not offered, and a forged post is refused.
    viewer = staff()
    assert "retry_jobs" not in viewer.get(changelist("terminaljob")).content.decode()
    forged = post_action(viewer, "terminaljob", "retry_jobs", [failed])
    assert forged.status_code in (200, 302, 403)
    assert [j.id for j in job_list(queue="hist")] == [failed]  # nothing retried
    other = failed_job(queue="hist3")
    client = staff("retry_job")
    page, response = confirmed(client, "terminaljob", "retry_jobs", [other, done], priority="9")
    assert "Retry jobs from history" in page.content.decode()
    [message] = messages_of(response)
    assert message.startswith("Retried 1 job(s) as new jobs (") and "1 not retried" in message
    new = int(message.split("→ ")[1].split(")")[0])
    assert state(new)["priority"] == 9
    assert state(new)["metadata"]["awa:retried_by"].endswith(" (admin)")
    [entry] = LogEntry.objects.all()
    assert entry.object_id == str(other) and f"as job {new}" in entry.change_message


def test_admin_shows_and_filters_tags() -> None:
    tagged = testjobs.send_email.enqueue("x@example.com").id  # default tags: ["mail"]
    plain = testjobs.noop.enqueue().id
    client = staff()
    page = client.get(changelist("livejob") + "?tag=mail")
    assert page.status_code == 200
    body = page.content.decode()
    assert f">{tagged}<" in body and f">{plain}<" not in body and "<code>mail</code>" in body
    assert "?tag=mail" in client.get(changelist("livejob")).content.decode()  # a choice
    assert f">{tagged}<" not in client.get(changelist("livejob") + "?tag=other").content.decode()
    assert client.get(changelist("livejob") + "?tag=a%00b").status_code == 400
    for model in ("terminaljob", "deadletter"):
        assert client.get(changelist(model) + "?tag=mail").status_code == 200


def test_admin_turns_a_queues_dlq_off_but_leaves_a_pinned_one_alone() -> None:
    testjobs.noop.using(queue="free").enqueue()
    testjobs.noop.using(queue="pinned").enqueue()
    client = staff("manage_queue")
    assert ">DLQ<" in client.get(changelist("queuestat")).content.decode()
    with override_settings(AWA={"QUEUES": {"pinned": {"dlq": True}}}):
        _, response = confirmed(client, "queuestat", "dlq_off_queues", ["free", "pinned"])
    [message] = messages_of(response)
    assert message == (
        "Dead letter queue turned off for 1 queue(s): free; left alone (set in "
        "AWA['QUEUES'], change the setting): pinned."
    )
    assert (queue_dlq_enabled("free"), queue_dlq_enabled("pinned")) == (False, True)
    [entry] = LogEntry.objects.all()
    assert (entry.object_id, entry.change_message) == ("free", "dead letter queue turned off")
    _, response = confirmed(client, "queuestat", "dlq_on_queues", ["free"])
    assert queue_dlq_enabled("free") is True
    assert staff().get(changelist("queuestat")).status_code == 200
