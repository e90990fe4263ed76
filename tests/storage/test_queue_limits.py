"""Flow control in SQL (awa.claim_v3): permits, weights, rate limits, limits changed at runtime,
the permit bookkeeping functions and the settings/operator rows. docs/flow.md."""

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


def enqueue(conn: psycopg.Connection[Any], queue: str, n: int, weight: int | None = None) -> None:
    meta = {} if weight is None else {"awa:weight": weight}
    enqueue_sql(conn, json.dumps([{"kind": "k", "queue": queue, "metadata": meta}] * n))


def claim(
    conn: psycopg.Connection[Any],
    queue: str,
    units: int,
    *,
    held: list[int] | None = None,
    release: list[int] | None = None,
    max_weight: int | None = None,
) -> tuple[list[storage.ClaimedJob], bool, float | None]:
    params = storage._claim_params(queue, units, WORKER, 60.0, None, max_weight, held, release)
    with conn.cursor(row_factory=storage._claimed_job) as cursor:
        got = storage._claimed(cursor.execute(query("claim"), params).fetchall())
    return got.jobs, got.limited, got.wait


def db_clock_passes(conn: psycopg.Connection[Any], seconds: float) -> None:
    """Wait (with a timeout) until ``seconds`` have passed on the database clock, the clock the
    rate limit reads."""
    row = conn.execute("SELECT clock_timestamp()").fetchone()
    assert row is not None
    start = row[0]

    def passed() -> bool:
        done = conn.execute(
            "SELECT clock_timestamp() >= %s + make_interval(secs => %s)", [start, seconds]
        ).fetchone()
        return bool(done and done[0])

    wait_for(passed, timeout=5 + seconds, interval=0.01, message=f"{seconds} s of database time")


def set_limits(
    conn: psycopg.Connection[Any],
    queue: str,
    max_running: int | None = None,
    rate: float | None = None,
    burst: int | None = None,
) -> None:
    conn.execute(
        "SELECT * FROM awa.flow_set_v1(%s, %s, %s, %s, 'test', false)",
        [queue, max_running, rate, burst],
    )


def in_use(conn: psycopg.Connection[Any], queue: str) -> int:
    row = conn.execute(
        "SELECT in_use FROM awa.flow_status_v1() WHERE queue = %s", [queue]
    ).fetchone()
    assert row is not None
    return int(row[0])


def test_permits_bound_claims_across_sessions_and_come_back() -> None:
    with pg() as a, pg() as b:
        enqueue(a, "g", 10)
        set_limits(a, "g", max_running=3)
        jobs_a, limited, _ = claim(a, "g", 2)
        assert len(jobs_a) == 2 and not limited
        assert all(len(j.permits or []) == 1 for j in jobs_a)
        jobs_b, limited, wait = claim(b, "g", 5)
        assert len(jobs_b) == 1 and limited and wait is None  # the third permit only
        assert claim(b, "g", 5, held=[k for j in jobs_b for k in j.permits or []])[0] == []
        assert in_use(a, "g") == 3
        # A hands one back (with its next claim) and B can take it.
        done = jobs_a[0].permits or []
        claim(a, "g", 0, release=done)
        assert in_use(a, "g") == 2
        assert len(claim(b, "g", 5, held=[k for j in jobs_b for k in j.permits or []])[0]) == 1
        # A session that ends frees its permits.
    with pg() as c:
        assert in_use(c, "g") == 0
        assert len(claim(c, "g", 10)[0]) == 3


