"""The storage engine under faults: bounded values, idempotent parks, early callbacks, isolation,
lock key spaces, rotation on the database clock, fair promotion, drains and lane cursors.

Each test is named after the invariant it proves, and feeds the engine what a careless or
malicious caller could: values at and past their bounds, calls at the wrong isolation or in
the wrong order, concurrent writers.
"""

from __future__ import annotations

import json
import threading
import uuid
from typing import Any

import psycopg
import pytest
from psycopg import errors

from awa_django.db import storage
from awa_django.db.bulk import copy_enqueue
from awa_django.db.storage import Finalization
from awa_django.types import JobRequest
from tests.support.awa_schema import job_state
from tests.support.database import conninfo, pg
from tests.support.factories import WORKER, enqueue_sql

pytestmark = [
    pytest.mark.storage,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("clean_awa"),
]

ARGS = '{"args": [], "kwargs": {}}'


def scalar(conn: psycopg.Connection[Any], sql: str, *params: Any) -> Any:
    row = conn.execute(sql, list(params)).fetchone()
    return None if row is None else row[0]


def one(conn: psycopg.Connection[Any], queue: str = "f", **extra: Any) -> int:
    [(job_id, _)] = enqueue_sql(conn, json.dumps([{"kind": "k", "queue": queue, **extra}]))
    return job_id


def shards(conn: psycopg.Connection[Any], queue: str, n: int = 1) -> list[int]:
    conn.execute("SELECT awa.ensure_lanes_v1(%s, 0, %s)", [queue, n])
    return [
        r[0]
        for r in conn.execute(
            "SELECT lane_id FROM awa.queue_lanes WHERE queue = %s ORDER BY shard", [queue]
        )
    ]


def wait_item(c: storage.ClaimedJob, callback_id: uuid.UUID, timeout: float = 60) -> Finalization:
    return Finalization(
        c.job_id, c.run_lease, c.claim_slot, "wait", callback_id=callback_id, timeout=timeout
    )


# Bounded values ----------------------------------------------------------------------------------


def test_raw_sql_producers_cannot_store_unbounded_deadlines_or_delays() -> None:
    with pg() as conn:
        for sql, params in [
            ("SELECT awa.enqueue_one_v1('k', 'f', 0, %s::jsonb, 1, NULL, NULL, 1e300)", [ARGS]),
            ("SELECT awa.enqueue_one_v1('k', 'f', 0, %s::jsonb, 1, NULL, 1e300)", [ARGS]),
            ("SELECT awa.enqueue_one_v1('k', 'f', 0, %s::jsonb, 1, 'infinity')", [ARGS]),
            ("SELECT awa.enqueue_one_v1('k', 'f', 0, %s::jsonb, 1, NULL, 'NaN')", [ARGS]),
            ('SELECT * FROM awa.enqueue_v1(\'[{"kind": "k", "delay": 1e300}]\')', []),
            ('SELECT * FROM awa.enqueue_v1(\'[{"kind": "k", "deadline": 1e300}]\')', []),
            ('SELECT * FROM awa.enqueue_v1(\'[{"kind": "k"}, 5]\')', []),
        ]:
            with pytest.raises(errors.InvalidParameterValue):
                conn.execute(sql, params)
        assert scalar(conn, "SELECT count(*) FROM awa.jobs") == 0


def test_a_huge_stored_deadline_cannot_poison_claims_of_its_queue() -> None:
    # The COPY path (like any raw-SQL writer of old rows) bypasses the SQL validation: the claim
    # must still work for the whole queue and bound the deadline it hands out.
    request = JobRequest("k", "poison", 0, "default", 3, ARGS, deadline=1e300)
    with pg() as conn:
        shards(conn, "poison")
        with conn.cursor() as cur:
            [bad] = copy_enqueue(cur, [request])
        good = one(conn, "poison")
        claimed = storage.claim(conn, "poison", 10, WORKER)
    assert [c.job_id for c in claimed] == [bad, good]
    assert claimed[0].timeout_secs == 3155760000
    assert claimed[0].deadline_at is not None


