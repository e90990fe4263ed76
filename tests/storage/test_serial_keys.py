"""Per-key serialisation in SQL (awa.claim_v3 with serial keys, docs/flow.md): one job of a key
at a time, oldest first, parking and hand-off, across sessions, lanes and priorities; the
leader's sweep after a session dies; cancel, drain, the read surfaces and the rows written."""

from __future__ import annotations

import json
import time
from typing import Any

import psycopg
import pytest

from awa_django.db import storage
from awa_django.sql import query
from tests.support.database import pg
from tests.support.factories import WORKER, enqueue_sql

pytestmark = [pytest.mark.storage, pytest.mark.usefixtures("clean_awa")]


def enqueue(
    conn: psycopg.Connection[Any],
    queue: str,
    keys: list[str | None],
    *,
    priority: int = 0,
    weight: int | None = None,
) -> list[int]:
    """One job per entry of ``keys`` (None: no key), in one transaction (one lane)."""
    bodies = []
    for key in keys:
        meta: dict[str, Any] = {} if key is None else {"awa:serial": key}
        if weight is not None:
            meta["awa:weight"] = weight
        bodies.append({"kind": "k", "queue": queue, "priority": priority, "metadata": meta})
    return [job_id for job_id, _ in enqueue_sql(conn, json.dumps(bodies))]


