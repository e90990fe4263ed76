"""Flow limits per job kind in SQL (awa.flow_kind_set_v1 and the claim): kind permits and rate,
parking in awa.flow_waiting without head-of-line blocking, un-parking into the hand-off lane,
limits shared across queues, serial keys, and the read and operator surfaces. docs/flow.md, "Per
kind"."""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest

from awa_django.db import storage
from awa_django.sql import query
from tests.support.database import pg
from tests.support.factories import WORKER, enqueue_sql
from tests.support.polling import wait_for

pytestmark = [pytest.mark.storage, pytest.mark.usefixtures("clean_awa")]


def enqueue(conn: psycopg.Connection[Any], queue: str, kinds: list[str], **meta: Any) -> list[int]:
    rows = [{"kind": k, "queue": queue, "metadata": dict(meta)} for k in kinds]
    return [job_id for job_id, _ in enqueue_sql(conn, json.dumps(rows))]


def claim(
    conn: psycopg.Connection[Any],
    queue: str,
    units: int,
    *,
    held: list[int] | None = None,
    release: list[int] | None = None,
    serial_held: list[int] | None = None,
    max_weight: int | None = None,
) -> storage.Claimed:
    params = storage._claim_params(
        queue, units, WORKER, 60.0, None, max_weight, held, release, serial_held, None
    )
    with conn.cursor(row_factory=storage._claimed_job) as cursor:
        return storage._claimed(cursor.execute(query("claim"), params).fetchall())


def set_kind(
    conn: psycopg.Connection[Any],
    kind: str,
    max_running: int | None = None,
    rate: float | None = None,
    burst: int | None = None,
) -> None:
    conn.execute(
        "SELECT * FROM awa.flow_kind_set_v1(%s, %s, %s, %s, 'test', false)",
        [kind, max_running, rate, burst],
    )


def parked(conn: psycopg.Connection[Any], kind: str | None = None) -> list[int]:
    rows = conn.execute(
        "SELECT job_id FROM awa.flow_waiting WHERE %s::text IS NULL OR kind = %s ORDER BY job_id",
        [kind, kind],
    ).fetchall()
    return [r[0] for r in rows]


def kind_in_use(conn: psycopg.Connection[Any], kind: str) -> int:
    row = conn.execute(
        "SELECT in_use FROM awa.flow_kind_status_v1() WHERE kind = %s", [kind]
    ).fetchone()
    assert row is not None
    return int(row[0])


def test_kind_limit_parks_the_rest_and_the_lane_moves_on() -> None:
    with pg() as conn:
        set_kind(conn, "k", max_running=2)
        ids = enqueue(conn, "q", ["k", "o", "k", "o", "k", "o", "k", "o"])
        got = claim(conn, "q", 10)
        kinds = [j.kind for j in got.jobs]
        assert kinds.count("k") == 2 and kinds.count("o") == 4  # no head-of-line blocking
        assert [j.job_id for j in got.jobs if j.kind == "k"] == [ids[0], ids[2]]
        assert parked(conn, "k") == [ids[4], ids[6]]
        assert kind_in_use(conn, "k") == 2
        k_jobs = [j for j in got.jobs if j.kind == "k"]
        assert all(j.permits is not None and len(j.permits) == 1 for j in k_jobs)
        assert all(not j.permits for j in got.jobs if j.kind == "o")
        # Parked jobs are available to everyone but the claim.
        row = conn.execute(
            "SELECT count(*) FROM awa.jobs WHERE queue = 'q' AND state = 'available'"
        ).fetchone()
        assert row == (2,)
        counts = conn.execute(
            "SELECT available, running FROM awa.queue_counts_v1() WHERE queue = 'q'"
        ).fetchone()
        assert counts == (2, 6)
        assert conn.execute("SELECT awa.queues_idle_v2(ARRAY['q'])").fetchone() == (False,)
        # Nothing else to claim while both permits are held.
        held = [p for j in k_jobs for p in (j.permits or [])]
        assert claim(conn, "q", 10, held=held).jobs == []
        # One ends: the next claim un-parks the oldest parked job and takes it.
        again = claim(conn, "q", 10, held=held[1:], release=held[:1])
        assert [j.job_id for j in again.jobs] == [ids[4]]
        assert parked(conn, "k") == [ids[6]]
        shard = conn.execute(
            "SELECT l.shard FROM awa.claims c JOIN awa.queue_lanes l ON l.lane_id = c.lane_id "
            "WHERE c.job_id = %s ORDER BY c.run_lease DESC LIMIT 1",
            [ids[4]],
        ).fetchone()
        assert shard == (64,)  # the hand-off lane
        conn.execute(
            "SELECT awa.flow_release_v1(%s)", [held[1:] + list(again.jobs[0].permits or [])]
        )
        assert kind_in_use(conn, "k") == 0


