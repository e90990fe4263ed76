"""Operator commands: awa_status, awa_queue, awa_dlq, awa_job (happy paths and bad input)."""

from __future__ import annotations

import json
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from awa_django.db import storage
from tests import storage_support, testjobs
from tests.storage_support import WORKER, job_state, pg

pytestmark = [pytest.mark.usefixtures("clean_awa")]


def run(*args: Any) -> str:
    out = StringIO()
    call_command(*args, stdout=out, stderr=StringIO())
    return out.getvalue()


def dead_letter(queue: str = "default", n: int = 1) -> list[int]:
    return storage_support.dead_letter(n, queue, text="<script>boom</script>")


def test_awa_status_text_and_json() -> None:
    testjobs.noop.enqueue()
    dead_letter("mail")
    text = run("awa_status")
    assert "default: 1 available" in text and "mail:" in text and "1 in DLQ" in text
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


@pytest.mark.parametrize(
    "argv",
    [
        ("awa_queue", "pause", "Not Valid"),
        ("awa_queue", "stats", "nosuchqueue"),
    ],
)
def test_awa_queue_bad_input(argv: tuple[str, ...]) -> None:
    with pytest.raises(CommandError):
        run(*argv)


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


@pytest.mark.parametrize(
    "argv",
    [
        ("awa_dlq", "purge"),  # unfiltered bulk needs --all
        ("awa_dlq", "retry"),
        ("awa_dlq", "retry", "1", "--queue", "mail"),  # ids and filters together
        ("awa_dlq", "retry", "--all", "--to-queue", "Bad Queue"),
        ("awa_dlq", "list", "--limit", "0"),
    ],
)
def test_awa_dlq_bad_input(argv: tuple[str, ...]) -> None:
    dead_letter()
    with pytest.raises(CommandError):
        run(*argv)


def test_awa_job_show_retry_cancel() -> None:
    live = testjobs.noop.enqueue().id
    shown = json.loads(run("awa_job", "show", str(live)))
    assert (shown["id"], shown["state"]) == (live, "available")
    assert "cancelled (was available)" in run("awa_job", "cancel", str(live))
    [dead] = dead_letter()
    assert run("awa_job", "retry", str(dead)) == f"job {dead} retried\n"


@pytest.mark.parametrize(
    "argv",
    [
        ("awa_job", "show", "987654321"),
        ("awa_job", "bogus", "1"),
    ],
)
def test_awa_job_bad_input(argv: tuple[str, ...]) -> None:
    with pytest.raises((CommandError, SystemExit)):
        run(*argv)


def test_awa_job_refuses_retry_of_live_job_and_cancel_of_terminal() -> None:
    live = testjobs.noop.enqueue().id
    with pytest.raises(CommandError, match="not in the dead letter queue"):
        run("awa_job", "retry", str(live))
    run("awa_job", "cancel", str(live))
    with pytest.raises(CommandError, match="nothing to cancel"):
        run("awa_job", "cancel", str(live))
