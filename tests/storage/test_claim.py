"""Claim invariants of the storage engine, against real Postgres
(docs/storage.md, "Lanes, enqueue and claim")."""

from __future__ import annotations

import json
import threading
from typing import Any

import psycopg
import pytest

from awa_django.db import storage
from awa_django.db.storage import Finalization
from awa_django.sql import query
from tests.support.database import pg
from tests.support.factories import WORKER, enqueue_sql

pytestmark = [
    pytest.mark.storage,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("clean_awa"),
]


def jobs_json(n: int, queue: str = "q", priority: int = 0, **extra: Any) -> str:
    return json.dumps(
        [
            {
                "kind": "k",
                "queue": queue,
                "priority": priority,
                "args": {"args": [i], "kwargs": {}},
                **extra,
            }
            for i in range(n)
        ]
    )


def claim_ids(
    conn: psycopg.Connection[Any], queue: str = "q", n: int = 100, **kw: Any
) -> list[int]:
    return [j.job_id for j in storage.claim(conn, queue, n, WORKER, **kw)]


def test_fifo_within_a_lane() -> None:
    with pg() as conn:
        ids = [i for i, _ in enqueue_sql(conn, jobs_json(50))]
        assert claim_ids(conn, n=20) == ids[:20]
        assert claim_ids(conn, n=100) == ids[20:]
        assert claim_ids(conn) == []


def test_claim_increments_attempt_and_run_lease() -> None:
    with pg() as conn:
        [(job_id, state)] = enqueue_sql(conn, jobs_json(1))
        assert state == "available"
        [claimed] = storage.claim(conn, "q", 5, WORKER)
        assert (claimed.job_id, claimed.attempt, claimed.run_lease) == (job_id, 1, 1)
        assert json.loads(claimed.args_json) == {"args": [0], "kwargs": {}}
        row = conn.execute(
            "SELECT state, attempt, run_lease FROM awa.jobs WHERE id = %s", [job_id]
        ).fetchone()
        assert row == ("running", 1, 1)


def test_priority_order_across_lanes() -> None:
    with pg() as conn:
        low = [i for i, _ in enqueue_sql(conn, jobs_json(3, priority=-10))]
        mid = [i for i, _ in enqueue_sql(conn, jobs_json(3, priority=0))]
        high = [i for i, _ in enqueue_sql(conn, jobs_json(3, priority=10))]
        # No ageing: strict priority, higher first, FIFO within each priority.
        assert claim_ids(conn, n=9, aging_interval=1e9) == high + mid + low


def test_ageing_lets_an_old_low_priority_lane_through() -> None:
    with pg() as conn:
        [(old_low, _)] = enqueue_sql(conn, jobs_json(1, priority=0))
        conn.execute("SELECT pg_sleep(0.05)")
        [(new_high, _)] = enqueue_sql(conn, jobs_json(1, priority=5))
        # With a 1 ms ageing step the 50 ms old head gains ~50 levels and goes first.
        assert claim_ids(conn, n=1, aging_interval=0.001) == [old_low]
        assert claim_ids(conn, n=1, aging_interval=0.001) == [new_high]


def test_paused_queue_is_not_claimed() -> None:
    with pg() as conn:
        enqueue_sql(conn, jobs_json(2))
        conn.execute("UPDATE awa.queue_meta SET paused = true WHERE queue = 'q'")
        assert claim_ids(conn) == []
        conn.execute("UPDATE awa.queue_meta SET paused = false WHERE queue = 'q'")
        assert len(claim_ids(conn)) == 2