class Session:
    """A claiming session that keeps its serial locks like a worker does."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn
        self.held: dict[int, int] = {}  # job id -> serial lock

    def claim(
        self, queue: str, units: int = 100, *, release: list[int] | None = None
    ) -> tuple[list[storage.ClaimedJob], float | None]:
        keys = [self.held.pop(job_id) for job_id in release or [] if job_id in self.held]
        params = storage._claim_params(
            queue,
            units,
            WORKER,
            60.0,
            None,
            serial_held=list(self.held.values()),
            serial_release=keys,
        )
        with self.conn.cursor(row_factory=storage._claimed_job) as cursor:
            got = storage._claimed(cursor.execute(query("claim"), params).fetchall())
        for job in got.jobs:
            if job.serial_lock is not None:
                self.held[job.job_id] = job.serial_lock
        return got.jobs, got.wait

    def ids(self, queue: str, units: int = 100, *, release: list[int] | None = None) -> list[int]:
        return [job.job_id for job in self.claim(queue, units, release=release)[0]]

    def done(self, *job_ids: int) -> None:
        """Hand back the keys of finished jobs (a claim of 0 units, as a worker does)."""
        self.claim("unused", 0, release=list(job_ids))


def parked(conn: psycopg.Connection[Any]) -> list[int]:
    return [r[0] for r in conn.execute("SELECT job_id FROM awa.serial_waiting ORDER BY job_id")]


def state(conn: psycopg.Connection[Any], job_id: int) -> str:
    row = conn.execute("SELECT state FROM awa.jobs WHERE id = %s", [job_id]).fetchone()
    assert row is not None
    return str(row[0])


def test_one_job_per_key_at_a_time_others_flow_and_the_rest_park() -> None:
    with pg() as a, pg() as b:
        sa, sb = Session(a), Session(b)
        ids = enqueue(a, "s", ["k1", "k1", None, "k2", "k1", None, "k2"])
        got, wait = sa.claim("s")
        # The first of each key and the jobs without a key; the others parked, in no lane.
        assert [j.job_id for j in got] == [ids[0], ids[2], ids[3], ids[5]]
        assert [j.serial_lock is not None for j in got] == [True, False, True, False]
        assert wait is None
        assert parked(a) == [ids[1], ids[4], ids[6]]
        # Parked jobs are available to everyone but the claim; no attempt was counted.
        assert {state(a, i) for i in parked(a)} == {"available"}
        row = a.execute("SELECT attempt FROM awa.jobs WHERE id = %s", [ids[1]]).fetchone()
        assert row == (0,)
        assert sb.ids("s") == []
        # The end of k1's job hands k1 on to its oldest waiting job, whoever claims next.
        sa.done(ids[0])
        assert parked(a) == [ids[4], ids[6]]
        assert sb.ids("s") == [ids[1]]
        sa.done(ids[3])
        assert sb.ids("s") == [ids[6]]
        # k1 is held by B now: its last job stays parked until B is done with k1.
        assert sa.ids("s") == []
        sb.done(ids[1])
        assert sa.ids("s") == [ids[4]]
        sa.done(ids[4])
        sb.done(ids[6])
        assert parked(a) == []
        row = a.execute("SELECT count(*) FROM awa.claim_closures WHERE outcome = 'parked'")
        assert row.fetchone() == (3,)


def test_a_session_never_takes_a_key_it_holds_twice() -> None:
    with pg() as a:
        sa = Session(a)
        first = enqueue(a, "re", ["k"])
        assert sa.ids("re") == first
        second = enqueue(a, "re", ["k"])
        # Session advisory locks are re-entrant: only serial_held keeps A from running it.
        assert sa.ids("re") == []
        assert parked(a) == second
        assert sa.ids("re", release=first) == second


def test_order_is_by_job_id_across_lanes_and_priorities() -> None:
    with pg() as a:
        sa = Session(a)
        low = enqueue(a, "o", ["k", None])
        high = enqueue(a, "o", ["k", None], priority=10)
        # The priority-10 lane goes first, but its job of k is younger: it parks; the older one
        # in the other lane runs. Jobs without a key keep their priority order.
        assert sa.ids("o") == [high[1], low[0], low[1]]
        assert parked(a) == [high[0]]
        assert sa.ids("o", release=[low[0]]) == [high[0]]


def test_an_older_job_handed_back_waits_for_the_running_one() -> None:
    with pg() as a, pg() as b:
        sa, sb = Session(a), Session(b)
        ids = enqueue(a, "h", ["k", "k", "k"])
        [first], _ = sa.claim("h")
        assert parked(a) == ids[1:]
        # ids[0] fails and is retried later: its key is handed on meanwhile (docs/flow.md).
        error = {"type": "E", "message": "boom"}
        retry = storage.Finalization(
            first.job_id, first.run_lease, first.claim_slot, "retry", error=error, delay=3600
        )
        assert storage.finalize(a, [retry]) == []
        sa.done(ids[0])
        assert sb.ids("h") == [ids[1]]
        # The retry comes back (due now): ids[1] runs, so it parks, and it is handed the key
        # before ids[2], which is younger.
        a.execute("UPDATE awa.deferred_jobs SET run_at = now() WHERE job_id = %s", [ids[0]])
        assert a.execute("SELECT awa.promote_v1(100)").fetchone() == (1,)
        assert sa.ids("h") == []
        assert parked(a) == [ids[0], ids[2]]
        sb.done(ids[1])
        assert sa.ids("h") == [ids[0]]
        assert sa.ids("h", release=[ids[0]]) == [ids[2]]


def test_a_dead_session_frees_its_key_and_the_sweep_hands_it_on() -> None:
    with pg() as a:
        ids = enqueue(a, "d", ["k", "k", "k2"])
        with pg() as gone:
            assert Session(gone).ids("d") == [ids[0], ids[2]]
        # Nobody handed k on: its waiting job stays parked until the leader's sweep.
        assert parked(a) == [ids[1]]
        sa = Session(a)
        assert sa.ids("d") == []
        rows = a.execute(query("serial_sweep"), [1000]).fetchall()
        assert rows == [(ids[1],)]
        assert a.execute(query("serial_sweep"), [1000]).fetchall() == []
        assert sa.ids("d") == [ids[1]]
        # A key still held is never swept.
        more = enqueue(a, "d", ["k"])
        assert sa.ids("d") == []
        assert a.execute(query("serial_sweep"), [1000]).fetchall() == []
        assert parked(a) == more


def test_a_cancelled_head_is_swept_and_a_cancelled_parked_job_is_gone() -> None:
    with pg() as a:
        sa = Session(a)
        ids = enqueue(a, "c", ["k", "k", "k", "k"])
        assert sa.ids("c") == [ids[0]]
        # Cancel a parked job: available before, cancelled after, with no attempt counted.
        assert a.execute(query("cancel"), [ids[2], "no"]).fetchone() == ("available",)
        assert state(a, ids[2]) == "cancelled"
        assert parked(a) == [ids[1], ids[3]]
        # The key is handed to ids[1], which is cancelled before anyone claims it.
        sa.done(ids[0])
        assert parked(a) == [ids[3]]
        assert a.execute(query("cancel"), [ids[1], "no"]).fetchone() == ("available",)
        assert sa.ids("c") == []
        assert a.execute(query("serial_sweep"), [1000]).fetchall() == [(ids[3],)]
        assert sa.ids("c") == [ids[3]]


def test_drain_counts_and_idle_see_parked_jobs() -> None:
    with pg() as a:
        sa = Session(a)
        ids = enqueue(a, "dr", ["k", "k", "k"])
        [first], _ = sa.claim("dr")
        done = storage.Finalization(first.job_id, first.run_lease, first.claim_slot, "completed")
        assert storage.finalize(a, [done]) == []
        sa.done(ids[0])  # ids[1] is handed on (ready), ids[2] stays parked
        assert parked(a) == [ids[2]]
        assert a.execute(query("queues_idle"), [["dr"]]).fetchone() == (False,)
        row = a.execute("SELECT available FROM awa.queue_counts_v1() WHERE queue = 'dr'").fetchone()
        assert row == (2,)
        assert a.execute("SELECT awa.queue_drain_v2('dr', 100)").fetchone() == (2,)
        assert parked(a) == []
        assert {state(a, i) for i in ids[1:]} == {"cancelled"}
        assert a.execute(query("queues_idle"), [["dr"]]).fetchone() == (True,)


def test_a_key_another_claim_is_deciding_stops_the_lane_and_asks_for_a_quick_retry() -> None:
    with pg() as a, pg(autocommit=False) as b:
        sa = Session(a)
        ids = enqueue(a, "x", ["k", None])
        lock = a.execute("SELECT awa._serial_lock_v1('x', 'k')").fetchone()
        assert lock is not None
        b.execute("SELECT pg_advisory_xact_lock(4282184, %s)", [lock[0]])
        got, wait = sa.claim("x")
        assert got == [] and wait == pytest.approx(0.02)
        b.rollback()
        assert sa.ids("x") == ids


def test_parked_jobs_take_no_units_or_permits_and_keep_the_lane_moving() -> None:
    with pg() as a, pg() as b:
        sa, sb = Session(a), Session(b)
        a.execute("SELECT * FROM awa.flow_set_v1('p', 2, NULL, NULL, 'test', false)")
        ids = enqueue(a, "p", ["k", "k", "k", None, None, None])
        got, _ = sa.claim("p", 2)
        assert [j.job_id for j in got] == [ids[0], ids[3]]
        assert parked(a) == ids[1:3]
        assert all(len(j.permits or []) == 1 for j in got)
        assert sb.ids("p", 5) == []  # both permits are A's
        row = a.execute("SELECT in_use FROM awa.flow_status_v1() WHERE queue = 'p'").fetchone()
        assert row == (2,)


def test_reset_after_a_failed_claim_releases_and_hands_on() -> None:
    with pg() as a, pg() as b:
        sa = Session(a)
        ids = enqueue(a, "rs", ["k", "k"])
        assert sa.ids("rs") == [ids[0]]
        keep = list(sa.held.values())
        with pytest.raises(psycopg.errors.DivisionByZero), a.transaction():
            a.execute("SELECT pg_try_advisory_lock(4282183, 777)")
            a.execute("SELECT 1 / 0")
        assert a.execute(query("serial_reset"), [keep, None]).fetchone() == (1,)
        # Retake: another session cannot take what A holds; once A released it, it can.
        assert b.execute(query("serial_retake"), [keep]).fetchone() == (keep,)
        sa.done(ids[0])
        assert b.execute(query("serial_retake"), [keep]).fetchone() == ([],)
        assert b.execute(query("serial_release"), [[*keep, 5]]).fetchone() == (1,)
        assert Session(b).ids("rs") == [ids[1]]


def test_a_release_whose_unlock_stuck_after_a_failed_claim_still_hands_on() -> None:
    with pg() as a:
        sa = Session(a)
        ids = enqueue(a, "st", ["k", "k", "k"])
        assert sa.ids("st") == [ids[0]]
        [lock] = sa.held.values()
        # A claim released the key (session locks do not roll back) and then failed: the
        # hand-off rolled back with it. Handing the key back again hands it on.
        a.execute("SELECT pg_advisory_unlock(4282183, %s)", [lock])
        assert a.execute(query("serial_release"), [[lock]]).fetchone() == (0,)
        assert Session(a).ids("st") == [ids[1]]
        # The same through the reset after a failed claim.
        a.execute("SELECT awa.serial_release_v1(%s)", [[lock]])
        assert parked(a) == []
        assert Session(a).ids("st") == [ids[2]]
        with pg() as b:
            assert b.execute(query("serial_reset"), [[], [lock]]).fetchone() == (0,)
        assert a.execute(query("serial_reset"), [[], [lock]]).fetchone() == (1,)


def test_jobs_without_a_key_write_nothing_more() -> None:
    with pg() as a:
        enqueue(a, "n", [None] * 50)
        assert len(Session(a).ids("n", 100)) == 50
        assert parked(a) == []
        row = a.execute("SELECT count(*) FROM awa.claim_closures").fetchone()
        assert row == (0,)


def test_raw_sql_keys_of_any_json_type_and_the_lock_number() -> None:
    with pg() as a:
        bodies = [
            {"kind": "k", "queue": "raw", "metadata": {"awa:serial": v}}
            for v in [42, "42", None, "x"]
        ]
        ids = [i for i, _ in enqueue_sql(a, json.dumps(bodies))]
        sa = Session(a)
        # 42 and "42" are one key (its text); a JSON null is no key.
        assert sa.ids("raw") == [ids[0], ids[2], ids[3]]
        assert parked(a) == [ids[1]]
        row = a.execute("SELECT awa._serial_lock_v1('raw', '42') = hashtext('raw/42')").fetchone()
        assert row == (True,)


def test_a_long_backlog_of_one_key_is_parked_in_bounded_claims() -> None:
    with pg() as a:
        sa = Session(a)
        ids = enqueue(a, "bl", ["k"] * 300 + [None])
        started = time.monotonic()
        got, wait = sa.claim("bl", 4)
        # The first of k runs; the claim parks a bounded number and asks to be called again.
        assert [j.job_id for j in got] == [ids[0]]
        assert wait == pytest.approx(0.02)
        assert 0 < len(parked(a)) < 299
        for _ in range(20):
            got, wait = sa.claim("bl", 4)
            if got:
                break
        assert [j.job_id for j in got] == [ids[-1]]
        assert len(parked(a)) == 299
        assert time.monotonic() - started < 30


# The Python API ----------------------------------------------------------------------------------


def test_serial_key_is_stored_with_the_job_and_checked() -> None:
    import awa_django
    from awa_django.exceptions import InvalidOptionError
    from tests.jobs import common as testjobs

    first = testjobs.noop.using(serial_key="customer:42").enqueue()
    second = awa_django.enqueue("tests.jobs.common.noop", serial_key="é" * 255, metadata={"m": 1})
    with pg() as a:
        rows = a.execute(
            "SELECT metadata FROM awa.jobs WHERE id = ANY(%s) ORDER BY id", [[first.id, second.id]]
        ).fetchall()
    assert rows == [({"awa:serial": "customer:42"},), ({"m": 1, "awa:serial": "é" * 255},)]
    for bad in ["", "x" * 256, "a\x00b", "\ud800", 42, b"k"]:
        with pytest.raises(InvalidOptionError, match=r"^serial_key: "):
            testjobs.noop.using(serial_key=bad).enqueue()  # type: ignore[arg-type]
    with pytest.raises(InvalidOptionError, match="reserved"):
        testjobs.noop.using(metadata={"awa:serial": "k"}).enqueue()
    with pg() as a:
        assert a.execute("SELECT count(*) FROM awa.jobs").fetchone() == (2,)


def test_drain_runs_the_jobs_of_a_key_in_order_and_hands_keys_back() -> None:
    from awa_django.testing import drain
    from tests.jobs import common as testjobs
    from tests.testapp.models import Ledger

    handles = [
        testjobs.serial_sleep.using(serial_key=key).enqueue(0) for key in ["k", "k", None, "k", "j"]
    ]
    runs = drain("serial")
    assert sorted(run.id for run in runs) == sorted(h.id for h in handles)
    assert {run.outcome for run in runs} == {"completed"}
    keyed = [run.id for run in runs if run.id in {handles[0].id, handles[1].id, handles[3].id}]
    assert keyed == [handles[0].id, handles[1].id, handles[3].id]
    assert Ledger.objects.filter(note__startswith="start").count() == 5
    with pg() as a:
        assert parked(a) == []
        row = a.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = 4282183"
        ).fetchone()
        assert row == (0,)


def test_the_worker_hands_keys_on_after_a_reconnect_and_a_failed_claim(
    caplog: pytest.LogCaptureFixture,
) -> None:
    import asyncio
    import logging

    caplog.set_level(logging.WARNING, logger="awa_django.worker")

    from awa_django.worker.flow import Permits
    from tests.support.database import conninfo

    async def scenario() -> None:
        with pg() as a:
            ids = enqueue(a, "wk", ["k", "k", "k", "j", "j"])
        permits = Permits()
        first = await psycopg.AsyncConnection.connect(conninfo(), autocommit=True)
        got = await storage.aclaim_units(first, "wk", 10, WORKER)
        assert [job.job_id for job in got.jobs] == [ids[0], ids[3]]
        for job in got.jobs:
            permits.hold(job.permits, f"job {job.job_id}", job.serial_lock)
        # k's job ended, but its key was not handed back before the connection dropped: the
        # server frees the lock with the session, and the new session hands k on.
        permits.give_back(None, got.jobs[0].serial_lock)
        await first.close()
        second = await psycopg.AsyncConnection.connect(conninfo(), autocommit=True)
        await permits.on_connect(second)  # j's lock is taken back, k is handed on
        # k's job ended while the connection was down: its key was free from the session's end,
        # so another job of k may have overlapped it; the worker says so.
        assert any(
            "1 serial key lock(s) of attempts that ended while it was down" in r.getMessage()
            and "another job of the same serial key may run at the same time" in r.getMessage()
            for r in caplog.records
        )
        with pg() as a:
            assert parked(a) == [ids[2], ids[4]]  # ids[1] is ready again
        # A failed claim: its unlock of j sticks, its hand-off rolls back; the reset before the
        # next claim hands j on.
        permits.give_back(None, got.jobs[1].serial_lock)
        await second.execute("SELECT pg_advisory_unlock(4282183, %s)", [got.jobs[1].serial_lock])
        permits.claim_failed()
        await permits.prepare(second)
        assert permits.serial_held_keys() == [] and permits.serial_release_batch() == []
        await second.close()
        with pg() as a:
            assert parked(a) == [ids[2]]

    asyncio.run(scenario())
