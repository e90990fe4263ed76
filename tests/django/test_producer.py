"""The producer API: transactional enqueue through Django's connection, and bad input."""

from __future__ import annotations

import json
import math
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.db import connection, transaction
from django.test import override_settings

import awa_django
from awa_django import (
    InvalidArgumentsError,
    InvalidOptionError,
    LimitExceededError,
    UnknownKindError,
)
from awa_django.jobs import get_job, job
from tests.jobs import common as testjobs
from tests.support.awa_schema import count_jobs, job_state
from tests.support.database import PGBOUNCER, pg

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("clean_awa"),
    pytest.mark.pooler,
]


def test_committed_enqueue_is_available() -> None:
    with transaction.atomic():
        handle = testjobs.send_email.enqueue("a@example.com", subject="hi")
    assert handle.id > 0 and handle.state == "available"
    assert (handle.kind, handle.queue, handle.priority) == (
        "tests.jobs.common.send_email",
        "emails",
        5,
    )
    with pg() as conn:
        state = job_state(conn, handle.id)
    assert state is not None
    assert state["state"] == "available"
    assert state["args"] == {"args": ["a@example.com"], "kwargs": {"subject": "hi"}}
    assert state["tags"] == ["mail"] and state["max_attempts"] == 3


def test_rolled_back_enqueue_leaves_no_job_and_no_notify() -> None:
    with pg() as listener:
        listener.execute("LISTEN awa_jobs")
        with pytest.raises(RuntimeError), transaction.atomic():
            testjobs.noop.enqueue()
            testjobs.noop.using(run_after=timedelta(hours=1)).enqueue()
            raise RuntimeError("rollback")
        assert count_jobs() == 0
        with pg() as conn:
            for table in ("ready_entries", "deferred_jobs", "done_entries", "claims"):
                row = conn.execute(f"SELECT count(*) FROM awa.{table}").fetchone()
                assert row == (0,), table
        assert list(listener.notifies(timeout=0.3)) == []
        with transaction.atomic():
            testjobs.noop.enqueue()
        notes = list(listener.notifies(timeout=5, stop_after=1))
        assert [n.payload for n in notes] == ["default"]


def test_future_run_after_is_scheduled() -> None:
    later = testjobs.noop.using(run_after=timedelta(minutes=5)).enqueue()
    at = testjobs.noop.using(run_after=datetime.now().astimezone() + timedelta(days=1)).enqueue()
    past = testjobs.noop.using(run_after=datetime.now().astimezone() - timedelta(days=1)).enqueue()
    assert (later.state, at.state, past.state) == ("scheduled", "scheduled", "available")


def test_naive_run_after_is_refused_when_use_tz() -> None:
    with pytest.raises(InvalidOptionError, match=r"^run_after: .*naive"):
        testjobs.noop.using(run_after=datetime(2030, 1, 1)).enqueue()


def test_using_copies_options_and_enqueue_by_name() -> None:
    handle = testjobs.noop.using(queue="bulk", priority=-3, max_attempts=7, tags=["x"])
    assert testjobs.noop.options.queue is None  # the original is untouched
    job_ = handle.enqueue()
    assert (job_.queue, job_.priority) == ("bulk", -3)
    by_name = awa_django.enqueue("tests.renamed", args=[1], kwargs={"k": "v"}, priority=9)
    assert (by_name.queue, by_name.priority, by_name.kind) == ("other", 9, "tests.renamed")
    with pg() as conn:
        state = job_state(conn, job_.id)
    assert state is not None and (state["max_attempts"], state["tags"]) == (7, ["x"])


def test_enqueue_many_keeps_order_and_returns_ids() -> None:
    requests = [testjobs.renamed.prepare(i) for i in range(12_000)]
    with transaction.atomic():
        handles = awa_django.enqueue_many(requests)
    assert len(handles) == 12_000 and len({h.id for h in handles}) == 12_000
    assert [h.id for h in handles] == sorted(h.id for h in handles)
    with pg() as conn:
        rows = conn.execute(
            "SELECT job_id, (args->'args'->>0)::int FROM awa.ready_entries "
            "WHERE queue = 'other' ORDER BY lane_seq"
        ).fetchall()
    assert [r[1] for r in rows] == list(range(12_000))
    assert [r[0] for r in rows] == [h.id for h in handles]


