"""Retry policies in the storage engine: every retry path (finalize, callback errors, rescue)
computes its wait with awa._backoff_v2 from the job's stored policy, on the database clock."""

from __future__ import annotations

import json
import uuid
from typing import Any

import psycopg
import pytest

from awa_django.db import storage
from awa_django.db.storage import Finalization
from tests.support.awa_schema import job_state
from tests.support.database import pg
from tests.support.factories import WORKER, enqueue_sql

pytestmark = [
    pytest.mark.storage,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("clean_awa"),
]

ERROR = {"type": "ValueError", "message": "boom", "traceback": "tb"}


def enqueue(
    conn: psycopg.Connection[Any], policy: Any = None, n: int = 1, **extra: Any
) -> list[int]:
    metadata = None if policy is None else {"awa:retry": policy}
    jobs = [{"kind": "k", "queue": "r", "metadata": metadata, **extra} for _ in range(n)]
    return [job_id for job_id, _ in enqueue_sql(conn, json.dumps(jobs))]


def claim(conn: psycopg.Connection[Any], n: int = 1) -> list[storage.ClaimedJob]:
    claimed = storage.claim(conn, "r", n, WORKER)
    assert len(claimed) == n
    return claimed


def fail(conn: psycopg.Connection[Any], jobs: list[storage.ClaimedJob], base: float = 1.0) -> None:
    """Finalize each attempt as a handler error, as the worker does (no delay: the backoff)."""
    items = [
        Finalization(c.job_id, c.run_lease, c.claim_slot, "retry", error=ERROR, backoff_base=base)
        for c in jobs
    ]
    assert storage.finalize(conn, items) == []


def waits(conn: psycopg.Connection[Any], *job_ids: int) -> list[float]:
    """Each retryable job's wait: its run_at minus the time its last failure was recorded
    (now() of the finalizing transaction), both on the database clock."""
    rows = conn.execute(
        "SELECT job_id, extract(epoch FROM run_at - (errors -> -1 ->> 'at')::timestamptz) "
        "FROM awa.deferred_jobs WHERE state = 'retryable' AND job_id = ANY(%s)",
        [list(job_ids)],
    ).fetchall()
    found = {job_id: float(wait) for job_id, wait in rows}
    assert set(found) == set(job_ids), (found, job_ids)
    return [found[j] for j in job_ids]


def again(conn: psycopg.Connection[Any], n: int = 1) -> list[storage.ClaimedJob]:
    """Promote the retryable jobs now and claim them again."""
    conn.execute("UPDATE awa.deferred_jobs SET run_at = now() - interval '1 second'")
    storage.promote(conn)
    return claim(conn, n)


@pytest.mark.parametrize(
    ("backoff", "first", "second", "third"),
    [("exponential", 6.0, 12.0, 24.0), ("linear", 3.0, 6.0, 9.0), ("constant", 3.0, 3.0, 3.0)],
)
def test_each_shape_waits_on_the_database_clock(
    backoff: str, first: float, second: float, third: float
) -> None:
    with pg() as conn:
        [job_id] = enqueue(conn, {"backoff": backoff, "base": 3, "jitter": 0})
        measured = []
        jobs = claim(conn)
        for _ in range(3):
            fail(conn, jobs, base=1000)  # the setting's base does not apply: the policy has one
            measured.append(waits(conn, job_id)[0])
            jobs = again(conn)
        assert measured == pytest.approx([first, second, third], abs=1e-6)


def test_cap_and_jitter_bounds() -> None:
    with pg() as conn:
        [capped] = enqueue(conn, {"base": 100, "cap": 150, "jitter": 0})
        jittered = enqueue(conn, {"backoff": "constant", "base": 10, "jitter": 0.5}, n=20)
        fail(conn, claim(conn, 21))
        assert waits(conn, capped) == [pytest.approx(150)]
        found = waits(conn, *jittered)
        assert all(10 <= w <= 15 for w in found), found
        assert len({round(w, 6) for w in found}) > 1  # jittered, not constant
        # Jitter never passes the cap.
        [both] = enqueue(conn, {"backoff": "constant", "base": 10, "cap": 11, "jitter": 1})
        fail(conn, claim(conn))
        assert 10 <= waits(conn, both)[0] <= 11


def test_without_a_policy_the_setting_s_base_applies_as_before() -> None:
    with pg() as conn:
        jobs = enqueue(conn, n=5)
        fail(conn, claim(conn, 5), base=1000)
        assert all(2000 <= w <= 2500 for w in waits(conn, *jobs))
        # Only what the policy gives is its own: the setting's base with the policy's shape.
        [linear] = enqueue(conn, {"backoff": "linear", "jitter": 0})
        fail(conn, claim(conn), base=7)
        assert waits(conn, linear) == [pytest.approx(7)]


