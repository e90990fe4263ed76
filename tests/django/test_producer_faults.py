"""The producer and operator API under faults: one transaction per write, bad input refused with
nothing written and the caller's transaction intact, isolation enforced.

Each test gives the API what a careless or malicious caller could: wrong types, values past
their bounds, a transaction at the wrong isolation, another database.
"""

from __future__ import annotations

import threading
import uuid
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest
from django.db import connection, connections, transaction

import awa_django
from awa_django import (
    InvalidArgumentsError,
    InvalidOptionError,
    IsolationLevelError,
    JobRequest,
    JobValidationError,
    operator,
)
from awa_django.db import storage
from awa_django.operator import dlq_list, queue_drain, queue_pause
from tests.jobs import common as testjobs
from tests.support.awa_schema import job_state
from tests.support.database import conninfo, pg
from tests.support.factories import WORKER

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("clean_awa")]

NOOP = "tests.jobs.common.noop"


def count_jobs() -> int:
    with pg() as conn:
        row = conn.execute("SELECT count(*) FROM awa.jobs").fetchone()
    assert row is not None
    return int(row[0])


# One transaction per write -----------------------------------------------------------------------


class _InterleavingCursor:
    """A psycopg cursor proxy that runs ``before_copy`` when the COPY of enqueue_many starts,
    i.e. between reserving the lane positions and writing the rows."""

    def __init__(self, cursor: Any, before_copy: Any) -> None:
        self._cursor = cursor
        self._before_copy = before_copy

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cursor, name)

    def copy(self, *args: Any, **kwargs: Any) -> Any:
        self._before_copy()
        return self._cursor.copy(*args, **kwargs)