def test_enqueue_many_round_trips_awkward_values_through_copy() -> None:
    awkward = 'tab\there, newline\nthere, back\\slash, quote" and \u00e9\u4e2d'
    requests = [
        testjobs.renamed.using(
            tags=[awkward, "{braces}", "comma,sep"],
            metadata={"k": awkward, "nested": {"x": [1, 2.5, None, True]}},
            deadline=timedelta(seconds=90),
        ).prepare(awkward, key=awkward),
        testjobs.send_email.prepare("a@example.com"),
        testjobs.noop.using(priority=-7).prepare(),
        testjobs.renamed.prepare({"deep": [[["\\"]]]}),
    ]
    handles = awa_django.enqueue_many(requests)
    assert [h.state for h in handles] == ["available"] * 4
    with pg() as conn:
        first = job_state(conn, handles[0].id)
        assert first is not None
        assert first["args"] == {"args": [awkward], "kwargs": {"key": awkward}}
        assert first["tags"] == [awkward, "{braces}", "comma,sep"]
        assert first["metadata"] == {"k": awkward, "nested": {"x": [1, 2.5, None, True]}}
        row = conn.execute(
            "SELECT deadline_secs, kind FROM awa.ready_entries WHERE job_id = %s", [handles[0].id]
        ).fetchone()
        assert row == (90.0, "tests.renamed")
        states = [job_state(conn, h.id) for h in handles[1:]]
    assert [(s["queue"], s["priority"]) for s in states if s] == [
        ("emails", 5),
        ("default", -7),
        ("other", 0),
    ]
    assert states[2] is not None and states[2]["args"]["args"] == [{"deep": [[["\\"]]]}]


def test_enqueue_many_with_timed_requests_splits_on_the_database_clock() -> None:
    requests = [
        testjobs.noop.prepare(),
        testjobs.noop.using(run_after=timedelta(hours=1)).prepare(),
        testjobs.noop.using(run_after=datetime.now().astimezone() - timedelta(hours=1)).prepare(),
    ]
    handles = awa_django.enqueue_many(requests)
    assert [h.state for h in handles] == ["available", "scheduled", "available"]


def test_async_enqueue_and_call() -> None:
    import asyncio

    from asgiref.sync import sync_to_async
    from django.db import connections

    async def scenario() -> awa_django.EnqueuedJob:
        handle = await testjobs.async_echo.aenqueue({"a": 1})
        await sync_to_async(connections.close_all, thread_sensitive=True)()
        return handle

    handle = asyncio.run(scenario())
    assert handle.queue == "async"
    assert testjobs.async_echo.call(5) == 5
    assert testjobs.with_ctx.call(3) == 3
    assert testjobs.with_ctx.takes_context and not testjobs.noop.takes_context


def test_kind_names_and_registry() -> None:
    assert testjobs.noop.kind == "tests.jobs.common.noop"
    assert get_job("tests.renamed") is not None
    from django.core.exceptions import ImproperlyConfigured

    with pytest.raises(ImproperlyConfigured, match="nested"):

        @job
        def nested() -> None: ...

    with pytest.raises(ImproperlyConfigured, match="already registered"):
        job(name="tests.renamed")(lambda: None)


def test_another_producer_is_not_blocked_by_an_open_transaction() -> None:
    # A enqueues inside an open transaction and keeps it open; B's enqueue to the same queue
    # returns at once (it takes another enqueue shard) instead of waiting for A to commit.
    testjobs.noop.enqueue()  # the queue and its lanes exist
    with pg(autocommit=False) as a:
        a.execute(
            "SELECT awa.enqueue_v1(%s::jsonb)",
            [json.dumps([{"kind": "tests.jobs.common.noop", "queue": "default"}])],
        )
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = '2s'")
        try:
            b_job = testjobs.noop.enqueue()  # raises LockNotAvailable if it had to wait
        finally:
            with connection.cursor() as cursor:
                cursor.execute("RESET lock_timeout")
        a.commit()
        lanes = a.execute(
            "SELECT job_id, lane_id FROM awa.ready_entries WHERE queue = 'default' ORDER BY job_id"
        ).fetchall()
    assert b_job.state == "available"
    assert len({lane for _, lane in lanes[1:]}) == 2


def test_first_enqueue_to_a_new_queue_inside_a_transaction_does_not_lock_it() -> None:
    # Lanes of a brand-new queue are created outside the producer's transaction.
    with transaction.atomic():
        testjobs.noop.using(queue="fresh-queue").enqueue()
        with pg() as other:
            row = other.execute(
                "SELECT count(*) FROM awa.queue_lanes WHERE queue = 'fresh-queue'"
            ).fetchone()
            assert row is not None and row[0] >= 1


