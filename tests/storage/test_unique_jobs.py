"""Unique jobs: one job per key across racing producers, released when the holder stops
blocking, kept across retries, snoozes and rescue, re-taken by a DLQ retry."""

from __future__ import annotations

import json
import math
import threading
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from django.db import connection, transaction

import awa_django
from awa_django import DuplicateJobError, InvalidOptionError, IsolationLevelError
from awa_django.db import storage
from awa_django.db.storage import Finalization
from tests.jobs import common as testjobs
from tests.jobs import worker_env
from tests.support.database import PGBOUNCER, pg
from tests.support.factories import WORKER
from tests.support.polling import wait_for

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("clean_awa"),
    pytest.mark.pooler,
]

uniq = testjobs.unique_noop


def keys() -> list[tuple[Any, ...]]:
    with pg() as conn:
        return conn.execute(
            "SELECT job_id, kind, key_text, states FROM awa.unique_keys ORDER BY job_id"
        ).fetchall()


def state_of(job_id: int) -> str | None:
    with pg() as conn:
        row = conn.execute("SELECT state FROM awa._job_brief_v1(%s)", [job_id]).fetchone()
    return None if row is None else row[0]


def finish(conn: psycopg.Connection[Any], outcome: str, **kw: Any) -> int:
    [claimed] = storage.claim(conn, "uniq", 1, WORKER)
    storage.finalize(
        conn, [Finalization(claimed.job_id, claimed.run_lease, claimed.claim_slot, outcome, **kw)]
    )
    return claimed.job_id


def test_a_duplicate_returns_the_holder_and_writes_nothing() -> None:
    first = uniq.enqueue(1)
    again = uniq.enqueue(1)
    other = uniq.enqueue(2)
    assert not first.duplicate and again.duplicate and not other.duplicate
    assert again.id == first.id and again.state == "available" and again.queue == "uniq"
    with pg() as conn:
        assert conn.execute("SELECT count(*) FROM awa.jobs").fetchone() == (2,)
        meta = conn.execute("SELECT metadata FROM awa.jobs WHERE id = %s", [first.id]).fetchone()
    spec = meta[0]["awa:unique"]
    assert spec == {
        "key": None,
        "states": list(awa_django.unique.DEFAULT_UNIQUE_STATES),
        "for": None,
    }


def test_keys_are_per_kind_and_explicit_keys_ignore_the_arguments() -> None:
    a = testjobs.noop.using(unique_key="customer:42").enqueue()
    b = testjobs.noop.using(unique_key="customer:42").enqueue()
    c = testjobs.send_email.using(unique_key="customer:42").enqueue("x@example.com")
    d = uniq.using(unique_key="k").enqueue(1)
    e = uniq.using(unique_key="k").enqueue(2)
    assert b.duplicate and b.id == a.id
    assert not c.duplicate and c.queue == "emails"
    assert e.duplicate and e.id == d.id