def test_max_age_sends_a_retry_that_would_run_too_late_to_the_dlq() -> None:
    with pg() as conn:
        [young] = enqueue(conn, {"backoff": "constant", "base": 30, "jitter": 0, "max_age": 60})
        [late] = enqueue(conn, {"backoff": "constant", "base": 120, "jitter": 0, "max_age": 60})
        [after] = enqueue(conn, {"max_age": 60})
        jobs = claim(conn, 3)
        fail(conn, jobs[:2])
        assert waits(conn, young) == [pytest.approx(30)]
        state = job_state(conn, late)
        assert state is not None
        assert (state["state"], state["in_dlq"], state["attempt"]) == ("failed", True, 1)
        assert state["dlq_reason"] == "max_age exceeded: boom"
        # An explicit RetryAfter is held to max_age too.
        c = jobs[2]
        storage.finalize(
            conn,
            [Finalization(c.job_id, c.run_lease, c.claim_slot, "retry", delay=61.0, error=ERROR)],
        )
        state = job_state(conn, after)
        assert state is not None and state["dlq_reason"] == "max_age exceeded: boom"
        # The age counts from created_at, on the database clock.
        [old] = enqueue(conn, {"backoff": "constant", "base": 1, "jitter": 0, "max_age": 3600})
        conn.execute(
            "UPDATE awa.ready_entries SET created_at = now() - interval '3599.5 seconds' "
            "WHERE job_id = %s",
            [old],
        )
        fail(conn, claim(conn))
        state = job_state(conn, old)
        assert state is not None and state["dlq_reason"] == "max_age exceeded: boom"


def test_max_age_fails_without_dlq_when_the_queue_has_it_off() -> None:
    with pg() as conn:
        [job_id] = enqueue(conn, {"backoff": "constant", "base": 120, "max_age": 60})
        conn.execute("UPDATE awa.queue_meta SET dlq_enabled = false WHERE queue = 'r'")
        fail(conn, claim(conn))
        state = job_state(conn, job_id)
        assert state is not None and (state["state"], state["in_dlq"]) == ("failed", False)


def test_rescue_follows_the_job_s_policy() -> None:
    with pg() as conn:
        [job_id] = enqueue(conn, {"backoff": "constant", "base": 500, "jitter": 0})
        [too_old] = enqueue(conn, {"backoff": "constant", "base": 500, "max_age": 100})
        [plain] = enqueue(conn)
        claim(conn, 3)
        # Stale at once (staleness 0: claimed before this statement's now()).
        rows = conn.execute("SELECT job_id, reason FROM awa.rescue_v1(0, 500, 1000)").fetchall()
        assert sorted(r[0] for r in rows) == sorted([job_id, too_old, plain])
        assert waits(conn, job_id) == [pytest.approx(500)]
        assert 2000 <= waits(conn, plain)[0] <= 2500  # no policy: p_backoff_base, as before
        state = job_state(conn, too_old)
        assert state is not None and state["dlq_reason"] == (
            "max_age exceeded: heartbeat stale: worker presumed dead"
        )
        closed = conn.execute(
            "SELECT count(*) FROM awa.claim_closures WHERE outcome = 'rescued'"
        ).fetchone()
        assert closed == (3,)


def test_callback_errors_follow_the_job_s_policy_parked_or_early() -> None:
    with pg() as conn:
        policy = {"backoff": "linear", "base": 400, "jitter": 0}
        parked_job, early_job = enqueue(conn, policy, n=2)
        first, second = claim(conn, 2)
        parked, early = uuid.uuid4(), uuid.uuid4()
        conn.execute(
            "SELECT awa.callback_register_v1(%s, %s, %s)", [second.job_id, second.run_lease, early]
        )
        error = '{"type": "awa_django.CallbackError", "message": "declined"}'
        resolve = "SELECT outcome FROM awa.callback_resolve_v2(%s, NULL, %s::jsonb, false, 1000)"
        assert conn.execute(resolve, [early, error]).fetchone() == ("accepted",)
        storage.finalize(
            conn,
            [
                Finalization(
                    c.job_id, c.run_lease, c.claim_slot, "wait", callback_id=cb, timeout=60.0
                )
                for c, cb in ((first, parked), (second, early))
            ],
        )
        assert conn.execute(resolve, [parked, error]).fetchone() == ("resolved",)
        assert waits(conn, parked_job, early_job) == [pytest.approx(400), pytest.approx(400)]


