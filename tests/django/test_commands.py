"""Operator commands: awa_status, awa_queue, awa_dlq, awa_job (happy paths, bad arguments of
every awa_* command, batches, output)."""

from __future__ import annotations

import json
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from awa_django.db import storage
from tests.jobs import common as testjobs
from tests.support import factories
from tests.support.awa_schema import job_state
from tests.support.callbacks import parked
from tests.support.database import pg
from tests.support.factories import WORKER

pytestmark = [pytest.mark.usefixtures("clean_awa")]


def run(*args: Any) -> str:
    out = StringIO()
    call_command(*args, stdout=out, stderr=StringIO())
    return out.getvalue()


def dead_letter(queue: str = "default", n: int = 1) -> list[int]:
    return factories.dead_letter(n, queue, text="<script>boom</script>")


def test_awa_status_text_and_json() -> None:
    testjobs.noop.enqueue()
    dead_letter("mail")
    text = run("awa_status")
    assert "default: active, 1 available" in text and "mail:" in text and "1 in DLQ" in text
    assert "rings:" in text
    data = json.loads(run("awa_status", "--json"))
    queues = {q["queue"]: q for q in data["queues"]}
    assert queues["default"]["available"] == 1 and queues["mail"]["dlq"] == 1
    assert {r["ring"] for r in data["rings"]} == {"queue", "claim", "lease"}
    assert data["leader"] is None


def test_awa_queue_pause_resume_drain_stats() -> None:
    job = testjobs.noop.enqueue().id
    assert run("awa_queue", "pause", "default") == "queue default paused\n"
    with pg() as conn:
        assert storage.claim(conn, "default", 5, WORKER) == []
    assert "paused: True" in run("awa_queue", "stats", "default")
    run("awa_queue", "resume", "default")
    assert "cancelled 1 waiting job(s)" in run("awa_queue", "drain", "default")
    with pg() as conn:
        assert job_state(conn, job)["state"] == "cancelled"  # type: ignore[index]


def test_awa_dlq_list_retry_purge() -> None:
    a, b = dead_letter("mail", 2)
    [c] = dead_letter("other")
    listing = run("awa_dlq", "list", "--queue", "mail")
    listed = {int(line.split("\t")[0]) for line in listing.splitlines() if "\t" in line}
    assert "2 job(s)" in listing and listed == {a, b}
    rows = json.loads(run("awa_dlq", "list", "--json"))
    assert {r["id"] for r in rows} == {a, b, c}
    assert run("awa_dlq", "retry", str(a), "--to-queue", "again") == "retried 1 job(s)\n"
    with pg() as conn:
        state = job_state(conn, a)
    assert state is not None and (state["state"], state["queue"]) == ("available", "again")
    assert run("awa_dlq", "purge", "--queue", "other") == "purged 1 job(s)\n"
    assert run("awa_dlq", "purge", "--all") == "purged 1 job(s)\n"
    assert json.loads(run("awa_dlq", "list", "--json")) == []


def test_awa_job_show_retry_cancel() -> None:
    live = testjobs.noop.enqueue().id
    shown = json.loads(run("awa_job", "show", str(live)))
    assert (shown["id"], shown["state"]) == (live, "available")
    assert "cancelled (was available)" in run("awa_job", "cancel", str(live))
    [dead] = dead_letter()
    assert run("awa_job", "retry", str(dead)) == f"job {dead} retried\n"
    assert "callback" not in shown
    with pg() as conn:
        waiting, callback = parked(conn, timeout=3600)
    shown = json.loads(run("awa_job", "show", str(waiting.job_id)))
    assert shown["state"] == "waiting_external"
    assert shown["callback"]["callback_id"] == str(callback)
    assert shown["callback"]["timeout_at"] is not None


def test_awa_job_refuses_retry_of_live_job_and_cancel_of_terminal() -> None:
    live = testjobs.noop.enqueue().id
    with pytest.raises(CommandError, match="not in the dead letter queue"):
        run("awa_job", "retry", str(live))
    run("awa_job", "cancel", str(live))
    with pytest.raises(CommandError, match="nothing to cancel"):
        run("awa_job", "cancel", str(live))


# Bad arguments: a CommandError (a usage error on the command line) with a clear message ------

HUGE = "99999999999999999999"