@pytest.mark.django_db(transaction=True)
def test_enqueue_many_outside_atomic_loses_no_job_to_a_concurrent_producer_and_claimer(
    monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    settings.AWA = {**settings.AWA, "ENQUEUE_SHARDS": 1}
    from awa_django.db import enqueue as producer

    testjobs.noop.using(queue="lost").enqueue()  # creates the queue's single lane
    other: dict[str, Any] = {}

    def producer_and_claimer() -> None:
        # Another producer takes the next lane position and commits; a worker claims it.
        with psycopg.connect(conninfo(), autocommit=True) as conn:
            conn.execute("SET lock_timeout = '2s'")
            try:
                other["id"] = conn.execute(
                    "SELECT job_id FROM awa.enqueue_one_v1(%s, 'lost', 0, %s::jsonb, 1)",
                    [NOOP, '{"args": [], "kwargs": {}}'],
                ).fetchone()
            except psycopg.errors.LockNotAvailable:
                other["blocked"] = True

    def before_copy() -> None:
        thread = threading.Thread(target=producer_and_claimer)
        thread.start()
        thread.join(5)

    real = producer.copy_enqueue
    monkeypatch.setattr(
        producer,
        "copy_enqueue",
        lambda cur, reqs: real(_InterleavingCursor(cur, before_copy), reqs),
    )
    assert connection.get_autocommit()
    handles = awa_django.enqueue_many([testjobs.noop.using(queue="lost").prepare()] * 3)
    with pg() as conn:
        claimed = {c.job_id for c in storage.claim(conn, "lost", 100, WORKER)}
    # Every job enqueue_many returned is claimable: none was committed behind the cursor.
    assert {h.id for h in handles} <= claimed
    assert other == {"blocked": True}


def test_enqueue_many_in_autocommit_notifies_only_after_its_rows_exist(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from awa_django.db import enqueue as producer

    testjobs.noop.enqueue()
    seen: list[str] = []
    with pg() as listener:
        listener.execute("LISTEN awa_jobs")

        def before_copy() -> None:
            seen.extend(n.payload for n in listener.notifies(timeout=0.3, stop_after=1))

        real = producer.copy_enqueue
        monkeypatch.setattr(
            producer,
            "copy_enqueue",
            lambda cur, reqs: real(_InterleavingCursor(cur, before_copy), reqs),
        )
        awa_django.enqueue_many([testjobs.noop.prepare()] * 2)
        assert seen == []  # nothing was announced while the rows did not exist
        after = [n.payload for n in listener.notifies(timeout=2, stop_after=1)]
    assert after == ["default"]


def test_a_drain_from_autocommit_cancels_everything_in_short_batches() -> None:
    awa_django.enqueue_many([testjobs.noop.using(queue="d").prepare()] * 2500)
    assert queue_drain("d") == 2500
    with pg() as conn:
        assert storage.queue_depth(conn, "d") == {"d": 0}


# Bad input: a JobValidationError, nothing written, the caller's transaction still usable --------

BAD_ENQUEUES: list[tuple[str, dict[str, Any], type[JobValidationError]]] = [
    ("run_after timedelta.max", {"run_after": timedelta.max}, InvalidOptionError),
    ("deadline timedelta.max", {"deadline": timedelta.max}, InvalidOptionError),
    ("deadline 1e300", {"deadline": 1e300}, InvalidOptionError),
    ("deadline nan", {"deadline": float("nan")}, InvalidOptionError),
    ("deadline bool", {"deadline": True}, InvalidOptionError),
    ("run_after number", {"run_after": 5}, InvalidOptionError),
    ("args surrogate", {"args": ["\ud800"]}, InvalidArgumentsError),
    ("kwargs key surrogate", {"kwargs": {"\udfff": 1}}, InvalidArgumentsError),
    ("metadata surrogate", {"metadata": {"k": "a\ud800b"}}, InvalidArgumentsError),
    ("tags surrogate", {"tags": ["\ud800"]}, InvalidOptionError),
    ("huge int", {"args": [10**5000]}, InvalidArgumentsError),
    ("args a string", {"args": "abc"}, InvalidArgumentsError),
    ("args a dict", {"args": {"a": 1}}, InvalidArgumentsError),
    ("kwargs a list", {"kwargs": [("a", 1)]}, InvalidArgumentsError),
    ("tags a string", {"tags": "abc"}, InvalidOptionError),
    ("metadata a list", {"metadata": [1]}, InvalidOptionError),
]


@pytest.mark.parametrize(
    ("options", "error"), [b[1:] for b in BAD_ENQUEUES], ids=[b[0] for b in BAD_ENQUEUES]
)
def test_bad_enqueue_input_is_refused_before_anything_is_written(
    options: dict[str, Any], error: type[JobValidationError]
) -> None:
    with transaction.atomic():
        testjobs.noop.enqueue()
        with pytest.raises(error):
            awa_django.enqueue(NOOP, **options)
        # The transaction is intact: the job before commits with it.
        testjobs.noop.enqueue()
    assert count_jobs() == 2


@pytest.mark.parametrize(
    "bad",
    [
        "junk",
        None,
        {"kind": NOOP},
    ],
)
def test_enqueue_many_refuses_anything_but_prepared_requests(bad: Any) -> None:
    with pytest.raises(InvalidOptionError, match="requests"):
        awa_django.enqueue_many([testjobs.noop.prepare(), bad])
    assert count_jobs() == 0


def test_prepare_and_using_refuse_bad_options_at_once() -> None:
    with pytest.raises(InvalidArgumentsError):
        testjobs.renamed.prepare("\ud800")
    with pytest.raises(InvalidOptionError):
        testjobs.noop.using(tags="abc").prepare()
    with pytest.raises(InvalidOptionError):
        testjobs.noop.using(run_after=timedelta(days=365 * 200)).prepare()
    # The far ends of what Python and PostgreSQL both store are fine; a past delay means now.
    far = datetime.max.replace(tzinfo=UTC)
    assert testjobs.noop.using(run_after=far).enqueue().state == "scheduled"
    assert testjobs.noop.using(run_after=datetime.min.replace(tzinfo=UTC)).enqueue().state == (
        "available"
    )
    assert testjobs.noop.using(run_after=timedelta.min).enqueue().state == "available"
    assert testjobs.noop.using(run_after=timedelta(days=36_500)).enqueue().state == "scheduled"


@pytest.mark.parametrize(
    ("callback_id", "options"),
    [
        ("not-a-uuid", {}),
        (12, {}),
        (uuid.uuid4(), {"error": "bad \x00 text"}),
        (uuid.uuid4(), {"error": "bad \ud800 text"}),
        (uuid.uuid4(), {"error": 5}),
        (uuid.uuid4(), {"result": {1, 2}}),
        (uuid.uuid4(), {"result": "\ud800"}),
        (uuid.uuid4(), {"terminal": "yes"}),
    ],
)
def test_resolve_callback_refuses_bad_input_and_keeps_the_transaction(
    callback_id: Any, options: dict[str, Any]
) -> None:
    with transaction.atomic():
        testjobs.noop.enqueue()
        with pytest.raises(JobValidationError):
            awa_django.resolve_callback(callback_id, **options)
        testjobs.noop.enqueue()
    assert count_jobs() == 2


def test_cancel_and_dlq_refuse_bad_ids_and_reasons() -> None:
    with transaction.atomic():
        for call in (
            lambda: awa_django.cancel("7"),  # type: ignore[arg-type]
            lambda: awa_django.cancel(1, reason="a\x00b"),
            lambda: awa_django.cancel(2**70),
            lambda: awa_django.dlq_retry(["x"]),  # type: ignore[list-item]
            lambda: awa_django.dlq_purge([2**70]),
        ):
            with pytest.raises(JobValidationError):
                call()
        testjobs.noop.enqueue()
    assert count_jobs() == 1


# Isolation ---------------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True, databases=["default", "repeatable"])
def test_writes_in_autocommit_run_at_read_committed_whatever_the_alias_default() -> None:
    handle = testjobs.noop.using(using="repeatable").enqueue()
    # cancel needs READ COMMITTED; the alias defaults to REPEATABLE READ.
    assert awa_django.cancel(handle.id, using="repeatable") == "available"
    with pg() as conn:
        assert job_state(conn, handle.id)["state"] == "cancelled"  # type: ignore[index]
    assert connections["repeatable"].settings_dict["OPTIONS"]["isolation_level"]


# Odd datetimes, forged requests, odd arguments, isolation, a lost connection ----------------------


def test_run_after_in_any_offset_is_stored_in_utc_or_refused_cleanly() -> None:
    sixteen = timezone(timedelta(hours=16))
    with transaction.atomic():
        handle = testjobs.noop.using(run_after=datetime(2030, 1, 1, tzinfo=sixteen)).enqueue()
        with pytest.raises(InvalidOptionError, match="run_after"):
            testjobs.noop.using(
                run_after=datetime(9999, 12, 31, 20, tzinfo=timezone(timedelta(hours=-14)))
            ).enqueue()
        testjobs.noop.enqueue()
    with pg() as conn:
        job = job_state(conn, handle.id)
    assert job is not None
    assert job["run_at"] == datetime(2029, 12, 31, 8, tzinfo=UTC)
    assert count_jobs() == 2


def test_a_datetime_subclass_cannot_write_into_the_request() -> None:
    class Sneaky(datetime):
        def isoformat(self, *args: Any, **kwargs: Any) -> str:
            return '2030-01-01T00:00:00+00:00","kind":"os.system'

    when = Sneaky(2030, 1, 1, tzinfo=UTC)
    [handle] = awa_django.enqueue_many(
        [testjobs.noop.using(run_after=when).prepare(), testjobs.noop.prepare()][:1]
    )
    with pg() as conn:
        job = job_state(conn, handle.id)
    assert job is not None and job["kind"] == NOOP


def test_requests_cannot_be_changed_or_forged() -> None:
    request = testjobs.noop.prepare()
    with pytest.raises(AttributeError):
        request.kind = "os.system"  # type: ignore[misc]
    forged = request._replace(kind="os.system")
    built = JobRequest(NOOP, "default", 0, "default", 1, '{"args": [], "kwargs": {}}')
    for bad in (forged, built):
        with pytest.raises(InvalidOptionError, match=r"Job\.prepare"):
            awa_django.enqueue_many([request, bad])
    assert count_jobs() == 0


@pytest.mark.parametrize(
    "call",
    [
        lambda: awa_django.enqueue(NOOP, deadline=10**400),
        lambda: awa_django.RetryAfter(10**400),
        lambda: awa_django.Snooze(-(10**400)),
        lambda: awa_django.enqueue(NOOP, args=type("L", (list,), {})([1])),
        lambda: awa_django.cancel(1, using="nope"),
        lambda: awa_django.dlq_retry([1], using="nope"),
        lambda: awa_django.resolve_callback(uuid.uuid4(), using="nope"),
        lambda: queue_pause("q", "no"),  # type: ignore[arg-type]
        lambda: queue_pause("q", 0),  # type: ignore[arg-type]
        lambda: dlq_list(limit=-1),
        lambda: dlq_list(limit=10**20),
    ],
)
def test_odd_arguments_raise_validation_errors_and_keep_the_transaction(call: Any) -> None:
    with transaction.atomic():
        with pytest.raises(JobValidationError):
            call()
        testjobs.noop.enqueue()
    assert count_jobs() == 1


@pytest.mark.django_db(transaction=True, databases=["default", "repeatable"])
def test_an_operation_needing_read_committed_refuses_before_touching_the_transaction() -> None:
    handle = testjobs.noop.using(using="repeatable").enqueue()
    with transaction.atomic(using="repeatable"):
        with pytest.raises(IsolationLevelError, match="REPEATABLE READ"):
            awa_django.cancel(handle.id, using="repeatable")
        with pytest.raises(IsolationLevelError):
            queue_drain("default", using="repeatable")
        testjobs.noop.using(using="repeatable").enqueue()  # still usable
    assert count_jobs() == 2


def test_a_bulk_enqueue_that_loses_its_connection_raises_djangos_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from django.db import OperationalError

    from awa_django.db import enqueue as producer

    def cut(cursor: Any, requests: Any) -> Any:
        with psycopg.connect(conninfo(), autocommit=True) as killer:
            killer.execute("SELECT pg_terminate_backend(%s)", [cursor.connection.info.backend_pid])
        return real(cursor, requests)

    real = producer.copy_enqueue
    monkeypatch.setattr(producer, "copy_enqueue", cut)
    with pytest.raises(OperationalError):
        awa_django.enqueue_many([testjobs.noop.prepare()] * 3)
    connection.close()
    assert count_jobs() == 0


# Operator reads' arguments, a database that is not PostgreSQL, odd worker rows -----------------


@pytest.mark.parametrize(
    "call",
    [
        lambda: operator.job_show(True),  # type: ignore[arg-type]
        lambda: operator.job_show("1"),  # type: ignore[arg-type]
        lambda: operator.job_show(1.0),  # type: ignore[arg-type]
        lambda: operator.job_show(2**64),
        lambda: operator.job_show([1]),  # type: ignore[arg-type]
        lambda: operator.throughput(5),  # type: ignore[arg-type]
        lambda: operator.throughput("A"),
        lambda: operator.throughput("a\x00"),
        lambda: operator.throughput("\ud800"),
        lambda: operator.dlq_retry({1: "x"}),
        lambda: operator.dlq_purge({1: "x"}),
        lambda: operator.queue_drain("q", each_batch=5),  # type: ignore[arg-type]
        lambda: operator.queue_stats(using=""),
        lambda: awa_django.enqueue(NOOP, using=""),
    ],
)
def test_every_operator_read_checks_its_arguments_and_keeps_the_transaction(call: Any) -> None:
    with transaction.atomic():
        with pytest.raises(InvalidOptionError):
            call()
        operator.queue_stats()  # the transaction is still usable
    assert count_jobs() == 0


def test_a_database_that_is_not_postgresql_is_refused_by_name() -> None:
    connections.settings["lite"] = {
        **connections.settings["default"],
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": ":memory:",
    }
    try:
        for call in (
            lambda: operator.job_show(1, using="lite"),
            lambda: operator.cancel(1, using="lite"),
            lambda: awa_django.enqueue(NOOP, using="lite"),
        ):
            with pytest.raises(InvalidOptionError, match="'lite' is a sqlite database"):
                call()
    finally:
        del connections.settings["lite"]


def test_a_worker_row_of_another_shape_reads_as_no_queues() -> None:
    from tests.support.factories import staff

    with pg() as conn:
        for queues in ('["x"]', '"default"', '{"a": 2, "b": "x"}'):
            conn.execute(
                "INSERT INTO awa.runtime_instances (instance_id, hostname, pid, queues, "
                "concurrency) VALUES (gen_random_uuid(), 'old', 1, %s::jsonb, 0)",
                [queues],
            )
    assert sorted(str(w.queues) for w in operator.workers()) == ["{'a': 2}", "{}", "{}"]
    assert staff().get("/admin/awa_django/worker/").status_code == 200


def test_drain_reports_fail_for_a_job_with_no_attempt_left() -> None:
    from awa_django.testing import drain

    testjobs.flaky.using(max_attempts=1).enqueue(5)
    [run] = drain("work")
    assert run.outcome == "fail"
    testjobs.flaky.using(max_attempts=2).enqueue(5)
    [run] = drain("work")
    assert run.outcome == "retry"