def test_a_finalize_batch_with_an_unbounded_value_writes_nothing_and_names_the_item() -> None:
    with pg() as conn:
        a, b = one(conn), one(conn)
        ca, cb = storage.claim(conn, "f", 2, WORKER)
        items = [
            json.dumps({"id": c.job_id, "lease": c.run_lease, "slot": c.claim_slot, **extra})
            for c, extra in (
                (ca, {"outcome": "completed", "result": 1}),
                (cb, {"outcome": "retry", "delay": 1e300}),
            )
        ]
        with pytest.raises(errors.InvalidParameterValue, match=rf"item 1 \(job {b}\): delay"):
            conn.execute("SELECT * FROM awa.finalize_v1(%s::jsonb)", ["[" + ",".join(items) + "]"])
        assert job_state(conn, a)["state"] == "running"  # type: ignore[index]


# Parks and callbacks -----------------------------------------------------------------------------


def test_a_resent_park_is_idempotent_and_leaves_its_batch_intact() -> None:
    with pg() as conn:
        a, b = one(conn), one(conn)
        ca, cb = storage.claim(conn, "f", 2, WORKER)
        callback = uuid.uuid4()
        batch = [
            wait_item(ca, callback),
            Finalization(cb.job_id, cb.run_lease, cb.claim_slot, "completed", result_json="2"),
        ]
        assert storage.finalize(conn, batch) == []
        # The same batch again, as after a reconnect that lost the first reply.
        assert storage.finalize(conn, batch) == [(cb.job_id, cb.run_lease)]
        assert job_state(conn, a)["state"] == "waiting_external"  # type: ignore[index]
        assert job_state(conn, b)["state"] == "completed"  # type: ignore[index]
        assert scalar(conn, "SELECT count(*) FROM awa.leases WHERE job_id = %s", a) == 1
        assert (
            scalar(conn, "SELECT outcome FROM awa.callback_resolve_v2(%s, '7')", callback)
            == "resolved"
        )
        assert job_state(conn, a)["result"] == 7  # type: ignore[index]


@pytest.mark.parametrize(
    ("error", "state", "in_dlq"),
    [(None, "completed", False), ('{"message": "no"}', "retryable", False)],
)
def test_a_callback_resolved_before_its_attempt_parks_is_applied_by_the_park(
    error: str | None, state: str, in_dlq: bool
) -> None:
    with pg() as conn:
        job_id = one(conn, max_attempts=3)
        [c] = storage.claim(conn, "f", 1, WORKER)
        callback = uuid.uuid4()
        assert (
            scalar(
                conn, "SELECT awa.callback_register_v1(%s, %s, %s)", c.job_id, c.run_lease, callback
            )
            is True
        )
        outcome = scalar(
            conn,
            "SELECT outcome FROM awa.callback_resolve_v2(%s, '\"early\"', %s::jsonb)",
            callback,
            error,
        )
        assert outcome == "accepted"  # kept for the park
        assert job_state(conn, job_id)["state"] == "running"  # type: ignore[index]
        # A second resolution of the same callback is refused (the first one is kept).
        assert (
            scalar(conn, "SELECT outcome FROM awa.callback_resolve_v2(%s, '1')", callback)
            == "stale"
        )
        assert storage.finalize(conn, [wait_item(c, callback)]) == []
        job = job_state(conn, job_id)
        assert job is not None
        assert (job["state"], job["in_dlq"]) == (state, in_dlq)
        if error is None:
            assert job["result"] == "early"
        # Its lease records the callback (closed with the attempt); nothing waits.
        assert (
            scalar(conn, "SELECT count(*) FROM awa.live_jobs WHERE state = 'waiting_external'") == 0
        )
        assert scalar(conn, "SELECT count(*) FROM awa.attempt_state") == 0