@pytest.mark.skipif(
    PGBOUNCER,
    reason="8 producers whose transactions each open a second connection for the new queue's "
    "lanes: more than the pooler's 4 server connections can serve (docs/deployment.md)",
)
def test_racing_producers_in_separate_transactions_get_one_job() -> None:
    threads, per_thread = 8, 5
    results: list[awa_django.EnqueuedJob] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(threads)
    lock = threading.Lock()

    def produce() -> None:
        from django.db import connection as own

        try:
            barrier.wait()
            for _ in range(per_thread):
                with transaction.atomic():
                    handle = uniq.enqueue(7)
                with lock:
                    results.append(handle)
        except BaseException as exc:
            errors.append(exc)
        finally:
            own.close()

    workers = [threading.Thread(target=produce) for _ in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join(timeout=60)
    assert not errors, errors
    assert len(results) == threads * per_thread
    assert len({r.id for r in results}) == 1
    assert sum(not r.duplicate for r in results) == 1
    with pg() as conn:
        assert conn.execute("SELECT count(*) FROM awa.jobs").fetchone() == (1,)


def test_a_producer_waits_for_an_open_transaction_holding_the_key() -> None:
    holder_started = threading.Event()
    release = threading.Event()
    outcome: dict[str, Any] = {}

    def hold(commit: bool) -> None:
        from django.db import connection as own

        try:
            with transaction.atomic():
                outcome["held"] = uniq.enqueue(9)
                holder_started.set()
                release.wait(10)
                if not commit:
                    transaction.set_rollback(True)
        finally:
            own.close()

    for commit in (False, True):
        holder_started.clear()
        release.clear()
        with pg() as conn:
            conn.execute("TRUNCATE awa.unique_keys")
        t = threading.Thread(target=hold, args=(commit,))
        t.start()
        assert holder_started.wait(10)
        got: dict[str, Any] = {}

        def second(got: dict[str, Any] = got) -> None:
            from django.db import connection as own

            try:
                got["handle"] = uniq.enqueue(9)
            finally:
                own.close()

        s = threading.Thread(target=second)
        s.start()
        s.join(0.5)
        assert s.is_alive(), "the second producer must wait for the open transaction"
        release.set()
        t.join(10)
        s.join(10)
        if commit:
            assert got["handle"].duplicate and got["handle"].id == outcome["held"].id
        else:  # rolled back: the key was never held
            assert not got["handle"].duplicate


def test_rollback_releases_the_key() -> None:
    with pytest.raises(RuntimeError), transaction.atomic():
        uniq.enqueue(3)
        raise RuntimeError("rollback")
    assert keys() == []
    assert not uniq.enqueue(3).duplicate


@pytest.mark.parametrize(
    ("outcome", "kw", "blocks"),
    [
        ("completed", {}, False),
        ("fail", {"error": {"type": "E", "message": "x"}}, False),  # dead-lettered
        ("cancel", {}, False),
        ("retry", {"error": {"type": "E", "message": "x"}}, True),  # retryable: kept
        ("snooze", {"delay": 60.0}, True),  # scheduled: kept
    ],
)
def test_scope_follows_the_holders_state(outcome: str, kw: dict[str, Any], blocks: bool) -> None:
    first = testjobs.unique_noop.using(max_attempts=3).enqueue(4)
    with pg() as conn:
        assert finish(conn, outcome, **kw) == first.id
    again = testjobs.unique_noop.using(max_attempts=3).enqueue(4)
    assert again.duplicate is blocks
    if blocks:
        assert again.id == first.id and again.state in {"retryable", "scheduled"}
    else:
        assert again.id != first.id


def test_a_running_holder_blocks_and_rescue_keeps_the_key() -> None:
    first = uniq.using(max_attempts=3).enqueue(5)
    with pg() as conn:
        [claimed] = storage.claim(conn, "uniq", 1, WORKER)
        assert claimed.job_id == first.id
        assert uniq.enqueue(5).duplicate
        rescued = conn.execute("SELECT job_id FROM awa.rescue_v1(0)").fetchall()
        assert rescued == [(first.id,)]
    again = uniq.enqueue(5)
    assert again.duplicate and again.id == first.id and again.state == "retryable"


def test_unique_states_choose_which_holders_block() -> None:
    queued_only = uniq.using(unique_states=["available", "scheduled"])
    first = queued_only.enqueue(6)
    assert queued_only.enqueue(6).duplicate
    with pg() as conn:
        storage.claim(conn, "uniq", 1, WORKER)  # running: outside the states
    second = queued_only.enqueue(6)
    assert not second.duplicate and second.id != first.id
    # completed in the states: a finished holder keeps blocking
    done_too = testjobs.noop.using(unique_key="once", unique_states=["available", "completed"])
    held = done_too.enqueue()
    with pg() as conn:
        [c] = storage.claim(conn, "default", 1, WORKER)
        storage.finalize(conn, [Finalization(c.job_id, c.run_lease, c.claim_slot, "completed")])
    dup = done_too.enqueue()
    assert dup.duplicate and dup.id == held.id and dup.state == "completed"


def test_unique_for_bounds_the_window() -> None:
    windowed = uniq.using(unique_for=timedelta(milliseconds=300))
    first = windowed.enqueue(8)
    assert windowed.enqueue(8).duplicate

    def fresh() -> awa_django.EnqueuedJob | None:
        handle = windowed.enqueue(8)
        return None if handle.duplicate else handle

    later = wait_for(fresh, timeout=10)
    assert later.id != first.id
    assert state_of(first.id) == "available"  # the old job is untouched


def test_dlq_retry_takes_the_key_again_or_is_refused() -> None:
    first = uniq.using(max_attempts=1).enqueue(10)
    with pg() as conn:
        finish(conn, "fail", error={"type": "E", "message": "x"})
    # Nobody holds the key: the retry takes it, and duplicates are refused again.
    assert awa_django.dlq_retry([first.id]) == [first.id]
    assert uniq.enqueue(10).duplicate
    # Dead-letter it again, let another job take the key, then retry: refused by default.
    with pg() as conn:
        finish(conn, "fail", error={"type": "E", "message": "x"})
    newer = uniq.enqueue(10)
    assert not newer.duplicate
    assert awa_django.dlq_retry([first.id]) == []
    assert state_of(first.id) == "failed"  # still dead-lettered
    assert awa_django.dlq_retry([first.id], on_unique_conflict="run") == [first.id]
    assert state_of(first.id) == "available"
    assert [k[0] for k in keys()] == [newer.id]


def test_enqueue_many_dedupes_inside_one_batch_and_keeps_order() -> None:
    batch = [
        testjobs.noop.prepare(),
        uniq.prepare(1),
        uniq.prepare(2),
        uniq.prepare(1),
        testjobs.noop.prepare(),
    ]
    handles = awa_django.enqueue_many(batch)
    assert [h.duplicate for h in handles] == [False, False, False, True, False]
    assert handles[3].id == handles[1].id
    assert [h.kind for h in handles] == [r.kind for r in batch]
    with pg() as conn:
        assert conn.execute("SELECT count(*) FROM awa.jobs").fetchone() == (4,)


def test_on_conflict_raise_writes_nothing_and_keeps_the_transaction() -> None:
    raising = uniq.using(on_conflict="raise")
    first = raising.enqueue(11)
    with transaction.atomic():
        with pytest.raises(DuplicateJobError) as caught:
            raising.enqueue(11)
        assert caught.value.existing.id == first.id
        testjobs.noop.enqueue()  # the transaction is still usable
    with transaction.atomic():
        with pytest.raises(DuplicateJobError):
            awa_django.enqueue_many([testjobs.noop.prepare(), raising.prepare(11)])
        testjobs.noop.enqueue()
    with pytest.raises(DuplicateJobError):
        awa_django.enqueue_many([testjobs.noop.prepare(), raising.prepare(12), raising.prepare(12)])
    with pg() as conn:
        assert conn.execute("SELECT count(*) FROM awa.jobs").fetchone() == (3,)


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"unique_for": math.nan}, "unique_for"),
        ({"unique_for": 0}, "unique_for"),
        ({"unique_for": -1.0}, "unique_for"),
        ({"unique_for": math.inf}, "unique_for"),
        ({"unique_for": 1e300}, "unique_for"),
        ({"unique_for": timedelta.max}, "unique_for"),
        ({"unique_for": "60"}, "unique_for"),
        ({"unique_states": []}, "unique_states"),
        ({"unique_states": ["avail"]}, "unique_states"),
        ({"unique_states": "available"}, "unique_states"),
        ({"unique_states": [None]}, "unique_states"),
        ({"unique_key": "a\x00b"}, "unique_key"),
        ({"unique_key": "\ud800"}, "unique_key"),
        ({"unique_key": "x" * 10_001}, "unique_key"),
        ({"unique_key": 42}, "unique_key"),
        ({"on_conflict": "ignore"}, "on_conflict"),
        ({"unique": "yes"}, "unique"),
        ({"metadata": {"awa:unique": {}}}, "metadata"),
    ],
)
def test_bad_unique_options_are_refused_with_nothing_written(
    options: dict[str, Any], field: str
) -> None:
    with pytest.raises(InvalidOptionError) as caught:
        testjobs.noop.using(**options).enqueue()
    assert caught.value.field == field
    assert keys() == []