def test_weights_count_against_units_and_permits_in_lane_order() -> None:
    with pg() as conn:
        enqueue(conn, "w", 1, weight=3)
        enqueue(conn, "w", 2)
        enqueue(conn, "w", 1, weight=4)
        set_limits(conn, "w", max_running=4)
        jobs, _, _ = claim(conn, "w", 10)
        # 3 + 1 = 4 permits; the next job (weight 1) would make 5: the claim stops in order.
        assert [j.weight for j in jobs] == [3, 1]
        assert [len(j.permits or []) for j in jobs] == [3, 1]
        assert len({k for j in jobs for k in j.permits or []}) == 4
        assert in_use(conn, "w") == 4
        held = [k for j in jobs for k in j.permits or []]
        claim(conn, "w", 0, held=[], release=held)
        jobs, _, _ = claim(conn, "w", 10)
        # weight 1, then weight 4 does not fit in the 3 permits left: a prefix, in order.
        assert [j.weight for j in jobs] == [1]
        claim(conn, "w", 0, release=[k for j in jobs for k in j.permits or []])
        # A weight above the limit counts as the limit, so it never blocks its lane.
        jobs, _, _ = claim(conn, "w", 10)
        assert [j.weight for j in jobs] == [4]


def test_weights_count_against_the_process_units_without_a_limit() -> None:
    with pg() as conn:
        enqueue(conn, "u", 1, weight=5)
        enqueue(conn, "u", 3)
        assert claim(conn, "u", 4, max_weight=8)[0] == []  # 5 units do not fit in 4
        jobs, limited, _ = claim(conn, "u", 8, max_weight=8)
        assert [j.weight for j in jobs] == [5, 1, 1, 1] and not limited
        assert all(j.permits is None for j in jobs)
        enqueue(conn, "u", 1, weight=50)
        jobs, _, _ = claim(conn, "u", 8, max_weight=8)  # capped to what the process can run
        assert [j.weight for j in jobs] == [8]


def test_rate_limit_gives_the_burst_then_one_job_per_period_with_the_wait() -> None:
    with pg() as conn:
        enqueue(conn, "r", 50)
        # A period of 250 ms: long enough that no token comes back between two claims in a
        # row, even on a loaded machine.
        set_limits(conn, "r", rate=4, burst=5)
        jobs, limited, wait = claim(conn, "r", 50)
        assert len(jobs) == 5 and limited
        assert wait is not None and 0.0 < wait <= 0.25 + 1e-6
        jobs, limited, wait = claim(conn, "r", 50)
        assert jobs == [] and limited and wait is not None and 0.0 < wait <= 0.25 + 1e-6
        db_clock_passes(conn, 1.25)  # 5 periods of 250 ms
        jobs, _, _ = claim(conn, "r", 50)
        assert 4 <= len(jobs) <= 5
        # One row, updated once per claim that took jobs: no row per job.
        row = conn.execute("SELECT count(*) FROM awa.flow_rate_state").fetchone()
        assert row == (1,)


def test_the_default_burst_is_a_tenth_of_a_second() -> None:
    with pg() as conn:
        enqueue(conn, "rb", 200)
        set_limits(conn, "rb", rate=500)
        jobs, limited, _ = claim(conn, "rb", 200)
        assert len(jobs) == 50 and limited


def test_a_lowered_limit_holds_while_permits_above_it_are_in_use() -> None:
    with pg() as a, pg() as b:
        enqueue(a, "low", 20)
        set_limits(a, "low", max_running=5)
        jobs_a, _, _ = claim(a, "low", 5)
        assert len(jobs_a) == 5
        set_limits(a, "low", max_running=2)
        # A hands back two of its five: three are still running, above the new limit of 2.
        claim(a, "low", 0, release=[k for j in jobs_a[:2] for k in j.permits or []])
        assert claim(b, "low", 5)[0] == []
        # Down to one running: one more may start.
        claim(a, "low", 0, release=[k for j in jobs_a[2:4] for k in j.permits or []])
        jobs_b, _, _ = claim(b, "low", 5)
        assert len(jobs_b) == 1
        claim(a, "low", 0, release=list(jobs_a[4].permits or []))
        row = a.execute("SELECT max_seen FROM awa.flow_limits WHERE queue = 'low'").fetchone()
        claim(b, "low", 5, held=list(jobs_b[0].permits or []))
        row = a.execute("SELECT max_seen FROM awa.flow_limits WHERE queue = 'low'").fetchone()
        assert row == (2,)  # every permit above the limit is free again: back to the fast path
        assert in_use(a, "low") == 2