def test_producers_never_pick_the_hand_off_lane() -> None:
    with pg() as conn:
        set_kind(conn, "k", max_running=1)
        enqueue(conn, "q", ["k", "k", "k"])
        first = claim(conn, "q", 5).jobs
        again = claim(conn, "q", 5, release=list(first[0].permits or [])).jobs
        assert len(again) == 1
        for _ in range(20):  # several sessions: several home shards
            with pg() as producer:
                enqueue(producer, "q", ["o"])
        row = conn.execute(
            "SELECT count(*) FROM awa.ready_entries e JOIN awa.queue_lanes l "
            "ON l.lane_id = e.lane_id WHERE l.shard = 64 AND e.kind = 'o'"
        ).fetchone()
        assert row == (0,)


def test_weights_count_against_the_kind() -> None:
    with pg() as conn:
        set_kind(conn, "k", max_running=3)
        enqueue(conn, "q", ["k", "k"], **{"awa:weight": 2})
        got = claim(conn, "q", 10).jobs
        assert len(got) == 1 and got[0].weight == 2 and len(got[0].permits or []) == 2
        assert len(parked(conn, "k")) == 1
        assert kind_in_use(conn, "k") == 2


def test_a_kind_in_two_queues_shares_its_limit() -> None:
    with pg() as a, pg() as b:
        set_kind(a, "k", max_running=2)
        enqueue(a, "q1", ["k", "k", "k"])
        enqueue(a, "q2", ["k", "k", "o"])
        assert len(claim(a, "q1", 10).jobs) == 2
        got = claim(b, "q2", 10).jobs
        assert [j.kind for j in got] == ["o"]
        assert len(parked(a, "k")) == 3


def test_kind_rate_tokens_and_soft_wait() -> None:
    with pg() as conn:
        set_kind(conn, "k", rate=2, burst=2)
        enqueue(conn, "q", ["k"] * 5 + ["o"])
        got = claim(conn, "q", 10)
        assert [j.kind for j in got.jobs] == ["k", "k", "o"]
        assert got.wait is None and got.soft_wait is not None and 0 < got.soft_wait <= 0.5
        assert len(parked(conn, "k")) == 3
        row = conn.execute("SELECT count(*) FROM awa.flow_kind_rate_state").fetchone()
        assert row == (1,)
        # Before the next token nothing comes back; once it is due, one does.
        assert claim(conn, "q", 10).jobs == []

        def one_more() -> bool:
            return len(claim(conn, "q", 10).jobs) == 1

        wait_for(one_more, timeout=5, interval=0.05, message="the next token")
        assert len(parked(conn, "k")) == 2


def test_cancel_and_drain_see_parked_jobs() -> None:
    with pg() as conn:
        set_kind(conn, "k", max_running=1)
        ids = enqueue(conn, "q", ["k", "k", "k", "k"])
        claim(conn, "q", 10)
        assert parked(conn) == ids[1:]
        assert conn.execute("SELECT awa.cancel_v1(%s)", [ids[1]]).fetchone() == ("available",)
        state = conn.execute("SELECT state FROM awa.jobs WHERE id = %s", [ids[1]]).fetchone()
        assert state == ("cancelled",)
        assert conn.execute("SELECT awa.queue_drain_v2('q')").fetchone() == (2,)
        assert parked(conn) == []


def test_serial_key_order_holds_behind_a_kind_parked_job() -> None:
    with pg() as conn:
        set_kind(conn, "k", max_running=1)
        blocker = enqueue(conn, "q", ["k"])
        first = claim(conn, "q", 10).jobs
        assert [j.job_id for j in first] == blocker
        # An older job of key s waits for its kind; a younger one of the same key, of an
        # unlimited kind, must not overtake it.
        old = enqueue(conn, "q", ["k"], **{"awa:serial": "s"})
        young = enqueue(conn, "q", ["o"], **{"awa:serial": "s"})
        got = claim(conn, "q", 10, held=list(first[0].permits or []))
        assert got.jobs == []
        assert parked(conn) == old
        row = conn.execute("SELECT job_id FROM awa.serial_waiting").fetchall()
        assert [r[0] for r in row] == young
        # The kind's permit comes back: the old job runs (taking the key), then hands it on.
        got = claim(conn, "q", 10, release=list(first[0].permits or []))
        assert [j.job_id for j in got.jobs] == old
        lock = got.jobs[0].serial_lock
        assert lock is not None
        params = storage._claim_params(
            "q", 10, WORKER, 60.0, None, None, None, list(got.jobs[0].permits or []), None, [lock]
        )
        with conn.cursor(row_factory=storage._claimed_job) as cursor:
            after = storage._claimed(cursor.execute(query("claim"), params).fetchall())
        assert [j.job_id for j in after.jobs] == young