def test_a_callback_resolution_racing_the_park_is_never_lost() -> None:
    rounds = 25
    with pg() as conn:
        ids = [one(conn) for _ in range(rounds)]
        claimed = storage.claim(conn, "f", rounds, WORKER)
    callbacks = [uuid.uuid4() for _ in claimed]
    with pg() as conn:
        for c, cb in zip(claimed, callbacks, strict=True):
            conn.execute("SELECT awa.callback_register_v1(%s, %s, %s)", [c.job_id, c.run_lease, cb])
    outcomes: dict[int, str] = {}

    def park(c: storage.ClaimedJob, cb: uuid.UUID) -> None:
        with pg() as conn:
            storage.finalize(conn, [wait_item(c, cb)])

    def resolve(c: storage.ClaimedJob, cb: uuid.UUID) -> None:
        with pg() as conn:
            outcomes[c.job_id] = scalar(
                conn, "SELECT outcome FROM awa.callback_resolve_v2(%s, '1')", cb
            )

    for c, cb in zip(claimed, callbacks, strict=True):
        threads = [threading.Thread(target=f, args=(c, cb)) for f in (resolve, park)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    with pg() as conn:
        states = dict(
            conn.execute("SELECT id, state FROM awa.jobs WHERE id = ANY(%s)", [ids]).fetchall()
        )
    # Applied at once, or kept for the park and applied by it: never lost.
    assert set(outcomes.values()) <= {"resolved", "accepted"}
    assert set(states.values()) == {"completed"}


def test_a_callback_of_a_closed_attempt_cannot_be_registered() -> None:
    with pg() as conn:
        one(conn)
        [c] = storage.claim(conn, "f", 1, WORKER)
        storage.finalize(conn, [Finalization(c.job_id, c.run_lease, c.claim_slot, "completed")])
        assert (
            scalar(
                conn,
                "SELECT awa.callback_register_v1(%s, %s, %s)",
                c.job_id,
                c.run_lease,
                uuid.uuid4(),
            )
            is False
        )
        assert scalar(conn, "SELECT count(*) FROM awa.attempt_state") == 0


# Isolation ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT awa.cancel_v1(%(id)s)",
        "SELECT outcome FROM awa.callback_resolve_v2(gen_random_uuid(), '1')",
        "SELECT * FROM awa.finalize_v1('[]')",
        "SELECT * FROM awa.rescue_v1(60)",
        "SELECT awa.prune_v1('claim')",
    ],
)
def test_functions_that_need_fresh_snapshots_refuse_repeatable_read(sql: str) -> None:
    with pg() as setup:
        job_id = one(setup)
    with pg(autocommit=False) as conn:
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        with pytest.raises(errors.InvalidTransactionState, match="READ COMMITTED"):
            conn.execute(sql, {"id": job_id})
        conn.rollback()
    with pg() as conn:
        assert job_state(conn, job_id)["state"] == "available"  # type: ignore[index]


# Lock key spaces ---------------------------------------------------------------------------------


def test_open_producer_transactions_on_the_first_lanes_do_not_block_ring_maintenance() -> None:
    with pg() as conn:
        one(conn)
        storage.claim(conn, "f", 1, WORKER)
    with pg(autocommit=False) as producers:
        # What open producer transactions on lanes 1, 2 and 3 hold (ATOMIC_REQUESTS traffic).
        producers.execute("SELECT pg_advisory_xact_lock(4282177, k) FROM generate_series(1, 3) k")
        with pg() as conn:
            assert scalar(conn, "SELECT awa.rotate_v2('claim')") == "rotated"
            assert scalar(conn, "SELECT awa.rotate_v2('queue')") == "rotated"
            for ring in ("queue", "claim", "lease"):
                assert scalar(conn, "SELECT awa.prune_v1(%s)", ring) != "skipped_locked"
        producers.rollback()


# Rotation ----------------------------------------------------------------------------------------


def test_rotation_keeps_its_cadence_on_the_database_clock() -> None:
    with pg() as conn:
        one(conn)
        assert scalar(conn, "SELECT awa.rotate_v2('queue', 3600)") == "skipped_recent"
        conn.execute("UPDATE awa.ring_rotations SET rotated_at = now() - interval '2 hours'")
        assert scalar(conn, "SELECT awa.rotate_v2('queue', 3600)") == "rotated"
        one(conn)
        # A new leader (or a cron run of awa_maintenance --once) asks again at once.
        assert scalar(conn, "SELECT awa.rotate_v2('queue', 3600)") == "skipped_recent"
        assert scalar(conn, "SELECT generation FROM awa.ring_state WHERE ring = 'queue'") == 1


# Promotion ---------------------------------------------------------------------------------------