def test_the_sql_function_checks_its_unique_arguments() -> None:
    with pg() as conn:
        for args, message in [
            ("p_unique_for => 'NaN'", "unique_for"),
            ("p_unique_for => 0", "unique_for"),
            ("p_unique_states => '{}'", "unique_states"),
            ("p_unique_states => '{bogus}'", "unique_states"),
            ("p_unique_states => ARRAY[NULL]::text[]", "unique_states"),
            ("p_unique_key => repeat('x', 10001)", "unique_key"),
        ]:
            with pytest.raises(psycopg.errors.InvalidParameterValue, match=message):
                conn.execute(
                    "SELECT * FROM awa.enqueue_one_v3('k', 'q', 0, "
                    f"""'{{"args": [], "kwargs": {{}}}}', 1, p_unique => true, {args})"""
                )
        assert conn.execute("SELECT count(*) FROM awa.unique_keys").fetchone() == (0,)


def test_raw_sql_producers_share_the_default_key() -> None:
    first = uniq.enqueue(13)
    with pg() as conn:
        row = conn.execute(
            "SELECT job_id, duplicate FROM awa.enqueue_one_v3('tests.jobs.common.unique_noop', "
            """'uniq', 0, '{"kwargs": {}, "args": [13]}', 1, p_unique => true)"""
        ).fetchone()
    assert row == (first.id, True)