def test_a_raised_kind_rate_takes_effect_at_once() -> None:
    """A state left by a slower rate (the next token 20 s away) holds nothing back once the
    rate is raised: one job starts at once, then the new rate; the state is never further
    ahead than the new limits allow once a claim started a job."""
    with pg() as conn:
        set_kind(conn, "k", rate=0.05, burst=1)
        enqueue(conn, "q", ["k"] * 4)
        assert len(claim(conn, "q", 10).jobs) == 1  # the one token; the next in 20 s
        assert claim(conn, "q", 10).jobs == [] and len(parked(conn, "k")) == 3
        set_kind(conn, "k", rate=1000, burst=2)
        assert len(claim(conn, "q", 10).jobs) == 1  # at once, not after 20 s
        row = conn.execute(
            "SELECT extract(epoch FROM tat - clock_timestamp()) FROM awa.flow_kind_rate_state"
        ).fetchone()
        assert row is not None and float(row[0]) <= 0.002  # within burst x T of now

        def rest() -> bool:
            claim(conn, "q", 10)
            return parked(conn, "k") == []

        wait_for(rest, timeout=5, interval=0.01, message="the rest at the new rate")


def test_a_cleared_kind_limit_unparks_its_jobs() -> None:
    with pg() as conn:
        set_kind(conn, "k", max_running=1)
        enqueue(conn, "q", ["k", "k", "k"])
        first = claim(conn, "q", 10).jobs
        assert len(parked(conn)) == 2
        conn.execute("SELECT * FROM awa.flow_kind_set_v1('k', NULL, NULL, NULL, 'test', true)")
        got = claim(conn, "q", 10, held=list(first[0].permits or [])).jobs
        assert len(got) == 2 and parked(conn) == []


def test_a_lowered_kind_limit_holds_at_once() -> None:
    with pg() as conn:
        set_kind(conn, "k", max_running=3)
        enqueue(conn, "q", ["k"] * 6)
        got = claim(conn, "q", 10).jobs
        assert len(got) == 3
        set_kind(conn, "k", max_running=1)
        held = [p for j in got for p in (j.permits or [])]
        # Two of three end: one is still held, which is the new limit.
        assert claim(conn, "q", 10, held=held[2:], release=held[:2]).jobs == []
        again = claim(conn, "q", 10, release=held[2:]).jobs
        assert len(again) == 1
        assert kind_in_use(conn, "k") == 1


def test_a_heavy_parked_job_is_not_moved_until_it_fits() -> None:
    with pg() as conn:
        set_kind(conn, "k", max_running=4)
        enqueue(conn, "q", ["k", "k"], **{"awa:weight": 3})
        first = claim(conn, "q", 10).jobs
        assert len(first) == 1 and len(parked(conn)) == 1
        before = conn.execute("SELECT count(*) FROM awa.claims").fetchone()
        for _ in range(5):  # one permit free: the heavy job stays parked, nothing is written
            assert claim(conn, "q", 10, held=list(first[0].permits or [])).jobs == []
        assert conn.execute("SELECT count(*) FROM awa.claims").fetchone() == before
        got = claim(conn, "q", 10, release=list(first[0].permits or [])).jobs
        assert len(got) == 1 and got[0].weight == 3 and parked(conn) == []