def test_promotion_of_a_queue_is_not_stalled_by_the_busy_lanes_of_another() -> None:
    with pg() as conn:
        busy = shards(conn, "busy", 2)
        shards(conn, "free", 1)
        enqueue_sql(conn, json.dumps([{"kind": "k", "queue": "busy", "delay": 60}] * 50))
        [(free_id, _)] = enqueue_sql(
            conn, json.dumps([{"kind": "k", "queue": "free", "delay": 60}])
        )
        conn.execute("""UPDATE awa.deferred_jobs
                        SET run_at = now() - CASE WHEN queue = 'busy' THEN interval '2 seconds'
                                                  ELSE interval '1 second' END""")
    with pg(autocommit=False) as producers:
        producers.execute(
            "SELECT pg_advisory_xact_lock(4282177, k) FROM unnest(%s::int[]) k", [busy]
        )
        with pg() as conn:
            assert scalar(conn, "SELECT awa.promote_v1(50)") == 1
            assert job_state(conn, free_id)["state"] == "available"  # type: ignore[index]
        producers.rollback()
    with pg() as conn:
        assert scalar(conn, "SELECT awa.promote_v1(50)") == 50


# Drains and lane cursors -------------------------------------------------------------------------


def test_a_drain_runs_in_short_batches_and_moves_the_cursor_past_what_it_cancelled() -> None:
    with pg() as conn:
        shards(conn, "d", 2)
        enqueue_sql(conn, json.dumps([{"kind": "k", "queue": "d"}] * 2500))
        enqueue_sql(conn, json.dumps([{"kind": "k", "queue": "d", "delay": 60}] * 10))
        batches = []
        while True:
            batches.append(scalar(conn, "SELECT awa.queue_drain_v2('d', 1000)"))
            if batches[-1] < 1000:
                break
        assert batches == [1000, 1000, 510]
        assert storage.queue_depth(conn, "d") == {"d": 0}
        assert scalar(conn, "SELECT count(*) FROM awa.jobs WHERE state = 'cancelled'") == 2510
        later = one(conn, "d")
        assert [c.job_id for c in storage.claim(conn, "d", 10, WORKER)] == [later]


def test_cancelling_the_head_of_a_lane_moves_its_cursor() -> None:
    with pg() as conn:
        shards(conn, "h", 1)
        first, second, third = one(conn, "h"), one(conn, "h"), one(conn, "h")
        assert scalar(conn, "SELECT awa.cancel_v1(%s)", first) == "available"
        assert scalar(conn, "SELECT awa.cancel_v1(%s)", second) == "available"
        assert storage.queue_depth(conn, "h") == {"h": 1}
        assert [c.job_id for c in storage.claim(conn, "h", 10, WORKER)] == [third]


def test_pruning_a_claim_slot_keeps_lane_cursors_without_updating_rows() -> None:
    with pg() as conn:
        shards(conn, "a", 1)
        shards(conn, "b", 1)
        a1, a2, a3 = one(conn, "a"), one(conn, "a"), one(conn, "a")
        claimed = storage.claim(conn, "a", 2, WORKER)
        assert [c.job_id for c in claimed] == [a1, a2]
        storage.finalize(
            conn, [Finalization(c.job_id, c.run_lease, c.claim_slot, "completed") for c in claimed]
        )
        # Fill and rotate the claim ring until the slot holding queue a's claims is pruned.
        pruned = False
        for _ in range(10):
            one(conn, "b")
            [c] = storage.claim(conn, "b", 1, WORKER)
            storage.finalize(conn, [Finalization(c.job_id, c.run_lease, c.claim_slot, "completed")])
            conn.execute("SELECT awa.rotate_v2('claim')")
            if scalar(conn, "SELECT awa.prune_v1('claim')") == "pruned":
                pruned = True
                break
        assert pruned
        assert scalar(conn, "SELECT count(*) FROM awa.claims WHERE job_id IN (%s, %s)", a1, a2) == 0
        # The cursor survived the truncation: a1 and a2 are never claimed again.
        assert [c.job_id for c in storage.claim(conn, "a", 10, WORKER)] == [a3]
        assert scalar(conn, "SELECT count(*) FROM awa.lane_floors") == 0


# Producers read the ring slot under the lane lock -------------------------------------------------