def test_concurrent_claimers_never_claim_twice_and_miss_none() -> None:
    total = 20_000
    producers = 4
    # Producers on separate connections land in different shards (lanes) of one queue.
    with pg() as c0, pg() as c1, pg() as c2, pg() as c3:
        for conn in (c0, c1, c2, c3):
            enqueue_sql(conn, jobs_json(total // producers))
        lanes = c0.execute(
            "SELECT count(DISTINCT lane_id) FROM awa.ready_entries WHERE queue = 'q'"
        ).fetchone()
        assert lanes is not None and lanes[0] >= 2

    claimed: list[list[int]] = [[] for _ in range(4)]
    errors: list[BaseException] = []

    def claimer(index: int) -> None:
        try:
            with pg() as conn:
                empty = 0
                while empty < 3:
                    got = claim_ids(conn, n=97)
                    claimed[index].extend(got)
                    empty = 0 if got else empty + 1
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=claimer, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors
    everything = [job for part in claimed for job in part]
    assert len(everything) == total
    assert len(set(everything)) == total
    with pg() as conn:
        row = conn.execute("SELECT count(*), count(DISTINCT job_id) FROM awa.claims").fetchone()
        assert row == (total, total)


def test_rolled_back_reservation_leaves_a_gap_that_claims_skip() -> None:
    with pg() as conn, pg(autocommit=False) as producer:
        conn.execute("SELECT awa.ensure_lanes_v1('gap', 0, 1)")  # one shard: one lane
        enqueue_sql(producer, jobs_json(3, queue="gap"))
        producer.rollback()
        [(after, _)] = enqueue_sql(conn, jobs_json(1, queue="gap"))
        seqs = conn.execute("SELECT lane_seq FROM awa.ready_entries WHERE queue = 'gap'").fetchall()
        assert seqs == [(4,)]  # positions 1..3 were reserved and rolled back
        assert claim_ids(conn, "gap") == [after]


def test_claims_never_skip_a_row_still_being_committed() -> None:
    with pg() as conn, pg(autocommit=False) as producer:
        conn.execute("SELECT awa.ensure_lanes_v1('inflight', 0, 1)")
        [(first, _)] = enqueue_sql(conn, jobs_json(1, queue="inflight"))
        [(pending, _)] = enqueue_sql(producer, jobs_json(1, queue="inflight"))
        # The in-flight row sits at the end of the lane: it is waited for, not skipped.
        assert claim_ids(conn, "inflight") == [first]
        assert claim_ids(conn, "inflight") == []
        producer.commit()
        assert claim_ids(conn, "inflight") == [pending]


def test_lane_lock_holds_the_next_producer_until_commit() -> None:
    # With one shard, producer B cannot make position N+1 visible while A may still commit N.
    with pg() as conn, pg(autocommit=False) as a, pg(autocommit=False) as b:
        conn.execute("SELECT awa.ensure_lanes_v1('serial', 0, 1)")
        enqueue_sql(a, jobs_json(1, queue="serial"))
        b.execute("SET lock_timeout = '200ms'")
        with pytest.raises(psycopg.errors.LockNotAvailable):
            enqueue_sql(b, jobs_json(1, queue="serial"))
        b.rollback()
        a.commit()
        b.execute("SET lock_timeout = '5s'")
        enqueue_sql(b, jobs_json(1, queue="serial"))
        b.commit()
        assert len(claim_ids(conn, "serial")) == 2


def test_tombstoned_rows_are_skipped_by_claim() -> None:
    with pg() as conn:
        ids = [i for i, _ in enqueue_sql(conn, jobs_json(3))]
        assert conn.execute("SELECT awa.cancel_v1(%s)", [ids[0]]).fetchone() == ("available",)
        assert claim_ids(conn) == ids[1:]


def test_claim_refuses_repeatable_read() -> None:
    with pg(autocommit=False) as conn:
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        with pytest.raises(psycopg.errors.InvalidTransactionState):
            claim_ids(conn)


def test_approximate_depth_follows_lane_cursors() -> None:
    with pg() as conn:
        enqueue_sql(conn, jobs_json(10, queue="depth"))
        assert storage.queue_depth(conn, "depth") == {"depth": 10}
        claim_ids(conn, "depth", n=4)
        assert storage.queue_depth(conn, "depth") == {"depth": 6}


def test_depth_is_zero_on_a_quiet_queue_after_rolled_back_enqueues() -> None:
    """A rolled-back enqueue spends a lane position and writes no row: the depth (and the
    metrics' available, awa.queue_lag_v1) counts the rows, not the positions."""
    with pg() as conn:
        enqueue_sql(conn, jobs_json(2, queue="ghost"))
        claim_ids(conn, "ghost", n=1)
        for _ in range(5):
            with conn.transaction(force_rollback=True):
                enqueue_sql(conn, jobs_json(1, queue="ghost"))
        assert storage.queue_depth(conn, "ghost") == {"ghost": 1}
        lag = conn.execute("SELECT available FROM awa.queue_lag_v1() WHERE queue = 'ghost'")
        assert lag.fetchone() == (1,)
        claim_ids(conn, "ghost", n=1)
        assert storage.queue_depth(conn, "ghost") == {"ghost": 0}
        # One rollback of more positions than the exact count reads, on a quiet queue.
        with conn.transaction(force_rollback=True):
            enqueue_sql(conn, jobs_json(1500, queue="ghost"))
        assert storage.queue_depth(conn, "ghost") == {"ghost": 0}


def test_claims_stay_index_probes_when_statistics_say_the_rings_are_empty() -> None:
    """An ANALYZE of empty ring partitions followed by a backlog: every claim must still read
    the claim ring by index (the lane cursor), so its cost does not grow with jobs claimed."""
    with pg() as conn:
        conn.execute("ANALYZE awa.claims")  # statistics of an empty claim ring
        ids = [i for i, _ in enqueue_sql(conn, jobs_json(600))]
        first = claim_ids(conn, n=300)
        # The cursor lookup of a lane, planned the way the claim runs it.
        conn.execute("SET enable_seqscan = off")
        lane = conn.execute("SELECT min(lane_id) FROM awa.queue_lanes WHERE queue = 'q'")
        lane_id = lane.fetchone()[0]  # type: ignore[index]
        plan = "\n".join(
            row[0]
            for row in conn.execute(
                "EXPLAIN SELECT max(c.lane_seq) FROM awa.claims c WHERE c.lane_id = %s", [lane_id]
            )
        )
        conn.execute("RESET enable_seqscan")
        assert "Seq Scan" not in plan, plan
        configs = dict(
            conn.execute(
                "SELECT proname, proconfig FROM pg_proc"
                " WHERE oid IN ('awa.claim_v3'::regproc, 'awa.finalize_v2'::regproc)"
            ).fetchall()
        )
        assert configs == {
            "claim_v3": [
                "enable_seqscan=off",
                "enable_bitmapscan=off",
                "plan_cache_mode=force_generic_plan",
                "search_path=pg_catalog, pg_temp",
            ],
            "finalize_v2": [
                "plan_cache_mode=force_generic_plan",
                "enable_seqscan=off",
                "search_path=pg_catalog, pg_temp",
            ],
        }
        assert first + claim_ids(conn, n=400) == ids  # all of them, in order, none twice


def test_claimed_jobs_are_built_by_column_name() -> None:
    """The claim query names every column after a ClaimedJob field; the row factory matches
    them by name (any order) and refuses a result whose columns do not match."""
    fields = list(storage.ClaimedJob._fields)
    with pg() as conn:
        args = {"args": [1], "kwargs": {"n": 0}}
        body = {"kind": "k", "queue": "q", "args": args, "metadata": {"m": 1}, "tags": ["t"]}
        enqueue_sql(conn, json.dumps([body]))
        cursor = conn.execute(query("claim"), ["q", 0, WORKER, 60.0, None] + [None] * 5)
        assert [column.name for column in cursor.description or ()] == fields
        [job] = storage.claim(conn, "q", 1, WORKER)
        assert (job.kind, json.loads(job.args_json), job.metadata, job.tags) == (
            "k",
            args,
            {"m": 1},
            ["t"],
        )
        values = {name: None for name in fields} | {"job_id": 7, "run_lease": 3, "kind": "x"}
        select = ", ".join(f"%({name})s AS {name}" for name in reversed(fields))
        with conn.cursor(row_factory=storage._claimed_job) as reordered:
            [row] = reordered.execute(f"SELECT {select}", values).fetchall()
        assert (row.job_id, row.run_lease, row.kind) == (7, 3, "x")
        with (
            pytest.raises(TypeError, match="do not match ClaimedJob"),
            conn.cursor(row_factory=storage._claimed_job) as short,
        ):
            short.execute("SELECT 1 AS job_id, 2 AS run_lease")


def _rotate_and_prune(conn: psycopg.Connection[Any], ring: str, rotate: str = "rotate_v2") -> None:
    """One maintenance step of a ring: prune its oldest slot (carrying open claims forward),
    then rotate when the incoming slot is free (``rotate_v2``: no cursor markers, as when every
    lane was busy at the rotation, or the maintenance of the previous version ran it)."""
    conn.execute("SELECT awa.prune_v1(%s)", [ring])
    conn.execute(f"SELECT awa.{rotate}(%s)", [ring])


def test_the_lane_cursor_never_goes_backwards_through_rotation_and_carry_forward() -> None:
    """The one-probe lane cursor of claim_v3 (the lane's highest claim in the current claim slot,
    when made in the slot's generation) against everything that writes claims: attempts held
    open across many rotations (carried forward, keeping their old positions), lanes idle for
    whole generations, prune markers, two shards, and the claim ring wrapping several times.
    No job is ever claimed twice while its attempt is open, and each lane hands out its rows in
    order."""
    import random

    rnd = random.Random(14)
    held: list[storage.ClaimedJob] = []
    seen: set[int] = set()
    order: dict[int, list[int]] = {}
    enqueued: list[int] = []
    with pg() as a, pg() as b:
        for step in range(160):
            producer = a if rnd.random() < 0.6 else b
            if rnd.random() < 0.5:
                enqueued += [i for i, _ in enqueue_sql(producer, jobs_json(rnd.randint(1, 6)))]
            claimed = storage.claim(a, "q", rnd.randint(1, 5), WORKER)
            for job in claimed:
                assert job.job_id not in seen, f"step {step}: job {job.job_id} claimed twice"
                seen.add(job.job_id)
            lanes = dict(
                a.execute(
                    "SELECT job_id, lane_id FROM awa.ready_entries WHERE job_id = ANY(%s)",
                    [[j.job_id for j in claimed]],
                ).fetchall()
            )
            for job in claimed:
                order.setdefault(lanes[job.job_id], []).append(job.job_id)
            # Keep about one attempt in five open for a long time: prune carries it forward.
            done = [j for j in claimed if rnd.random() < 0.8]
            held += [j for j in claimed if j not in done]
            if held and rnd.random() < 0.1:
                done.append(held.pop(0))
            if done:
                stale = storage.finalize(
                    a,
                    [Finalization(j.job_id, j.run_lease, j.claim_slot, "completed") for j in done],
                )
                assert stale == []
            if rnd.random() < 0.4:
                _rotate_and_prune(a, "claim", rnd.choice(["rotate_v2", "rotate_v3"]))
            if rnd.random() < 0.2:  # a lane's rows then span several queue slots
                _rotate_and_prune(a, "queue", "rotate_v3")
        storage.finalize(
            a, [Finalization(j.job_id, j.run_lease, j.claim_slot, "completed") for j in held]
        )
        while rest := storage.claim(a, "q", 50, WORKER):
            for job in rest:
                assert job.job_id not in seen
                seen.add(job.job_id)
        generations = a.execute(
            "SELECT max(generation) FROM awa.ring_rotations WHERE ring = 'claim'"
        ).fetchone()
    assert generations is not None and generations[0] >= 16  # the claim ring wrapped twice
    assert seen == set(enqueued)
    for lane_jobs in order.values():
        assert lane_jobs == sorted(lane_jobs)  # job ids grow with lane positions here


def _filler_step(conn: psycopg.Connection[Any]) -> None:
    """Run one job of another queue through (so the current claim slot is not idle), then
    prune and rotate the claim ring."""
    enqueue_sql(conn, jobs_json(1, queue="filler"))
    storage.finalize(
        conn,
        [
            Finalization(j.job_id, j.run_lease, j.claim_slot, "completed")
            for j in storage.claim(conn, "filler", 5, WORKER)
        ],
    )
    _rotate_and_prune(conn, "claim")


def test_a_claim_carried_into_the_current_slot_never_pulls_the_cursor_back() -> None:
    """An attempt held open while later rows of its lane were claimed and completed in a newer
    slot, then carried into the current slot at its old position: the lane's next claim takes
    the rows after the newer claims, never those again."""
    with pg() as conn:
        ids = [i for i, _ in enqueue_sql(conn, jobs_json(4))]
        [held] = storage.claim(conn, "q", 1, WORKER)  # claim slot 0, held open
        assert (held.job_id, held.claim_slot) == (ids[0], 0)
        _filler_step(conn)
        later = storage.claim(conn, "q", 2, WORKER)  # claim slot 1, completed
        assert [(j.job_id, j.claim_slot) for j in later] == [(ids[1], 1), (ids[2], 1)]
        storage.finalize(
            conn, [Finalization(j.job_id, j.run_lease, j.claim_slot, "completed") for j in later]
        )
        for _ in range(6):  # through slots 2..7
            _filler_step(conn)
        # Slot 0 is the oldest: prune carries the held attempt into slot 7 and truncates 0.
        assert conn.execute("SELECT awa.prune_v1('claim')").fetchone() == ("pruned",)
        current = conn.execute(
            "SELECT current_slot FROM awa.ring_state WHERE ring = 'claim'"
        ).fetchone()
        assert current == (7,)
        in_slot = conn.execute(
            "SELECT job_id FROM awa.claims WHERE claim_slot = 7 AND job_id = ANY(%s)",
            [ids],
        ).fetchall()
        assert in_slot == [(ids[0],)]  # only the carried claim of the lane is in this slot
        newer = conn.execute("SELECT count(*) FROM awa.claims_1 WHERE job_id = ANY(%s)", [ids])
        assert newer.fetchone() == (2,)  # the newer claims of the lane are still in slot 1
        assert claim_ids(conn, n=10) == [ids[3]]
        assert claim_ids(conn, n=10) == []
        assert (
            storage.finalize(
                conn, [Finalization(held.job_id, held.run_lease, held.claim_slot, "completed")]
            )
            == []
        )


def test_a_claim_rotation_leaves_a_cursor_marker_for_each_lane_claimed_in_the_old_slot() -> None:
    """rotate_v3 appends a closed marker at the cursor of each lane claimed from in the slot it
    leaves, so the next claims of busy lanes read their cursors with one probe; a lane without
    a marker (never claimed, or idle) reads its cursor from every slot, and the rows handed out
    are the same. Idle lanes cost a rotation nothing (with 40,000 lanes, marking every one of
    them held every lane locked for 0.6 s per rotation)."""
    with pg() as a, pg() as b:
        first = [i for i, _ in enqueue_sql(a, jobs_json(3))]
        second = [i for i, _ in enqueue_sql(b, jobs_json(2))]
        assert claim_ids(a, n=1) == [min(first[0], second[0])]
        enqueue_sql(a, jobs_json(1, queue="filler"))
        assert len(storage.claim(a, "filler", 1, WORKER)) == 1
        claimed = a.execute(
            "SELECT DISTINCT c.lane_id, awa.lane_cursor_v1(c.lane_id) FROM awa.claims c"
            " WHERE c.job_id > 0"
        ).fetchall()
        assert a.execute("SELECT awa.rotate_v3('claim')").fetchone() == ("rotated",)
        markers = a.execute(
            "SELECT c.lane_id, c.lane_seq FROM awa.claims c JOIN awa.claim_closures z"
            " USING (claim_slot, job_id, run_lease) JOIN awa.ring_state s ON s.ring = 'claim'"
            " WHERE c.claim_slot = s.current_slot AND c.job_id < 0 AND z.outcome = 'marker'"
        ).fetchall()
        assert sorted(markers) == sorted(claimed)
        got = claim_ids(a, n=10)
        assert sorted(got) == sorted(set(first + second) - {min(first[0], second[0])})