BAD_ARGUMENTS = [
    # awa_dlq
    (("awa_dlq", "purge", HUGE), f"'{HUGE}' is out of range: a job id is a whole number from 1"),
    (("awa_dlq", "retry", "0"), "'0' is out of range: a job id"),
    (("awa_dlq", "purge", "-5"), "'-5' is out of range: a job id"),
    (("awa_dlq", "purge", "abc"), "'abc' is not a job id: give a whole number"),
    (("awa_dlq", "purge", "nan"), "'nan' is not a job id"),
    (("awa_dlq", "purge", "1.5"), "'1.5' is not a job id"),
    (("awa_dlq", "purge", "9" * 5000), "is out of range: a job id"),
    (("awa_dlq", "list", "--limit", "0"), "'0' is out of range: the limit is a whole number"),
    (("awa_dlq", "list", "--limit", "100001"), "out of range: the limit"),
    (("awa_dlq", "list", "--limit", "NaN"), "'NaN' is not the limit"),
    (("awa_dlq", "list", "--limit", "-1"), "'-1' is out of range: the limit"),
    (("awa_dlq", "list", "--queue", "Not Valid"), "'Not Valid' is not a valid queue name"),
    (("awa_dlq", "retry", "--all", "--to-queue", "Bad Queue"), "'Bad Queue' is not a valid queue"),
    (("awa_dlq", "retry", "--all", "--priority", "101"), "'101' is out of range: the priority"),
    (("awa_dlq", "retry", "--all", "--priority", HUGE), "out of range: the priority"),
    (("awa_dlq", "retry", "--all", "--priority", "high"), "'high' is not the priority"),
    (("awa_dlq", "purge"), "purge of the whole DLQ needs --all"),
    (("awa_dlq", "retry"), "retry of the whole DLQ needs --all"),
    (("awa_dlq", "retry", "1", "--queue", "mail"), "give job ids, or --queue/--kind filters"),
    (("awa_dlq", "purge", "1", "--all"), "give job ids, or --queue/--kind filters, or --all"),
    (("awa_dlq", "list", "1"), "job ids only apply to retry and purge, not list"),
    (("awa_dlq", "purge", "--all", "--to-queue", "x"), "--to-queue only apply to retry"),
    (("awa_dlq", "purge", "--all", "--limit", "5"), "--limit only apply to list, not purge"),
    (("awa_dlq", "drop"), "invalid choice: 'drop'"),
    # awa_job
    (("awa_job", "show", HUGE), f"'{HUGE}' is out of range: a job id"),
    (("awa_job", "show", "-1"), "'-1' is out of range: a job id"),
    (("awa_job", "show", "x"), "'x' is not a job id"),
    (("awa_job", "show", "987654321"), "job 987654321 not found"),
    (("awa_job", "bogus", "1"), "invalid choice: 'bogus'"),
    (("awa_job", "show"), "show needs a job id"),
    (("awa_job", "list", "5"), "list takes no job id"),
    (("awa_job", "show", "5", "--queue", "q"), "--queue is for list only"),
    (("awa_job", "list", "--state", "lost"), "invalid choice: 'lost'"),
    (("awa_job", "list", "--limit", "0"), "'0' is out of range: the limit"),
    (("awa_job", "list", "--tag", "a\x00b"), "tag"),
    # awa_queue
    (("awa_queue", "pause", "Not Valid"), "'Not Valid' is not a valid queue name"),
    (("awa_queue", "pause", "x" * 64), "is not a valid queue name"),
    (("awa_queue", "stats", "nosuchqueue"), "unknown queue 'nosuchqueue'"),
    (("awa_queue", "empty", "q"), "invalid choice: 'empty'"),
    # awa_worker (refused before any process starts)
    (("awa_worker", "--queue", f"q={HUGE}"), "the concurrency must be from 1 to 10000"),
    (("awa_worker", "--queue", "q=-1"), "the concurrency must be from 1 to 10000"),
    (("awa_worker", "--queue", "q=nan"), "the concurrency 'nan' is not a whole number"),
    (("awa_worker", "--queue", "=3"), "no queue name"),
    (("awa_worker", "--queue", "Emails"), "'Emails' is not a valid queue name"),
    (("awa_worker", "--queue", "a", "--queue", "a=2"), "--queue 'a' is given twice"),
    (("awa_worker", "--concurrency", "0"), "'0' is out of range: the concurrency"),
    (("awa_worker", "--concurrency", HUGE), "out of range: the concurrency"),
    (("awa_worker", "--concurrency", "ten"), "'ten' is not the concurrency"),
    (("awa_worker", "--processes", "0"), "'0' is out of range: the number of processes"),
    (("awa_worker", "--processes", "257"), "out of range: the number of processes"),
    (("awa_worker", "--processes", "2.0"), "'2.0' is not the number of processes"),
    (("awa_worker", "--concurrency", "5", "--queue", "a=6"), "--queue a=6 asks for more jobs"),
    (("awa_worker", "--reload", "--processes", "2"), "--reload runs one worker process"),
]