# Bad input: rejected before anything is written, the caller's transaction still usable. ------


class Opaque:
    pass


BAD_ARGS: list[tuple[Any, type[Exception], str]] = [
    ({1, 2}, InvalidArgumentsError, "set"),
    (b"bytes", InvalidArgumentsError, "bytes"),
    (Opaque(), InvalidArgumentsError, "Opaque"),
    (Decimal("1.5"), InvalidArgumentsError, "Decimal"),
    (math.nan, InvalidArgumentsError, "NaN"),
    (math.inf, InvalidArgumentsError, "infinity"),
    ("a\x00b", InvalidArgumentsError, "NUL"),
    ({"k\x00": 1}, InvalidArgumentsError, "NUL"),
    ({1: "int key"}, InvalidArgumentsError, "keys must be str"),
    ("x" * (1024 * 1024 + 1), LimitExceededError, "exceeds the limit"),
]


@pytest.mark.parametrize(("value", "error", "text"), BAD_ARGS)
def test_bad_arguments_are_refused(value: Any, error: type[Exception], text: str) -> None:
    with transaction.atomic():
        with pytest.raises(error, match=text) as info:
            testjobs.renamed.enqueue(value)
        assert str(info.value).startswith("args: ")
        assert count_jobs() == 0  # the transaction is still usable
    assert count_jobs() == 0


def test_nesting_deeper_than_the_limit_is_refused() -> None:
    value: Any = 1
    for _ in range(32):
        value = [value]
    testjobs.renamed.enqueue(value)  # exactly at the limit
    with pytest.raises(LimitExceededError, match=r"^args: nesting deeper than 32"):
        testjobs.renamed.enqueue([value])
    deep: Any = {}
    for _ in range(10_000):  # far past Python's recursion limit: still a clean error
        deep = {"d": deep}
    with pytest.raises(LimitExceededError):
        testjobs.renamed.enqueue(deep)


@pytest.mark.parametrize(
    "queue", ["", "UPPER", "has space", "semi;colon", "quo'te", 'd"q', "x" * 64, "émoji", None]
)
def test_bad_queue_names_are_refused(queue: Any) -> None:
    with pytest.raises(InvalidOptionError, match=r"^queue: "):
        testjobs.noop.using(queue=queue if queue is not None else 5).enqueue()
    assert count_jobs() == 0


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"priority": 101}, "priority"),
        ({"priority": -101}, "priority"),
        ({"priority": 1.5}, "priority"),
        ({"priority": True}, "priority"),
        ({"max_attempts": 0}, "max_attempts"),
        ({"max_attempts": 1001}, "max_attempts"),
        ({"deadline": -1}, "deadline"),
        ({"deadline": math.inf}, "deadline"),
        ({"tags": ["ok"] * 21}, "tags"),
        ({"tags": [""]}, "tags"),
        ({"tags": ["x" * 101]}, "tags"),
        ({"metadata": {"big": "x" * 70_000}}, "metadata"),
        ({"metadata": {"bad": {1, 2}}}, "metadata"),
        ({"using": "nope"}, "using"),
        ({"run_after": 5}, "run_after"),
        ({"weight": 0}, "weight"),
        ({"weight": -1}, "weight"),
        ({"weight": 10_001}, "weight"),
        ({"weight": True}, "weight"),
        ({"weight": 1.5}, "weight"),
        ({"weight": "4"}, "weight"),
        ({"weight": None}, "weight"),
        ({"metadata": {"awa:weight": 4}}, "metadata"),
    ],
)
def test_bad_options_are_refused(options: dict[str, Any], field: str) -> None:
    with pytest.raises(awa_django.JobValidationError, match=f"^{field}: ") as info:
        testjobs.noop.using(**options).enqueue()
    assert info.value.field == field  # type: ignore[attr-defined]
    assert count_jobs() == 0


def test_weight_is_stored_with_the_job_and_refused_at_once_on_the_decorator() -> None:
    light = testjobs.noop.enqueue()
    heavy = testjobs.noop.using(weight=7).enqueue()
    named = awa_django.enqueue("tests.jobs.common.noop", weight=3)
    with pg() as conn:
        rows = dict(
            conn.execute(
                "SELECT id, metadata FROM awa.jobs WHERE id = ANY(%s)",
                [[light.id, heavy.id, named.id]],
            ).fetchall()
        )
    assert rows[light.id] is None  # weight 1 writes nothing
    assert rows[heavy.id] == {"awa:weight": 7}
    assert rows[named.id] == {"awa:weight": 3}
    with pytest.raises(awa_django.JobValidationError, match=r"^weight: "):
        awa_django.job(weight=0)