def test_unique_enqueue_needs_read_committed() -> None:
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        with pytest.raises(IsolationLevelError):
            uniq.enqueue(14)
    assert keys() == []


def test_the_sweep_deletes_released_keys_only() -> None:
    done = uniq.enqueue(20)
    kept = uniq.enqueue(21)
    expired = uniq.using(unique_for=0.001).enqueue(22)
    with pg() as conn:
        [c] = storage.claim(conn, "uniq", 1, WORKER)
        assert c.job_id == done.id
        storage.finalize(conn, [Finalization(c.job_id, c.run_lease, c.claim_slot, "completed")])
        wait_for(
            lambda: conn.execute(
                "SELECT clock_timestamp() > expires_at FROM awa.unique_keys WHERE job_id = %s",
                [expired.id],
            ).fetchone()[0],
            timeout=5,
        )
        deleted, after_taken, after_key = conn.execute(
            "SELECT * FROM awa.unique_sweep_v1(NULL, NULL, 2)"
        ).fetchone()
        assert deleted == 1 and after_taken is not None  # a full page: go on from there
        deleted, after_taken, after_key = conn.execute(
            "SELECT * FROM awa.unique_sweep_v1(%s, %s, 2)", [after_taken, after_key]
        ).fetchone()
        assert deleted == 1 and after_taken is None  # the end
    assert [k[0] for k in keys()] == [kept.id]


@pytest.mark.worker
@pytest.mark.skipif(
    PGBOUNCER, reason="its worker (the maintenance leader) would connect through the pooler"
)
def test_the_leader_sweeps_released_keys(manage_py: Any) -> None:
    released = [uniq.enqueue(n) for n in range(30, 40)]
    kept = uniq.enqueue(40)
    with pg() as conn:
        claimed = storage.claim(conn, "uniq", 10, WORKER)
        assert sorted(c.job_id for c in claimed) == [h.id for h in released]
        storage.finalize(
            conn, [Finalization(c.job_id, c.run_lease, c.claim_slot, "completed") for c in claimed]
        )
    assert len(keys()) == 11
    overrides = {"UNIQUE_SWEEP_INTERVAL": 0.2}
    proc = manage_py("awa_maintenance", extra_env=worker_env(**overrides))
    wait_for(
        lambda: [k[0] for k in keys()] == [kept.id],
        timeout=30,
        message=lambda: f"the sweep of released keys:\n{proc.output()}",
    )
    assert uniq.enqueue(40).duplicate