def test_a_parked_job_heavier_than_the_claimers_slots_is_unparked() -> None:
    """Weight 3, kind limit 3, claimers of 2 units: the claim counts the job as 2 (its process
    could never run more), and so must the un-parking (awa._flow_unpark_v2), or the parked job
    never fits and stays parked for good."""
    with pg() as one, pg() as two:
        set_kind(one, "k", max_running=3)
        enqueue(one, "q", ["k", "k"], **{"awa:weight": 3})
        first = claim(one, "q", 2, max_weight=2).jobs
        assert len(first) == 1 and first[0].weight == 2 and kind_in_use(one, "k") == 2
        assert claim(two, "q", 2, max_weight=2).jobs == [] and len(parked(two)) == 1
        claim(one, "q", 0, release=list(first[0].permits or []), max_weight=2)
        # A claimer with one unit free does not move it only to stop at it: it stays parked.
        assert claim(two, "q", 1, max_weight=2).jobs == [] and len(parked(two)) == 1
        got = claim(two, "q", 2, max_weight=2).jobs
        assert len(got) == 1 and got[0].weight == 2 and parked(two) == []


def test_a_parked_job_heavier_than_its_kinds_rate_burst_is_unparked() -> None:
    """Rate tokens count jobs, permits count weight: a job of weight 2 of a kind limited to 3
    running and 10/s with a burst of 1 (the default burst at that rate) gets one token and two
    permits once its turn comes (an un-parking that compared its weight with the one token would
    never let it fit)."""
    with pg() as one, pg() as two:
        set_kind(one, "k", max_running=3, rate=10.0, burst=1)
        enqueue(one, "q", ["k", "k"], **{"awa:weight": 2})
        first = claim(one, "q", 4).jobs
        assert len(first) == 1 and first[0].weight == 2
        assert claim(two, "q", 4).jobs == [] and len(parked(two)) == 1
        claim(one, "q", 0, release=list(first[0].permits or []))  # the first one ended
        got: list[Any] = []

        def claimed() -> bool:
            got.extend(claim(two, "q", 4).jobs)
            return bool(got)

        wait_for(claimed, timeout=10, interval=0.05, message="the parked job claimed")
        assert got[0].weight == 2 and parked(two) == []


# The bulk path of awa._claim_kind_v1 (a window without serial keys): decisions on arrays, a
# kind's permits taken at once and drawn in lane order, one statement writing the claims.


def enqueue_weighted(
    conn: psycopg.Connection[Any], queue: str, rows: list[tuple[str, int]]
) -> list[int]:
    jobs = [{"kind": k, "queue": queue, "metadata": {"awa:weight": w}} for k, w in rows]
    return [job_id for job_id, _ in enqueue_sql(conn, json.dumps(jobs))]


def session_permits(conn: psycopg.Connection[Any]) -> list[int]:
    """The permit keys (class 4282182) this session holds, as the oids pg_locks shows."""
    rows = conn.execute(
        "SELECT l.objid::bigint FROM pg_locks l WHERE l.pid = pg_backend_pid() "
        "AND l.locktype = 'advisory' AND l.classid = 4282182::oid AND l.objsubid = 2 "
        "AND l.granted ORDER BY 1"
    ).fetchall()
    return [r[0] for r in rows]


def as_oids(keys: list[int]) -> list[int]:
    return sorted(k & 0xFFFFFFFF for k in keys)


def claims_of(conn: psycopg.Connection[Any], ids: list[int]) -> dict[int, str | None]:
    """Per job of ``ids`` with a claim: its closure outcome (None: open)."""
    rows = conn.execute(
        "SELECT c.job_id, x.outcome FROM awa.claims c LEFT JOIN awa.claim_closures x "
        "ON x.job_id = c.job_id AND x.run_lease = c.run_lease AND x.claim_slot = c.claim_slot "
        "WHERE c.job_id = ANY(%s)",
        [ids],
    ).fetchall()
    return {r[0]: r[1] for r in rows}