def test_unknown_kind_is_refused() -> None:
    with pytest.raises(UnknownKindError, match=r"^kind: 'os\.system' is not a registered"):
        awa_django.enqueue("os.system", args=["rm -rf /"])
    assert count_jobs() == 0


@override_settings(AWA={"ARGS_MAX_BYTES": 100})
def test_args_limit_follows_settings() -> None:
    with pytest.raises(LimitExceededError, match="limit of 100 bytes"):
        testjobs.renamed.enqueue("y" * 200)


# The shapes whose binary jsonb is largest next to their JSON text (awa_django.db.enqueue).
_DENSE_SHAPES = {
    "digits": lambda n: [0] * n,
    "negatives": lambda n: [-1] * n,
    "halves": lambda n: [0.5] * n,
    "empty lists": lambda n: [[]] * n,
    "empty objects": lambda n: [{}] * n,
    "wrapped digits": lambda n: [[0]] * n,
    "keyed digits": lambda n: [{"": 0}] * n,
}


def _largest_accepted(shape: Any, limit: int, wrap: Any) -> Any:
    """The biggest value of ``shape`` whose compact JSON (as wrapped) is within ``limit``."""
    n = limit
    while len(json.dumps(wrap(shape(n)), separators=(",", ":"))) > limit:
        n = n * 9 // 10
    while len(json.dumps(wrap(shape(n + 1)), separators=(",", ":"))) <= limit:
        n += 1
    return shape(n)


@pytest.mark.parametrize("shape", _DENSE_SHAPES.values(), ids=_DENSE_SHAPES.keys())
@pytest.mark.skipif(
    PGBOUNCER, reason="CPU-bound search of the size limits; no connection path of its own"
)
@override_settings(AWA={"ARGS_MAX_BYTES": 30_000, "METADATA_MAX_BYTES": 30_000})
def test_arguments_python_accepts_are_never_refused_by_the_sql_size_check(shape: Any) -> None:
    args = _largest_accepted(shape, 30_000, lambda v: {"args": [v], "kwargs": {}})
    metadata = {"m": _largest_accepted(shape, 30_000 - 10, lambda v: {"m": v})}
    with transaction.atomic():
        awa_django.enqueue("tests.jobs.common.noop", args=[args], metadata=metadata)
        # The caller's transaction is intact: the SQL second line refused nothing.
        assert count_jobs() == 1
    assert count_jobs() == 1


def test_the_sql_size_margin_covers_the_densest_jsonb() -> None:
    from awa_django.db.enqueue import JSONB_GROWTH

    with pg() as conn:
        for shape in _DENSE_SHAPES.values():
            text = json.dumps(shape(10_000), separators=(",", ":"))
            row = conn.execute("SELECT pg_column_size(%s::jsonb)", [text]).fetchone()
            assert row is not None and row[0] <= JSONB_GROWTH * len(text) + 4096, text[:20]


def test_sql_second_line_refuses_raw_bad_input_and_writes_nothing() -> None:
    import psycopg

    cases = [
        ({"kind": "k", "queue": "Bad Queue"}, "queue:"),
        ({"kind": "k", "priority": 500}, "priority:"),
        ({"kind": "k", "max_attempts": 0}, "max_attempts:"),
        ({"kind": ""}, "kind:"),
        ({"kind": "k", "tags": [""]}, "tags:"),
        ({"kind": "k", "metadata": [1]}, "metadata:"),
        ({"kind": "k", "args": {"args": [[[[[[[[[[1]]]]]]]]]]}}, "args: nesting"),
    ]
    with pg() as conn:
        for job_, message in cases:
            with pytest.raises(psycopg.errors.InvalidParameterValue, match=message):
                conn.execute(
                    "SELECT awa.enqueue_v1(%s::jsonb, '{\"json_max_depth\": 5}')",
                    [json.dumps([{"kind": "ok"}, job_])],
                )
        with pytest.raises(psycopg.errors.UntranslatableCharacter):
            conn.execute("SELECT awa.enqueue_v1(%s::jsonb)", ['[{"kind": "k", "args": "\\u0000"}]'])
        assert conn.execute("SELECT count(*) FROM awa.jobs").fetchone() == (0,)