def test_awa_dlq_retry_reports_a_refused_unique_job_and_can_run_it() -> None:
    from io import StringIO

    from django.core.management import call_command

    first = uniq.using(max_attempts=1).enqueue(50)
    with pg() as conn:
        finish(conn, "fail", error={"type": "E", "message": "x"})
    uniq.enqueue(50)  # another job takes the key
    out, err = StringIO(), StringIO()
    call_command("awa_dlq", "retry", str(first.id), stdout=out, stderr=err)
    assert "retried 0 job(s)" in out.getvalue()
    assert "--unique-conflict run" in err.getvalue() and str(first.id) in err.getvalue()
    call_command(
        "awa_dlq", "retry", str(first.id), "--unique-conflict", "run", stdout=out, stderr=err
    )
    assert "retried 1 job(s)" in out.getvalue()
    assert state_of(first.id) == "available"


def test_the_holder_lookup_agrees_with_the_jobs_view_in_every_state() -> None:
    """awa._job_brief_v1 (the lookup behind every conflict) reads the planes by job id; it must
    say what awa.jobs says, for jobs in every state, a job whose earlier attempt left a ready
    row below the lane cursor included."""
    import uuid as uuid_mod

    def claim(queue: str) -> storage.ClaimedJob:
        with pg() as conn:
            [c] = storage.claim(conn, queue, 1, WORKER)
        return c

    def fin(c: storage.ClaimedJob, outcome: str, **kw: Any) -> None:
        with pg() as conn:
            storage.finalize(
                conn, [Finalization(c.job_id, c.run_lease, c.claim_slot, outcome, **kw)]
            )

    err = {"type": "E", "message": "x"}
    ids = [testjobs.noop.using(queue=f"s{i}", max_attempts=2).enqueue().id for i in range(9)]
    scheduled = testjobs.noop.using(run_after=timedelta(hours=1)).enqueue().id
    fin(claim("s1"), "completed")
    claim("s2")  # running
    fin(claim("s3"), "retry", error=err)  # retryable
    fin(claim("s4"), "snooze", delay=60.0)  # scheduled
    c5 = claim("s5")
    fin(c5, "retry", error=err)
    with pg() as conn:  # the retry runs again: its first ready row is now an earlier attempt
        conn.execute("UPDATE awa.deferred_jobs SET run_at = now() - interval '1 s'")
        conn.execute("SELECT awa.promote_v1()")
    fin(claim("s5"), "fail", error=err)  # dead-lettered after two attempts
    fin(claim("s6"), "wait", callback_id=uuid_mod.uuid4(), timeout=600.0)  # waiting_external
    fin(claim("s7"), "cancel")
    with pg() as conn:
        conn.execute("SELECT awa.cancel_v1(%s)", [ids[8]])  # cancelled before any claim
        rows = conn.execute(
            "SELECT j.id, j.state, j.queue, j.priority, b.state, b.queue, b.priority "
            "FROM awa.jobs j CROSS JOIN LATERAL awa._job_brief_v1(j.id) b ORDER BY j.id"
        ).fetchall()
        missing = conn.execute("SELECT count(*) FROM awa._job_brief_v1(-1)").fetchone()
    assert {r[0] for r in rows} == {*ids, scheduled}
    assert all(r[1:4] == r[4:7] for r in rows), rows
    assert missing == (0,)