def test_a_raised_limit_takes_effect_on_the_next_claim() -> None:
    with pg() as conn:
        enqueue(conn, "up", 10)
        set_limits(conn, "up", max_running=1)
        first, _, _ = claim(conn, "up", 10)
        assert len(first) == 1
        set_limits(conn, "up", max_running=4)
        more, _, _ = claim(conn, "up", 10, held=list(first[0].permits or []))
        assert len(more) == 3


def test_retake_reset_and_release_functions() -> None:
    with pg() as a, pg() as b:
        enqueue(a, "rk", 4)
        set_limits(a, "rk", max_running=2)
        jobs, _, _ = claim(a, "rk", 2)
        keys = [k for j in jobs for k in j.permits or []]
        # A transaction that takes a permit and then fails leaves it held (session locks do not
        # roll back): reset frees all but the ones kept.
        with pytest.raises(psycopg.errors.DivisionByZero), a.transaction():
            a.execute("SELECT pg_try_advisory_lock(4282182, 12345)")
            a.execute("SELECT 1 / 0")
        row = a.execute(query("flow_reset"), [keys]).fetchone()
        assert row == (1,)
        # Another session cannot retake what A holds; after A's end it can.
        assert b.execute(query("flow_retake"), [keys]).fetchone() == (keys,)
    with pg() as b:
        assert b.execute(query("flow_retake"), [keys]).fetchone() == ([],)
        assert b.execute(query("flow_release"), [[*keys, 99]]).fetchone() == (2,)


def test_reap_terminates_stale_worker_sessions_holding_permits() -> None:
    instance = "11111111-2222-3333-4444-555555555555"
    with pg() as conn:
        enqueue(conn, "reap", 2)
        set_limits(conn, "reap", max_running=2)
        conn.execute(
            "INSERT INTO awa.runtime_instances (instance_id, hostname, pid, last_seen_at) "
            "VALUES (%s, 'h', 1, now() - interval '1 hour')",
            [instance],
        )
        with (
            psycopg.connect(
                conn.info.dsn, autocommit=True, application_name=f"awa:worker:{instance}"
            ) as stale,
            pg() as live,
        ):
            assert len(claim(stale, "reap", 1)[0]) == 1
            assert len(claim(live, "reap", 1)[0]) == 1  # not an awa worker: never reaped
            # A session younger than the staleness bound is of a process that connected within
            # it (one reconnecting after an outage): never reaped.
            assert conn.execute(query("flow_reap"), [30.0]).fetchall() == []
            wait_for(
                lambda: (
                    conn.execute(
                        "SELECT now() - backend_start > interval '0.3 s' FROM pg_stat_activity "
                        "WHERE pid = %s",
                        [stale.info.backend_pid],
                    ).fetchone()
                    == (True,)
                ),
                message="the stale session to be older than the bound",
            )
            rows = conn.execute(query("flow_reap"), [0.3]).fetchall()
            assert [(r[1], r[2]) for r in rows] == [(f"awa:worker:{instance}", "terminated")]
            wait_for(lambda: in_use(conn, "reap") == 1, message="the reaped session's permit")
            assert in_use(conn, "reap") == 1
            with pytest.raises(psycopg.OperationalError):
                stale.execute("SELECT 1")