@pytest.mark.parametrize(
    ("argv", "message"), BAD_ARGUMENTS, ids=[" ".join(a)[:60] for a, _ in BAD_ARGUMENTS]
)
def test_every_bad_argument_is_a_command_error_with_a_clear_message(
    argv: tuple[str, ...], message: str
) -> None:
    with pytest.raises(CommandError) as excinfo:
        run(*argv)
    assert message in str(excinfo.value)


@pytest.mark.parametrize(
    "argv",
    [
        ("awa_dlq", "purge", HUGE),
        ("awa_dlq", "purge", "-5"),
        ("awa_worker", "--queue", f"q={HUGE}"),
        ("awa_job", "show", "nan"),
        ("awa_queue", "drain", "Bad Name"),
    ],
)
def test_bad_arguments_on_the_command_line_end_without_a_traceback(
    manage_py: Any, argv: tuple[str, ...]
) -> None:
    proc = manage_py(*argv)
    assert proc.wait(60) != 0
    output = proc.output()
    assert "Traceback" not in output, output
    assert "error:" in output.lower(), output


def test_a_missing_schema_is_a_command_error_that_points_at_migrate() -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("ALTER SCHEMA awa RENAME TO awa_hidden")
    try:
        with pytest.raises(CommandError, match=r"has `manage.py migrate` run"):
            run("awa_status")
    finally:
        with connection.cursor() as cursor:
            cursor.execute("ALTER SCHEMA awa_hidden RENAME TO awa")


# Filters are worked through to the end, in batches ------------------------------------------


def dlq_count(queue: str) -> int:
    with pg() as conn:
        row = conn.execute("SELECT count(*) FROM awa.dlq_entries WHERE queue = %s", [queue])
        return int(row.fetchone()[0])  # type: ignore[index]


@pytest.mark.parametrize("action", ["purge", "retry"])
def test_a_filtered_purge_or_retry_finishes_more_than_ten_thousand_entries(action: str) -> None:
    factories.dead_letter(10_500, "bulk")
    [other] = dead_letter("other")
    out = run("awa_dlq", action, "--queue", "bulk", "--verbosity", "2")
    verb = "purged" if action == "purge" else "retried"
    assert out.splitlines()[-1] == f"{verb} 10500 job(s)"
    assert "1000 job(s) (1000 so far)" in out  # batches of 1,000, one transaction each
    assert dlq_count("bulk") == 0
    assert dlq_count("other") == 1 and other  # untouched
    if action == "retry":
        with pg() as conn:
            row = conn.execute(
                "SELECT count(*) FROM awa.jobs WHERE queue = 'bulk' AND state = 'available'"
            ).fetchone()
        assert row == (10_500,)


# Output: self.stdout and self.style, quieter at --verbosity 0 -------------------------------


def test_action_commands_are_silent_at_verbosity_0_and_styled_with_color() -> None:
    dead_letter("mail", 2)
    assert run("awa_dlq", "purge", "--queue", "mail", "--verbosity", "0") == ""
    [job] = dead_letter("mail")
    out = StringIO()
    call_command("awa_dlq", "purge", str(job), stdout=out, force_color=True)
    assert out.getvalue().startswith("\x1b[") and "purged 1 job(s)" in out.getvalue()
    assert "\x1b[" not in run("awa_queue", "pause", "mail")
    err = StringIO()
    call_command("awa_dlq", "purge", "12345", stdout=StringIO(), stderr=err)
    assert err.getvalue() == "1 not in the DLQ: 12345\n"