def test_a_batch_at_another_isolation_level_writes_nothing_and_keeps_the_transaction() -> None:
    testjobs.noop.enqueue()  # the lanes exist before the REPEATABLE READ snapshot
    uniq.enqueue(99)
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        with pytest.raises(IsolationLevelError):
            awa_django.enqueue_many([testjobs.noop.prepare(), uniq.prepare(15)])
        testjobs.noop.enqueue()  # still usable
    with pg() as conn:
        assert conn.execute("SELECT count(*) FROM awa.jobs").fetchone() == (3,)
    assert len(keys()) == 1


def test_the_admin_shows_a_jobs_unique_key_escaped_and_its_retry_policy() -> None:
    from tests.support.admin_client import changelist
    from tests.support.factories import HOSTILE, staff

    keyed = testjobs.noop.using(unique_key=HOSTILE, unique_for=60).enqueue()
    plain = testjobs.noop.enqueue()
    client = staff()
    page = client.get(f"{changelist('livejob')}{keyed.id}/change/").content.decode()
    assert "Unique key" in page and HOSTILE not in page
    assert "&lt;script&gt;" in page and "for 60 s" in page
    page = client.get(f"{changelist('livejob')}{plain.id}/change/").content.decode()
    assert "Unique key" in page and "Retry policy" in page
    retried = testjobs.noop.using(
        retry=awa_django.RetryPolicy("linear", base=5, cap=60, retry_on=[KeyError])
    ).enqueue()
    page = client.get(f"{changelist('livejob')}{retried.id}/change/").content.decode()
    assert "linear; base 5; cap 60" in page and "retry_on builtins.KeyError" in page


def test_the_admins_dlq_retry_says_when_a_unique_job_stayed() -> None:
    from tests.support.admin_client import confirmed, messages_of
    from tests.support.factories import staff

    first = uniq.using(max_attempts=1).enqueue(60)
    with pg() as conn:
        finish(conn, "fail", error={"type": "E", "message": "x"})
    uniq.enqueue(60)  # another job holds the key
    client = staff("retry_dlq")
    _, done = confirmed(client, "deadletter", "retry_jobs", [first.id])
    assert any("Retried 0 job(s); 1 stayed in the DLQ" in m for m in messages_of(done))
    assert state_of(first.id) == "failed"


# Unique keys under DLQ retries, the sweep, overlapping batches, hand-written specs ----------------


def dead_letter_unique(n: int, **options: Any) -> int:
    job_id = uniq.using(max_attempts=1, **options).enqueue(n).id
    with pg() as conn:
        assert finish(conn, "fail", error={"type": "E", "message": "x"}) == job_id
    return job_id


def test_one_dlq_retry_of_two_jobs_with_one_key_retries_one() -> None:
    first = dead_letter_unique(70)
    second = dead_letter_unique(70)
    assert awa_django.dlq_retry([first, second]) == [first]
    assert state_of(second) == "failed"
    assert uniq.enqueue(70).id == first
    assert awa_django.dlq_retry([second], on_unique_conflict="run") == [second]


def test_the_sweep_never_waits_for_a_producer_taking_released_keys() -> None:
    a, b = uniq.enqueue(71), uniq.enqueue(72)
    with pg() as conn:
        for _ in range(2):
            finish(conn, "completed")
    with pg(autocommit=False) as producer, pg() as sweeper:
        # The producer takes b's released key over (its row is locked until it commits)...
        producer.execute(
            "SELECT duplicate FROM awa.enqueue_one_v3('tests.jobs.common.unique_noop', 'uniq', 0, "
            """'{"args": [72], "kwargs": {}}', 1, p_unique => true)"""
        )
        sweeper.execute("SET lock_timeout = '2s'")
        # ... and the sweep, which would have deleted both, skips that row instead of waiting.
        deleted, _, _ = sweeper.execute("SELECT * FROM awa.unique_sweep_v1()").fetchone()
        assert deleted == 1
        producer.execute(
            "SELECT duplicate FROM awa.enqueue_one_v3('tests.jobs.common.unique_noop', 'uniq', 0, "
            """'{"args": [71], "kwargs": {}}', 1, p_unique => true)"""
        )
        producer.commit()
    assert len(keys()) == 2 and {k[0] for k in keys()}.isdisjoint({a.id, b.id})