def test_bulk_window_of_two_limited_kinds_and_an_unlimited_one_with_weights() -> None:
    with pg() as conn:
        set_kind(conn, "a", max_running=3)
        set_kind(conn, "b", max_running=4)
        set_kind(conn, "c", max_running=10)
        set_kind(conn, "d", max_running=2)
        rows = [
            ("a", 2), ("o", 1), ("b", 3), ("a", 2), ("b", 1), ("d", 3), ("a", 1),
            ("b", 5), ("o", 2), ("c", 1), ("o", 1), ("c", 1), ("c", 1), ("o", 1),
        ]  # fmt: skip
        ids = enqueue_weighted(conn, "q", rows)
        got = claim(conn, "q", 16)
        # a: pool 3 (its rows want 2+2+1), rows 0 and 6 draw 2 and 1, row 3 (2) is parked.
        # b: pool 4 (3+1+min(5, 4)), rows 2 and 4 draw 3 and 1, row 7 (4 of 5) is parked.
        # d: one row of weight 3 over a limit of 2 carries its 2 permits and the one above the
        # limit its weight reaches (so that a raised limit counts it in full). c: pool 3, rows 9
        # and 11 draw one each, then the 16 units are used: rows 12 and 13 are left in the lane and
        # c's third key goes back.
        taken = [0, 1, 2, 4, 5, 6, 8, 9, 10, 11]
        assert [j.job_id for j in got.jobs] == [ids[i] for i in taken]
        assert parked(conn) == [ids[3], ids[7]]
        want = {0: 2, 2: 3, 4: 1, 5: 3, 6: 1, 9: 1, 11: 1}
        for i, job in zip(taken, got.jobs, strict=True):
            assert job.weight == rows[i][1] and job.serial_lock is None
            assert (len(job.permits) if job.permits is not None else None) == want.get(i)
        keys = [k for j in got.jobs for k in (j.permits or [])]
        assert len(set(keys)) == len(keys) == 12
        assert session_permits(conn) == as_oids(keys)  # leftovers released, nothing else held
        for kind, n in (("a", 3), ("b", 4), ("c", 2), ("d", 2)):
            assert kind_in_use(conn, kind) == n
        closures = claims_of(conn, ids)
        assert closures == {
            **{ids[i]: None for i in taken},
            ids[3]: "parked",
            ids[7]: "parked",
        }
        # The rows left are claimed next.
        held = keys
        again = claim(conn, "q", 2, held=held)
        assert [j.job_id for j in again.jobs] == [ids[12], ids[13]]
        assert session_permits(conn) == as_oids(held + list(again.jobs[0].permits or []))


def test_bulk_pool_short_mid_window_parks_the_kind_and_takes_the_others() -> None:
    with pg() as conn, pg() as other:
        set_kind(conn, "k", max_running=3)
        set_kind(conn, "m", max_running=5)
        enqueue(other, "q2", ["k"])
        theirs = claim(other, "q2", 1).jobs
        assert len(theirs) == 1 and len(theirs[0].permits or []) == 1
        ids = enqueue(conn, "q", ["k", "o", "k", "m", "k", "o", "k", "m"])
        got = claim(conn, "q", 10)
        # k wants 4 of its limit 3, one held elsewhere: a pool of 2 for its first two rows.
        assert [j.job_id for j in got.jobs] == [ids[i] for i in (0, 1, 2, 3, 5, 7)]
        assert parked(conn) == [ids[4], ids[6]]
        keys = [k for j in got.jobs for k in (j.permits or [])]
        assert len(set(keys)) == 4
        assert session_permits(conn) == as_oids(keys)
        assert not set(keys) & set(theirs[0].permits or [])
        assert kind_in_use(conn, "k") == 3 and kind_in_use(conn, "m") == 2


def test_bulk_a_row_that_does_not_fit_stops_the_lane() -> None:
    with pg() as conn:
        set_kind(conn, "a", max_running=5)
        ids = enqueue_weighted(conn, "q", [("a", 1), ("o", 1), ("a", 3), ("a", 1), ("o", 1)])
        got = claim(conn, "q", 4)
        # Row 2 (3 units) does not fit the 2 left: nothing after it is claimed or parked, and
        # of a's pool (4: 1+3+1 capped at the 4 units) only row 0's key is kept.
        assert [j.job_id for j in got.jobs] == [ids[0], ids[1]]
        assert parked(conn) == []
        assert set(claims_of(conn, ids)) == {ids[0], ids[1]}
        assert session_permits(conn) == as_oids(list(got.jobs[0].permits or []))
        assert kind_in_use(conn, "a") == 1


def test_bulk_rate_tokens_consumed_by_the_jobs_taken_and_state_written_once() -> None:
    with pg(autocommit=False) as conn:
        set_kind(conn, "r", rate=1, burst=3)
        set_kind(conn, "s", rate=1, burst=2)
        ids = enqueue(conn, "q", ["r", "o", "s", "r", "r", "s", "r", "s", "r", "o"])
        conn.commit()
        got = claim(conn, "q", 20)
        assert [j.job_id for j in got.jobs] == [ids[i] for i in (0, 1, 2, 3, 4, 5, 9)]
        assert parked(conn) == [ids[6], ids[7], ids[8]]
        assert got.soft_wait is not None and 0 < got.soft_wait <= 1
        assert all(j.permits is None for j in got.jobs)  # a rate takes no permits
        # In the claim's transaction: one insert and one update of each kind's state row.
        row = conn.execute(
            "SELECT n_tup_ins, n_tup_upd FROM pg_stat_xact_user_tables "
            "WHERE schemaname = 'awa' AND relname = 'flow_kind_rate_state'"
        ).fetchone()
        assert row == (2, 2)
        tats = dict(
            conn.execute(
                "SELECT kind, extract(epoch FROM tat - now())::float FROM awa.flow_kind_rate_state"
            ).fetchall()
        )
        assert 2.9 < tats["r"] < 3.5 and 1.9 < tats["s"] < 2.5  # 3 and 2 tokens used
        conn.commit()