@pytest.mark.parametrize("path", ["enqueue_v1", "reserve_v1"])
def test_a_producer_that_waited_for_its_lane_writes_into_the_current_ring_slot(path: str) -> None:
    with pg() as conn:
        shards(conn, "r", 1)
        one(conn, "other")  # the current slot holds something, so the ring can rotate
    done = threading.Event()
    written: list[int] = []

    def producer() -> None:
        with pg() as conn:
            if path == "enqueue_v1":
                written.extend(
                    i for i, _ in enqueue_sql(conn, json.dumps([{"kind": "k", "queue": "r"}] * 2))
                )
            else:
                with conn.transaction(), conn.cursor() as cur:
                    written.extend(copy_enqueue(cur, [JobRequest("k", "r", 0, "default", 1, ARGS)]))
        done.set()

    with pg(autocommit=False) as holder:
        holder.execute("SELECT * FROM awa.enqueue_one_v1('k', 'r', 0, %s::jsonb, 1)", [ARGS])
        thread = threading.Thread(target=producer)
        thread.start()
        assert not done.wait(0.3)  # it waits for the lane lock
        with pg() as conn:
            assert scalar(conn, "SELECT awa.rotate_v2('queue')") == "rotated"
        holder.commit()
    thread.join(10)
    with pg() as conn:
        generations = {
            r[0]
            for r in conn.execute(
                "SELECT ready_generation FROM awa.ready_entries WHERE job_id = ANY(%s)", [written]
            )
        }
    assert generations == {1}


# Early callback resolutions, burst workers on paused queues, stopped leaders ----------------------


def test_a_second_resolution_of_an_early_resolved_callback_is_stale() -> None:
    with pg() as conn:
        one(conn)
        [c] = storage.claim(conn, "f", 1, WORKER)
        callback = uuid.uuid4()
        conn.execute(
            "SELECT awa.callback_register_v1(%s, %s, %s)", [c.job_id, c.run_lease, callback]
        )
        assert (
            scalar(conn, "SELECT outcome FROM awa.callback_resolve_v2(%s, '1')", callback)
            == "accepted"
        )
        storage.finalize(conn, [wait_item(c, callback)])
        assert job_state(conn, c.job_id)["state"] == "completed"  # type: ignore[index]
        assert (
            scalar(conn, "SELECT outcome FROM awa.callback_resolve_v2(%s, '2')", callback)
            == "stale"
        )
        assert (
            scalar(conn, "SELECT outcome FROM awa.callback_resolve_v2(%s, '2')", uuid.uuid4())
            == "unknown"
        )


def test_a_burst_worker_does_not_wait_for_a_paused_queue() -> None:
    with pg() as conn:
        one(conn, "held")
        assert scalar(conn, "SELECT awa.queues_idle_v2(ARRAY['held'])") is False
        conn.execute("SELECT awa.queue_pause_v1('held', true)")
        assert scalar(conn, "SELECT awa.queues_idle_v2(ARRAY['held'])") is True


@pytest.mark.parametrize(
    ("app", "seen", "action"),
    [
        ("awa:worker:{id}", "now()", "alive"),
        ("awa:worker:{id}", "now() - interval '1 hour'", "terminated"),
        ("awa:worker:{id}", None, "terminated"),
        ("psql", None, "foreign"),
    ],
)
def test_a_leader_whose_process_stopped_running_is_ended_and_no_other_session(
    app: str, seen: str | None, action: str
) -> None:
    instance = uuid.uuid4()
    with pg() as conn:
        if seen is not None:
            conn.execute(
                f"INSERT INTO awa.runtime_instances (instance_id, hostname, pid, last_seen_at) "
                f"VALUES (%s, 'h', 1, {seen})",
                [instance],
            )
    holder = psycopg.connect(conninfo(), autocommit=True, application_name=app.format(id=instance))
    try:
        assert scalar(holder, "SELECT pg_try_advisory_lock(4708303813012965710)") is True
        with pg() as conn:
            rows = conn.execute("SELECT pid, action FROM awa.leader_takeover_v1(60)").fetchall()
            assert rows == [(holder.info.backend_pid, action)]
            if action == "terminated":
                # The lock is free for a live process.
                def free() -> bool:
                    return bool(scalar(conn, "SELECT pg_try_advisory_lock(4708303813012965710)"))

                from tests.support.polling import wait_for

                wait_for(free, timeout=5)
    finally:
        holder.close()
