"""The single enqueue's cost (docs/design/enqueue-path.md): what goes over the wire, and the options
a ``Job`` remembers between enqueues (``OptionsMemo``) without weakening the checks."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import connection, transaction
from django.test import override_settings

from awa_django import InvalidArgumentsError, InvalidOptionError, LimitExceededError
from awa_django.db.enqueue import build_request
from awa_django.jobs import Job
from tests.jobs import common as testjobs
from tests.support.awa_schema import count_jobs, job_state
from tests.support.database import pg

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("clean_awa"),
    pytest.mark.pooler,
]


def client_statements(body: Callable[[], object]) -> list[str]:
    """The statements Django's connection sends while ``body`` runs, read from libpq's own
    protocol trace (every frontend ``Query`` or ``Parse`` message: what reaches the server,
    whichever cursor or path sent it)."""
    connection.ensure_connection()
    pgconn = connection.connection.pgconn
    with tempfile.TemporaryFile("w+") as trace:
        pgconn.trace(trace.fileno())
        try:
            body()
        finally:
            pgconn.untrace()
        trace.seek(0)
        lines = trace.read().splitlines()
    # One message per line, "F|B <length> <type> <fields>" (after a timestamp unless
    # suppressed); a statement's own line breaks continue its message on the next lines.
    messages: list[list[str]] = []
    for line in lines:
        parts = line.split("\t")
        head = parts[1:4] if len(parts) > 3 and parts[1] in ("F", "B") else parts[0:3]
        if len(head) == 3 and head[0] in ("F", "B") and head[1].isdigit():
            messages.append(parts[parts.index(head[0]) :])
        elif messages:
            messages[-1][-1] += "\n" + line
    sent = []
    for message in messages:
        if message[0] == "F" and message[2] == "Query":
            sent.append("\t".join(message[3:]))
        elif message[0] == "F" and message[2] == "Parse":
            sent.append("\t".join(message[4:]))
    return sent


def test_one_enqueue_inside_atomic_sends_one_statement() -> None:
    testjobs.noop.enqueue()  # the queue's lanes exist (their first use looks them up)

    def body() -> None:
        with transaction.atomic():
            testjobs.noop.enqueue()

    sent = client_statements(body)
    assert len(sent) == 3, sent
    assert "BEGIN" in sent[0] and "COMMIT" in sent[2]
    assert "awa.enqueue_one_v2" in sent[1]


def test_one_enqueue_in_autocommit_sends_one_statement() -> None:
    testjobs.noop.enqueue()
    sent = client_statements(testjobs.noop.enqueue)
    assert len(sent) == 1 and "awa.enqueue_one_v2" in sent[0], sent


def _requests_equal(handle: Job[Any, Any], *args: Any, **kwargs: Any) -> None:
    """The remembered path builds exactly the request a full check builds."""
    fresh = build_request(handle.kind, args, kwargs, handle.options)
    assert handle.prepare(*args, **kwargs) == fresh
    assert handle.prepare(*args, **kwargs) == fresh  # second time: from the memo


def test_remembered_options_build_the_same_request() -> None:
    _requests_equal(testjobs.send_email, "a@example.com", subject="hi")
    _requests_equal(testjobs.noop)
    _requests_equal(
        testjobs.noop.using(
            queue="memo",
            priority=-3,
            max_attempts=7,
            deadline=timedelta(seconds=90),
            tags=["x", "y"],
            run_after=timedelta(hours=1),
            weight=3,
            serial_key="k",
            unique_key="key",
        )
    )


def test_bad_arguments_are_refused_after_the_options_are_remembered() -> None:
    testjobs.renamed.enqueue(1)
    for bad, error in (
        (float("nan"), InvalidArgumentsError),
        ({1: "int key"}, InvalidArgumentsError),
        ("\x00", InvalidArgumentsError),
        ("x" * 2_000_000, LimitExceededError),
    ):
        with pytest.raises(error):
            testjobs.renamed.enqueue(bad)
        with pytest.raises(error):
            testjobs.renamed.prepare(bad)
    assert count_jobs() == 1


def test_bad_options_are_refused_every_time() -> None:
    bad = testjobs.noop.using(queue="Not A Queue")
    for _ in range(3):
        with pytest.raises(InvalidOptionError):
            bad.enqueue()
    assert count_jobs() == 0


def test_a_new_awa_setting_is_seen_by_a_remembered_handle() -> None:
    testjobs.renamed.enqueue("x" * 500)
    with override_settings(AWA={"ARGS_MAX_BYTES": 100}), pytest.raises(LimitExceededError):
        testjobs.renamed.enqueue("x" * 500)
    testjobs.renamed.enqueue("x" * 500)
    assert count_jobs() == 2


def test_metadata_is_read_at_every_enqueue() -> None:
    metadata: dict[str, object] = {"n": 1}
    handle = testjobs.noop.using(metadata=metadata)
    first = handle.enqueue()
    metadata["n"] = 2  # the caller's mapping changed after the first enqueue
    second = handle.enqueue()
    with pg() as conn:
        rows = [job_state(conn, first.id), job_state(conn, second.id)]
    assert [row["metadata"]["n"] for row in rows if row is not None] == [1, 2]


def test_a_datetime_run_after_is_checked_at_every_enqueue() -> None:
    when = datetime.now(UTC) + timedelta(hours=1)
    handle = testjobs.noop.using(run_after=when)
    assert handle.enqueue().state == "scheduled"
    assert handle.enqueue().state == "scheduled"
    assert handle.prepare().run_at == when.replace(tzinfo=UTC)


@pytest.mark.skipif(os.environ.get("AWA_TEST_PGBOUNCER") == "1", reason="direct trace only")
def test_statement_trace_sees_the_bulk_path_too() -> None:
    """The trace helper sees statements sent on the raw psycopg cursor (the COPY path), so the
    count above would catch a statement added on any path."""
    requests = [testjobs.noop.prepare() for _ in range(3)]

    def body() -> None:
        import awa_django

        with transaction.atomic():
            awa_django.enqueue_many(requests)

    sent = client_statements(body)
    assert any("awa.reserve_v1" in s for s in sent) and any("COPY" in s for s in sent), sent