def test_bulk_rows_carry_queue_permits_then_kind_permits() -> None:
    with pg() as conn:
        conn.execute("SELECT 1 FROM awa.flow_set_v1('q', 20, NULL, NULL, 'test', false)")
        set_kind(conn, "a", max_running=2)
        ids = enqueue_weighted(conn, "q", [("a", 3), ("o", 2), ("a", 1)])
        got = claim(conn, "q", 10)
        assert [j.job_id for j in got.jobs] == [ids[0], ids[1]]
        assert parked(conn) == [ids[2]]
        queue_keys = conn.execute(
            "SELECT array_agg(awa._flow_key_v1('q', g)) FROM generate_series(0, 19) g"
        ).fetchone()
        kind_keys = conn.execute(
            "SELECT array_agg(awa._flow_kind_key_v1('a', g)) FROM generate_series(0, 2) g"
        ).fetchone()
        assert queue_keys is not None and kind_keys is not None
        first, second = (list(j.permits or []) for j in got.jobs)
        assert len(first) == 6 and set(first[:3]) <= set(queue_keys[0])
        # The kind's 2 permits after the queue's, then the one above the kind's limit its weight
        # reaches (so that a raised limit counts it in full).
        assert set(first[3:]) == set(kind_keys[0])
        assert len(second) == 2 and set(second) <= set(queue_keys[0])
        assert session_permits(conn) == as_oids(first + second)


def test_bulk_limits_that_do_not_bind_take_the_prefix_at_once() -> None:
    with pg(autocommit=False) as conn:
        set_kind(conn, "a", max_running=10)
        set_kind(conn, "b", max_running=30, rate=1000, burst=100)
        set_kind(conn, "c", max_running=3)
        rows = [("c", 5), ("b", 1), ("o", 3), ("b", 20), ("a", 1), ("b", 2), ("o", 1), ("a", 1)]
        ids = enqueue_weighted(conn, "q", rows)
        conn.commit()
        got = claim(conn, "q", 33)
        # Units 5+1+3+20+1+2 = 32: the seventh row (1) fits, the eighth (1) does not.
        assert [j.job_id for j in got.jobs] == ids[:7]
        assert parked(conn) == []
        # min(weight, limit), and for the job heavier than its kind's limit the permits above the
        # limit its weight reaches.
        want = {0: 5, 1: 1, 3: 20, 4: 1, 5: 2}
        for i, job in enumerate(got.jobs):
            assert (len(job.permits) if job.permits is not None else None) == want.get(i)
        keys = [k for j in got.jobs for k in (j.permits or [])]
        assert len(set(keys)) == len(keys) == 29
        assert session_permits(conn) == as_oids(keys)
        row = conn.execute(
            "SELECT n_tup_ins, n_tup_upd FROM pg_stat_xact_user_tables "
            "WHERE schemaname = 'awa' AND relname = 'flow_kind_rate_state'"
        ).fetchone()
        assert row == (1, 1)
        tat = conn.execute(
            "SELECT extract(epoch FROM tat - now())::float FROM awa.flow_kind_rate_state"
        ).fetchone()
        assert tat is not None and 0.003 - 0.001 < tat[0] < 0.5  # 3 tokens of 1 ms
        assert set(claims_of(conn, ids)) == set(ids[:7])
        conn.commit()


def test_bulk_a_binding_kind_reads_the_rest_of_the_window() -> None:
    with pg() as conn:
        set_kind(conn, "k", max_running=1)
        ids = enqueue(conn, "q", ["k", "k", "k", "k", "o", "o", "o"])
        got = claim(conn, "q", 3)
        # The first three rows (as many as 3 units could take) are all of k, which binds: the
        # rest of the window is read and decided in lane order.
        assert [j.job_id for j in got.jobs] == [ids[0], ids[4], ids[5]]
        assert parked(conn) == ids[1:4]
        assert session_permits(conn) == as_oids(list(got.jobs[0].permits or []))
        assert set(claims_of(conn, ids)) == set(ids[:6])