def test_batches_taking_overlapping_keys_in_opposite_orders_both_succeed() -> None:
    numbers = list(range(1000, 1150))
    results: dict[str, list[awa_django.EnqueuedJob]] = {}
    errors: list[BaseException] = []
    barrier = threading.Barrier(2)

    def produce(name: str, order: list[int]) -> None:
        from django.db import connection as own

        try:
            barrier.wait()
            results[name] = awa_django.enqueue_many([uniq.prepare(n) for n in order])
        except BaseException as exc:
            errors.append(exc)
        finally:
            own.close()

    threads = [
        threading.Thread(target=produce, args=("up", numbers)),
        threading.Thread(target=produce, args=("down", numbers[::-1])),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    with pg() as conn:
        assert conn.execute("SELECT count(*) FROM awa.jobs").fetchone() == (len(numbers),)
    up = {h.id for h in results["up"]}
    assert up == {h.id for h in results["down"]} and len(up) == len(numbers)


def test_a_spec_written_by_hand_names_a_key_of_its_own_kind_only() -> None:
    from tests.support.factories import enqueue_sql

    huge = {"key": "shared", "states": ["failed", "available"], "for": 10**400}
    body = {
        "kind": "tests.forger",
        "queue": "uniq",
        "max_attempts": 1,
        "metadata": {"awa:unique": huge},
    }
    with pg() as conn:
        # json cannot write 10**400 as a number: put it in as text, as raw SQL could.
        text = json.dumps([body], default=str).replace('"' + str(10**400) + '"', "1e400")
        [(forged, _)] = enqueue_sql(conn, text)
        finish(conn, "fail", error={"type": "E", "message": "x"})
    assert awa_django.dlq_retry([forged]) == [forged]  # no overflow, no crash
    assert not uniq.using(unique_key="shared").enqueue().duplicate  # another kind: not blocked
    from tests.support.admin_client import changelist
    from tests.support.factories import staff

    page = staff().get(f"{changelist('livejob')}{forged}/change/")
    assert page.status_code == 200


def test_a_duplicate_inside_a_raising_batch_says_so() -> None:
    raising = uniq.using(on_conflict="raise")
    with pytest.raises(DuplicateJobError) as caught:
        awa_django.enqueue_many([raising.prepare(80), raising.prepare(80)])
    assert caught.value.in_batch and "earlier request of the same batch" in str(caught.value)
    assert keys() == []


def test_unique_options_agree_between_python_and_sql() -> None:
    # An explicit key never equals an argument key of the same kind.
    by_args = uniq.enqueue(777)
    by_key = uniq.using(unique_key='{"args": [777], "kwargs": {}}').enqueue(777)
    assert not by_key.duplicate and by_key.id != by_args.id
    with pytest.raises(InvalidOptionError):
        uniq.using(unique=0).enqueue(1)  # type: ignore[arg-type]
    with pg() as conn:
        # unique_for or unique_states alone make a job unique in SQL too.
        for extra in ("p_unique_for => 60", "p_unique_states => '{available}'"):
            rows = [
                conn.execute(
                    "SELECT duplicate FROM awa.enqueue_one_v3('k', 'uniq', 0, "
                    f"""'{{"args": [1], "kwargs": {{}}}}', 1, {extra})"""
                ).fetchone()
                for _ in range(2)
            ]
            assert rows == [(False,), (True,)], extra
            conn.execute("TRUNCATE awa.unique_keys")
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="unique_states"):
            conn.execute(
                "SELECT * FROM awa.enqueue_one_v3('k', 'q', 0, "
                """'{"args": [], "kwargs": {}}', 1, p_unique_states => '{{available}}')"""
            )