def test_settings_sync_and_operator_overrides() -> None:
    with pg() as conn:

        def rows() -> list[tuple[Any, ...]]:
            return conn.execute(
                "SELECT queue, max_running, rate, burst, source FROM awa.flow_limits "
                "WHERE max_running IS NOT NULL OR rate IS NOT NULL ORDER BY 1"
            ).fetchall()

        sync = query("flow_sync")
        limits = {"a": {"max_running": 3, "rate": None, "burst": None}, "b": {"rate": 2.5}}
        assert conn.execute(sync, [json.dumps(limits)]).fetchone() == (2,)
        assert conn.execute(sync, [json.dumps(limits)]).fetchone() == (0,)  # no rewrite
        set_limits(conn, "a", max_running=7)
        conn.execute(sync, [json.dumps({"a": {"max_running": 4}})])
        # The operator's row stays; b left the settings, so its settings row limits nothing.
        assert rows() == [("a", 7, None, None, "operator")]
        conn.execute(
            "SELECT * FROM awa.flow_set_v1('a', NULL, NULL, NULL, 'op', true, %s)",
            [json.dumps({"max_running": 4})],
        )
        assert rows() == [("a", 4, None, None, "settings")]
        with pytest.raises(psycopg.errors.CheckViolation):
            set_limits(conn, "a", max_running=0)
        with pytest.raises(psycopg.errors.CheckViolation):
            set_limits(conn, "a", rate=float("nan"))
        with pytest.raises(psycopg.errors.InvalidParameterValue):
            set_limits(conn, "NOT A QUEUE", max_running=1)
        with pytest.raises(psycopg.errors.InvalidParameterValue):
            conn.execute(sync, ["[]"])
        assert rows() == [("a", 4, None, None, "settings")]


def test_hostile_weights_in_raw_metadata_count_as_one() -> None:
    with pg() as conn:
        bodies = [
            {"kind": "k", "queue": "hw", "metadata": {"awa:weight": w}}
            for w in ["4", 2.5, -3, 0, 1e300, True, None, [4], 10_001]
        ]
        enqueue_sql(conn, json.dumps(bodies))
        jobs, _, _ = claim(conn, "hw", 100)
        assert [j.weight for j in jobs] == [1] * len(bodies)


def test_the_testing_drain_honours_limits_and_hands_permits_back() -> None:
    from awa_django.testing import drain
    from tests.jobs import common as testjobs

    with pg() as conn:
        set_limits(conn, "flow", max_running=1)
        for _ in range(3):
            testjobs.flow_sleep.enqueue(0)
        runs = drain("flow")
        assert len(runs) == 3
        assert in_use(conn, "flow") == 0
        set_limits(conn, "flow", rate=0.001, burst=1)
        testjobs.flow_sleep.enqueue(0)
        testjobs.flow_sleep.enqueue(0)
        assert len(drain("flow")) == 1  # the burst of one; the other waits for the rate


def test_a_raised_rate_takes_effect_at_once() -> None:
    with pg() as conn:
        enqueue(conn, "rr", 20)
        set_limits(conn, "rr", rate=0.001, burst=1)
        assert len(claim(conn, "rr", 20)[0]) == 1
        jobs, limited, wait = claim(conn, "rr", 20)
        assert jobs == [] and limited and wait is not None and wait > 900
        # The state a slow rate left is never further ahead than the new limit allows (an
        # empty burst): the next job may start one period (10 ms) later, not 1,000 s.
        set_limits(conn, "rr", rate=100, burst=5)
        jobs, limited, wait = claim(conn, "rr", 20)
        assert len(jobs) <= 1 and limited and wait is not None and wait <= 0.0101
        db_clock_passes(conn, 0.06)
        assert len(claim(conn, "rr", 20)[0]) == 5
        conn.execute("SELECT * FROM awa.flow_set_v1('rr', NULL, NULL, NULL, 'op', true)")
        set_limits(conn, "rr", rate=50, burst=3)
        db_clock_passes(conn, 0.06)
        assert len(claim(conn, "rr", 20)[0]) == 3