def test_backoff_v2_never_raises_whatever_a_row_holds() -> None:
    with pg() as conn:
        for policy in (
            '{"base": "x", "cap": 1e400, "jitter": [1]}',
            '{"base": -5, "cap": -1, "backoff": 3}',
            '{"base": 1e400}',
            '"not an object"',
            "[1, 2]",
            "null",
        ):
            row = conn.execute("SELECT awa._backoff_v2(3, 2, %s::jsonb)", [policy]).fetchone()
            assert row is not None and 0 <= row[0] <= 86400, (policy, row)
        row = conn.execute("SELECT awa._backoff_v2(1000, 5, NULL)").fetchone()
        assert row == (86400,)


BAD_POLICIES = [
    ({"base": 1e300}, "base: "),
    ({"base": -1}, "base: "),
    ({"base": 86401}, "base: "),
    ({"base": "1"}, "base: "),
    ({"cap": 10**400}, "cap: "),
    ({"jitter": 1.5}, "jitter: "),
    ({"jitter": True}, "jitter: "),
    ({"max_age": 0}, "max_age: "),
    ({"max_age": 3155760001}, "max_age: "),
    ({"backoff": "fibonacci"}, "backoff: "),
    ({"retry_on": "builtins.ValueError"}, "retry_on: "),
    ({"retry_on": [""]}, "retry_on: "),
    ({"fail_on": ["x"] * 33}, "fail_on: "),
    ({"bsae": 1}, 'unknown key "bsae"'),
    ([1], "must be a JSON object"),
]


@pytest.mark.parametrize(("policy", "message"), BAD_POLICIES)
def test_sql_producers_are_refused_a_bad_policy(policy: Any, message: str) -> None:
    with pg() as conn:
        metadata = json.dumps({"awa:retry": policy})
        calls = [
            (
                "SELECT * FROM awa.enqueue_one_v2('k', 'r', 0, %s, 5, p_metadata => %s::jsonb)",
                ['{"args": [], "kwargs": {}}', metadata],
            ),
            (
                "SELECT * FROM awa.enqueue_one_v2('k', 'r', 0, %s, 5, p_delay => 60, "
                "p_metadata => %s::jsonb)",
                ['{"args": [], "kwargs": {}}', metadata],
            ),
            (
                "SELECT * FROM awa.enqueue_v1(%s::jsonb)",
                [json.dumps([{"kind": "k", "queue": "r", "metadata": {"awa:retry": policy}}])],
            ),
        ]
        for sql, params in calls:
            with pytest.raises(psycopg.errors.InvalidParameterValue) as caught:
                conn.execute(sql, params)
            assert str(caught.value.diag.message_primary).startswith(
                f"metadata: awa:retry: {message}"
            ), caught.value
        row = conn.execute(
            "SELECT (SELECT count(*) FROM awa.ready_entries) + "
            "(SELECT count(*) FROM awa.deferred_jobs)"
        ).fetchone()
        assert row == (0,)


# Policies with numbers past double precision or a tiny base ---------------------------------------


@pytest.mark.parametrize("number", ["1e-400", "-1e-400", "1." + "0" * 5000 + "1"])
def test_a_number_beyond_double_precision_never_poisons_a_retry_path(number: str) -> None:
    with pg() as conn:
        for field in ("base", "cap", "jitter", "max_age"):
            policy = f'{{"backoff": "constant", "{field}": {number}}}'
            (wait,) = conn.execute("SELECT awa._backoff_v2(1, 1.0, %s::jsonb)", [policy]).fetchone()
            assert 0 <= wait <= 86400, (field, wait)


def test_a_raw_sql_policy_with_a_tiny_base_is_rescued_like_any_job() -> None:
    with pg() as conn:
        body = {"kind": "k", "queue": "r", "max_attempts": 3, "metadata": {"awa:retry": {}}}
        text = json.dumps([body, {"kind": "k", "queue": "r"}]).replace(
            '"awa:retry": {}', '"awa:retry": {"backoff": "constant", "base": 1e-400}'
        )
        ids = [job_id for job_id, _ in enqueue_sql(conn, text)]
        storage.claim(conn, "r", 2, WORKER)
        rescued = conn.execute("SELECT job_id FROM awa.rescue_v1(0)").fetchall()
        assert sorted(r[0] for r in rescued) == sorted(ids)
        for job_id in ids:
            state = job_state(conn, job_id)
            assert state is not None and state["state"] == "retryable"