# Jobs of limited kinds whose limits do not bind go through claim_v3's own statement, not the
# slow path (awa._claim_kind_v1).


def slow_path_calls(conn: psycopg.Connection[Any]) -> int:
    """Calls of awa._claim_kind_v1 in the current transaction (track_functions is on)."""
    row = conn.execute(
        "SELECT COALESCE(sum(calls), 0) FROM pg_stat_xact_user_functions "
        "WHERE schemaname = 'awa' AND funcname = '_claim_kind_v1'"
    ).fetchone()
    assert row is not None
    return int(row[0])


def test_kinds_that_do_not_bind_skip_the_slow_path() -> None:
    with pg(autocommit=False) as conn:
        set_kind(conn, "a", max_running=50)
        set_kind(conn, "b", max_running=40, rate=1000, burst=100)
        set_kind(conn, "r", rate=1000, burst=100)
        kinds = ["a", "o", "b", "r", "a", "b"] * 5
        ids = enqueue_weighted(
            conn, "q", [(k, 2 if i % 7 == 0 else 1) for i, k in enumerate(kinds)]
        )
        conn.commit()
        conn.execute("SET LOCAL track_functions = 'all'")
        got = claim(conn, "q", 100)
        assert [j.job_id for j in got.jobs] == ids
        assert slow_path_calls(conn) == 0
        for job in got.jobs:
            expected = job.weight if job.kind in ("a", "b") else None
            assert (len(job.permits) if job.permits is not None else None) == expected
        keys = [k for j in got.jobs for k in (j.permits or [])]
        assert len(set(keys)) == len(keys)
        assert session_permits(conn) == as_oids(keys)
        a_keys = {k for j in got.jobs if j.kind == "a" for k in j.permits or []}
        assert a_keys <= {
            k[0]
            for k in conn.execute(
                "SELECT awa._flow_kind_key_v1('a', g) FROM generate_series(0, 49) g"
            ).fetchall()
        }
        assert kind_in_use(conn, "a") == sum(j.weight for j in got.jobs if j.kind == "a")
        tats = dict(
            conn.execute(
                "SELECT kind, extract(epoch FROM tat - now())::float FROM awa.flow_kind_rate_state"
            ).fetchall()
        )
        assert 0.009 < tats["b"] < 0.5 and 0.004 < tats["r"] < 0.5  # 10 and 5 tokens of 1 ms
        conn.commit()


def test_a_cancelled_job_in_the_run_gives_its_kind_key_back() -> None:
    with pg() as conn:
        set_kind(conn, "k", max_running=10)
        ids = enqueue(conn, "q", ["k", "k", "k", "o", "k"])
        assert conn.execute("SELECT awa.cancel_v1(%s)", [ids[2]]).fetchone() == ("available",)
        got = claim(conn, "q", 10)
        assert [j.job_id for j in got.jobs] == [ids[0], ids[1], ids[3], ids[4]]
        keys = [k for j in got.jobs for k in (j.permits or [])]
        assert len(set(keys)) == len(keys) == 3
        assert session_permits(conn) == as_oids(keys)  # the cancelled row's key went back
        assert kind_in_use(conn, "k") == 3


def test_a_gap_in_the_lane_leaves_the_rows_after_it_to_the_other_paths() -> None:
    with pg(autocommit=False) as conn:
        set_kind(conn, "k", max_running=10)
        first = enqueue(conn, "q", ["k", "k"])
        conn.commit()
        enqueue(conn, "q", ["k"])
        conn.rollback()  # its lane position stays empty for good
        later = enqueue(conn, "q", ["k", "o", "k"])
        conn.commit()
        got = claim(conn, "q", 10)
        assert sorted(j.job_id for j in got.jobs) == sorted(first + later)
        for job in got.jobs:
            assert len(job.permits or []) == (1 if job.kind == "k" else 0)
        keys = [k for j in got.jobs for k in (j.permits or [])]
        assert len(set(keys)) == len(keys) == 4
        assert session_permits(conn) == as_oids(keys)
        assert kind_in_use(conn, "k") == 4
        conn.commit()