def test_clearing_to_a_lower_settings_limit_counts_permits_still_held() -> None:
    with pg() as a, pg() as b:
        enqueue(a, "cl", 10)
        set_limits(a, "cl", max_running=5)
        jobs_a, _, _ = claim(a, "cl", 5)
        assert len(jobs_a) == 5
        a.execute(
            "SELECT * FROM awa.flow_set_v1('cl', NULL, NULL, NULL, 'op', true, %s)",
            [json.dumps({"max_running": 1})],
        )
        assert claim(b, "cl", 5)[0] == []
        claim(a, "cl", 0, release=[k for j in jobs_a[:4] for k in j.permits or []])
        assert claim(b, "cl", 5)[0] == []  # one still runs: the limit of 1 is reached
        claim(a, "cl", 0, release=list(jobs_a[4].permits or []))
        assert len(claim(b, "cl", 5)[0]) == 1
        # Cleared to nothing, then limited again: held permits are still counted.
        a.execute("SELECT * FROM awa.flow_set_v1('cl', NULL, NULL, NULL, 'op', true)")
        rows = a.execute("SELECT * FROM awa.flow_status_v1() WHERE queue = 'cl'").fetchall()
        assert rows == []  # a row without limits limits nothing and is not shown


def test_a_job_heavier_than_the_limit_counts_in_full_once_the_limit_is_raised() -> None:
    """A weight-3 job of a queue limited to 2 runs (it counts as the limit), and it also holds
    the permit above the limit its weight reaches: once the limit is raised to 6, weight-1 jobs
    take the 3 permits left, not 4, so the sum of what runs never passes the limit in force."""
    with pg() as a, pg() as b:
        set_limits(a, "heavy", max_running=2)
        enqueue(a, "heavy", 1, weight=3)
        [job], _, _ = claim(a, "heavy", 8)
        assert job.weight == 2 and len(job.permits) == 3
        set_limits(a, "heavy", max_running=6)
        enqueue(a, "heavy", 6, weight=1)
        jobs, limited, _ = claim(b, "heavy", 8)
        assert len(jobs) == 3 and limited
        assert in_use(a, "heavy") == 6
        claim(a, "heavy", 0, release=job.permits)
        more, _, _ = claim(b, "heavy", 8, held=[k for j in jobs for k in j.permits])
        assert len(more) == 3


def test_a_job_heavier_than_its_kind_limit_counts_in_full_once_the_limit_is_raised() -> None:
    """The same for a kind's limit: 2, a weight-3 job, then 6 leaves room for 3 units."""
    with pg() as a, pg() as b:
        a.execute("SELECT * FROM awa.flow_kind_set_v1('k', 2, NULL, NULL, 'test', false)")
        enqueue(a, "hk", 1, weight=3)
        [job], _, _ = claim(a, "hk", 8)
        assert len(job.permits) == 3
        a.execute("SELECT * FROM awa.flow_kind_set_v1('k', 6, NULL, NULL, 'test', false)")
        enqueue(a, "hk", 6, weight=1)
        jobs, _, _ = claim(b, "hk", 8)
        assert len(jobs) == 3


def test_a_hand_off_lane_being_made_elsewhere_is_passed_over_without_waiting() -> None:
    """Claims make the hand-off lane of a (queue, priority) when they first unpark its jobs. A
    claim that waited for another one's uncommitted lane while holding a lane of its own
    deadlocked with a claim making the two in the other order; now it passes it over (NULL:
    the jobs stay parked for the next claim) and finds it once made."""
    with pg() as maker, pg() as other:
        other.execute("SET lock_timeout = '2s'")
        with maker.transaction():
            made = maker.execute("SELECT awa.flow_handoff_lane_v1('handoff', 3)").fetchone()
            assert made is not None and made[0] is not None
            passed = other.execute("SELECT awa.flow_handoff_lane_v1('handoff', 3)").fetchone()
            assert passed == (None,)
        assert other.execute("SELECT awa.flow_handoff_lane_v1('handoff', 3)").fetchone() == made