def test_keys_taken_for_rows_after_a_serial_key_go_back() -> None:
    with pg() as conn:
        set_kind(conn, "k", max_running=3)
        ids = enqueue(conn, "q", ["k", "o"])
        ids += enqueue(conn, "q", ["k"], **{"awa:serial": "s1"})
        ids += enqueue(conn, "q", ["k", "k"])
        got = claim(conn, "q", 10)
        # Four rows of k want 4 of its 3 permits: the kind binds, so it is decided in lane
        # order by the slow path: three run, the last is parked.
        assert [j.job_id for j in got.jobs] == ids[:4]
        assert parked(conn) == [ids[4]]
        keys = [k for j in got.jobs for k in (j.permits or [])]
        assert len(set(keys)) == len(keys) == 3
        assert session_permits(conn) == as_oids(keys)
        set_kind(conn, "k", max_running=10)
        more = enqueue(conn, "q", ["k", "o"]) + enqueue(conn, "q", ["k"], **{"awa:serial": "s2"})
        more += enqueue(conn, "q", ["k"])
        again = claim(conn, "q", 10, held=keys)
        # Not binding now: the first two go through the statement, the serial job and the one
        # after it through the slow path; no key is held twice or left over.
        assert {j.job_id for j in again.jobs} >= set(more)
        keys2 = [k for j in again.jobs for k in (j.permits or [])]
        assert len(set(keys + keys2)) == len(keys + keys2)
        assert session_permits(conn) == as_oids(keys + keys2)


def test_a_run_that_starts_with_an_unlimited_job_clears_the_kinds_after_it() -> None:
    with pg(autocommit=False) as conn:
        set_kind(conn, "k", max_running=10)
        ids = enqueue(conn, "q", ["o", "o", "k", "o", "k", "k"])
        conn.commit()
        conn.execute("SET LOCAL track_functions = 'all'")
        got = claim(conn, "q", 10)
        # The statement stops at the first job of k, reads the kinds from there and runs again.
        assert [j.job_id for j in got.jobs] == ids
        assert slow_path_calls(conn) == 0
        assert [len(j.permits or []) for j in got.jobs] == [0, 0, 1, 0, 1, 1]
        keys = [k for j in got.jobs for k in (j.permits or [])]
        assert session_permits(conn) == as_oids(keys) and len(set(keys)) == 3
        conn.commit()


def test_a_job_that_does_not_fit_before_a_limited_kind_is_not_skipped() -> None:
    with pg() as conn:
        set_kind(conn, "k", max_running=10)
        ids = enqueue_weighted(conn, "q", [("o", 1), ("o", 5), ("k", 1), ("k", 1)])
        got = claim(conn, "q", 3)
        # The job of weight 5 does not fit the 2 units left: the lane stops there, and the jobs
        # of k after it wait (a second pass from the first job of a limited kind must not skip
        # it, or the lane's cursor would pass it for good).
        assert [j.job_id for j in got.jobs] == [ids[0]]
        again = claim(conn, "q", 10)
        assert [j.job_id for j in again.jobs] == ids[1:]
        assert [len(j.permits or []) for j in again.jobs] == [0, 1, 1]


def test_a_kind_asked_for_the_units_left_that_cannot_have_them_is_decided_exactly() -> None:
    with pg(autocommit=False) as conn, pg() as other:
        set_kind(conn, "k", max_running=10)
        set_kind(conn, "r", rate=1, burst=5)
        conn.commit()
        enqueue(other, "q2", ["k"] * 6)
        theirs = claim(other, "q2", 6).jobs  # 6 of k's 10 permits held elsewhere
        assert len(theirs) == 6
        ids = enqueue(conn, "q", ["k", "k", "o", "k"])
        rids = enqueue(conn, "q3", ["r", "r", "o"])
        conn.commit()
        conn.execute("SET LOCAL track_functions = 'all'")
        # k's limit (10) covers the 8 units asked, but only 4 permits are free: the run is read
        # and k's 3 jobs get 3 of them; r has 5 tokens, fewer than the 8 units: read exactly,
        # its 2 jobs use 2.
        got = claim(conn, "q", 8)
        assert [j.job_id for j in got.jobs] == ids
        assert [len(j.permits or []) for j in got.jobs] == [1, 1, 0, 1]
        rgot = claim(conn, "q3", 8)
        assert [j.job_id for j in rgot.jobs] == rids
        assert slow_path_calls(conn) == 0
        keys = [k for j in got.jobs for k in (j.permits or [])]
        assert session_permits(conn) == as_oids(keys)
        assert kind_in_use(conn, "k") == 9
        conn.commit()
