"""Hostile tests of how jobs parked by their kind come back (docs/flow.md, "Per kind"):
migration 0015's awa._flow_unpark_v2 counts a parked job's weight as the claim counts it and
bounds the jobs it moves by the kind's rate tokens.

Most tests drive ``awa.claim_v3`` from two or three psycopg sessions directly (each session
keeps the permits of the jobs it claimed, as a worker does, and passes them as ``p_held``), so
they are fast and deterministic; a few start real ``awa_worker`` processes. What is held against
the docs: a parked job is never stranded; queue and kind limits (counted by weight) and rates
are never exceeded; no permit leaks; no job is lost or claimed twice; younger jobs of a kind
wait behind a heavy parked one only until it fits.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator, Sequence
from typing import Any

import psycopg
import pytest

from awa_django.operator import (
    clear_kind_limits,
    set_kind_limits,
    set_queue_limits,
)
from tests.support.database import conninfo, pg
from tests.support.factories import WORKER, enqueue_sql
from tests.support.polling import wait_for

pytestmark = pytest.mark.usefixtures("clean_awa")

Q = "upk"
Q2 = "upk2"
HEAVY = "upk.heavy"
LIGHT = "upk.light"
OTHER = "upk.other"

_CLAIM = (
    "SELECT job_id, weight, permits, serial_lock, kind, run_lease, claim_slot, timeout_secs"
    " FROM awa.claim_v3(%s, %s, %s, p_max_weight => %s, p_held => %s, p_release => %s,"
    " p_serial_held => %s, p_serial_release => %s)"
)


def enqueue(
    kind: str,
    *,
    queue: str = Q,
    weight: int = 1,
    priority: int = 0,
    serial: str | None = None,
    n: int = 1,
) -> list[int]:
    """``n`` jobs of ``kind`` through the raw-SQL producer, committed; their ids."""
    metadata: dict[str, Any] = {"awa:weight": weight}
    if serial is not None:
        metadata["awa:serial"] = serial
    body = {"kind": kind, "queue": queue, "priority": priority, "metadata": metadata}
    with pg() as conn:
        return [job_id for job_id, _ in enqueue_sql(conn, json.dumps([body] * n))]


def kind_limit(kind: str, **limits: Any) -> None:
    set_kind_limits(kind, actor="upk-test", **limits)


def queue_limit(queue: str, **limits: Any) -> None:
    set_queue_limits(queue, actor="upk-test", **limits)


class Claimer:
    """A worker-like session: claims with ``awa.claim_v3``, keeps the permits and serial locks
    of the jobs it claimed (``p_held``/``p_serial_held``) until :meth:`finish` hands them back
    with its next claim (``p_release``/``p_serial_release``)."""

    def __init__(self, wcap: int | None) -> None:
        self.conn = psycopg.connect(conninfo(), autocommit=True)
        self.wcap = wcap
        self.held: dict[int, tuple[list[int], int | None, int, int, int]] = {}
        self.release: list[int] = []
        self.serial_release: list[int] = []
        self.last_marker: tuple[Any, ...] | None = None

    def units(self) -> int:
        return sum(h[2] for h in self.held.values())

    def claim(self, p_max: int | None, queue: str = Q) -> list[int]:
        held = [k for h in self.held.values() for k in h[0]]
        sheld = [h[1] for h in self.held.values() if h[1] is not None]
        rows = self.conn.execute(
            _CLAIM,
            [
                queue,
                p_max,
                WORKER,
                self.wcap,
                held,
                self.release,
                sheld,
                self.serial_release,
            ],
        ).fetchall()
        self.release, self.serial_release = [], []
        got = []
        self.last_marker = None
        for job_id, weight, permits, serial_lock, _kind, lease, slot, _t in rows:
            if job_id is None:
                self.last_marker = rows[-1]
                continue
            assert job_id not in self.held, f"job {job_id} claimed twice by one session"
            self.held[job_id] = (list(permits or []), serial_lock, weight, lease, slot)
            got.append(job_id)
        return got

    def finish(self, job_ids: Sequence[int]) -> None:
        """Complete ``job_ids``; their permits and keys go back with the next claim."""
        items = []
        for job_id in job_ids:
            permits, serial_lock, _w, lease, slot = self.held.pop(job_id)
            self.release += permits
            if serial_lock is not None:
                self.serial_release.append(serial_lock)
            items.append(
                {"id": job_id, "lease": lease, "slot": slot, "outcome": "completed", "result": None}
            )
        stale = self.conn.execute(
            "SELECT * FROM awa.finalize_v2(%s::jsonb)", [json.dumps(items)]
        ).fetchall()
        assert stale == [], f"completions refused as stale: {stale}"

    def hand_back(self, job_ids: Sequence[int]) -> None:
        """Complete ``job_ids`` and hand their permits back at once (a claim of 0)."""
        self.finish(job_ids)
        self.claim(0)

    def close(self) -> None:
        self.conn.close()


@pytest.fixture
def claimers() -> Iterator[Any]:
    made: list[Claimer] = []

    def make(wcap: int | None = 8) -> Claimer:
        made.append(Claimer(wcap))
        return made[-1]

    yield make
    for c in made:
        c.close()


_observer: list[psycopg.Connection[Any]] = []


@pytest.fixture(autouse=True)
def observer() -> Iterator[None]:
    """One connection per test for the reads below (opening one per read is slow)."""
    with pg() as conn:
        _observer.append(conn)
        yield
        _observer.clear()


def parked(queue: str | None = None) -> list[int]:
    """Ids of the jobs in awa.flow_waiting (of ``queue``), oldest first."""
    sql = "SELECT job_id FROM awa.flow_waiting"
    params: list[Any] = []
    if queue is not None:
        sql += " WHERE queue = %s"
        params.append(queue)
    rows = _observer[0].execute(sql + " ORDER BY job_id", params).fetchall()
    return [r[0] for r in rows]


def _permits_held(keys_sql: str, name: str, n: int) -> int:
    row = (
        _observer[0]
        .execute(
            "SELECT count(*) FROM pg_locks l WHERE l.locktype = 'advisory' AND l.granted"
            " AND l.objsubid = 2 AND l.classid = 4282182 AND l.objid IN ("
            f" SELECT (({keys_sql}(%s, i))::bigint & 4294967295)::oid"
            " FROM generate_series(0, %s - 1) i)",
            [name, n],
        )
        .fetchone()
    )
    assert row is not None
    return int(row[0])


def kind_permits(kind: str, n: int = 64) -> int:
    """Permits of ``kind`` (0 .. n-1) held by any session now."""
    return _permits_held("awa._flow_kind_key_v1", kind, n)


def queue_permits(queue: str, n: int = 64) -> int:
    """Permits of ``queue`` (0 .. n-1) held by any session now."""
    return _permits_held("awa._flow_key_v1", queue, n)


def states(job_ids: Sequence[int]) -> dict[int, str]:
    rows = (
        _observer[0]
        .execute("SELECT id, state::text FROM awa.jobs WHERE id = ANY(%s)", [list(job_ids)])
        .fetchall()
    )
    return {r[0]: r[1] for r in rows}


def test_heavy_parked_job_heavier_than_every_claimer_runs_once_permits_free(claimers: Any) -> None:
    """Kind limit 3, claimers of 2 units: a job of weight 5 counts as 2; parked while the
    kind's permits are taken, it comes back as soon as 2 are free, never before."""
    kind_limit(HEAVY, global_concurrency=3)
    a, b = claimers(2), claimers(2)
    l1, l2, l3 = enqueue(HEAVY, n=3)
    assert a.claim(2) == [l1, l2]
    [h] = enqueue(HEAVY, weight=5)
    assert b.claim(1) == [l3]  # the kind's last permit
    c = claimers(2)
    assert c.claim(2) == [] and parked() == [h]
    a.hand_back([l1])
    assert c.claim(2) == []  # one free permit: 2 are wanted
    assert parked() == [h]
    assert parked() == [h]
    a.hand_back([l2])
    assert c.claim(2) == [h]
    assert c.held[h][2] == 2 and len(c.held[h][0]) == 2
    assert parked() == [] and kind_permits(HEAVY) == 3


def test_weight_equal_to_worker_and_kind_limit(claimers: Any) -> None:
    kind_limit(HEAVY, global_concurrency=4)
    a, b = claimers(4), claimers(4)
    [l1] = enqueue(HEAVY)
    assert a.claim(4) == [l1]
    [h] = enqueue(HEAVY, weight=4)
    assert b.claim(4) == [] and parked() == [h]
    a.hand_back([l1])
    assert b.claim(3) == []  # three free units only: waits
    assert b.claim(4) == [h]
    assert kind_permits(HEAVY) == 4
    b.hand_back([h])
    assert kind_permits(HEAVY) == 0


@pytest.mark.xfail(
    strict=True,
    reason="a documented limit (docs/flow.md, 'Limits of the design'): younger jobs of a kind "
    "still in lanes take each permit freed one at a time, so a heavy parked job waits for a "
    "moment when enough are free at once",
)
def test_younger_light_jobs_of_the_kind_do_not_starve_a_heavy_parked_one(claimers: Any) -> None:
    """docs/flow.md, "Limits of the design": a heavy parked job waits until enough permits are
    free at once, and the younger jobs of its kind wait behind it. Under a steady stream of
    light jobs of its kind, each permit freed must not go to a younger light job for ever:
    otherwise enough permits are never free at once and the heavy job is stranded."""
    kind_limit(HEAVY, global_concurrency=2)
    a, b = claimers(4), claimers(4)
    l1, l2 = enqueue(HEAVY, n=2)
    assert a.claim(4) == [l1, l2]
    [h] = enqueue(HEAVY, weight=2)
    assert b.claim(4) == [] and parked() == [h]
    running = {l1: a, l2: a}
    overtook = []
    for _ in range(6):
        enqueue(HEAVY)  # younger than h
        oldest = min(running)
        owner = running.pop(oldest)
        owner.hand_back([oldest])
        got = b.claim(4)
        if h in got:
            break
        overtook += got
        running.update(dict.fromkeys(got, b))
        assert kind_permits(HEAVY) <= 2
    assert h not in parked(), f"heavy job still parked; younger jobs ran before it: {overtook}"


def test_a_parked_job_goes_before_younger_ready_jobs_of_its_kind(claimers: Any) -> None:
    """Weight 1 everywhere: the permit freed goes to the parked (older) job, not to a younger
    job of the kind still in its lane."""
    kind_limit(HEAVY, global_concurrency=1)
    a, b = claimers(4), claimers(4)
    [l1] = enqueue(HEAVY)
    assert a.claim(4) == [l1]
    [p] = enqueue(HEAVY)
    assert b.claim(4) == [] and parked() == [p]
    [young] = enqueue(HEAVY)
    a.hand_back([l1])
    assert b.claim(1) == [p]
    assert parked() == [young] or young not in b.held


def test_heavy_job_of_a_kind_with_burst_1_and_concurrency_comes_back(claimers: Any) -> None:
    kind_limit(HEAVY, global_concurrency=3, rate_limit=4, rate_burst=1)
    a, b = claimers(4), claimers(4)
    [l1] = enqueue(HEAVY)
    assert a.claim(4) == [l1]  # the only token
    [h] = enqueue(HEAVY, weight=3)
    got = b.claim(4)
    if got:  # a token came meanwhile (4/s): h fits beside l1? 1 + 3 > 3, so it cannot
        raise AssertionError(f"claimed {got} past the kind's limit of 3")
    assert parked() == [h]
    a.hand_back([l1])
    got = wait_for(lambda: b.claim(4), timeout=5, interval=0.05, message="the heavy job")
    assert got == [h] and b.held[h][2] == 3 and kind_permits(HEAVY) == 3


def test_rate_bounds_the_jobs_unparked_and_weights_do_not_use_up_tokens(claimers: Any) -> None:
    """Rate only (no concurrency): 6 parked jobs of weight 3 on claimers of 4 units; each
    claim starts at most what its units allow, the rate counts jobs (not weight), and over the
    run at most rate * t + burst jobs start."""
    import time

    kind_limit(HEAVY, rate_limit=5, rate_burst=2)
    a = claimers(4)
    first = enqueue(HEAVY, n=2)
    assert a.claim(4) == first  # the burst
    heavy = enqueue(HEAVY, weight=9, n=6)  # counts as 4 (the claimer's units)
    t0 = time.monotonic()
    b = claimers(4)
    started: list[tuple[float, int]] = []

    def step() -> bool:
        b.finish(list(b.held))
        for job_id in b.claim(4):
            started.append((time.monotonic() - t0, job_id))
            assert b.held[job_id][2] == 4
        return len(started) == 6

    wait_for(step, timeout=10, interval=0.02, message=lambda: f"6 heavy jobs, got {started}")
    elapsed = time.monotonic() - t0
    assert sorted(j for _, j in started) == heavy
    assert [j for _, j in started] == heavy, "parked jobs un-parked out of order"
    assert 5 * elapsed + 2 + 0.5 >= 6  # at most rate * t + burst (plus the clock's slack)
    assert elapsed >= (6 - 1) / 5 * 0.8, f"6 jobs past a 5/s rate in {elapsed:.2f}s"


def test_queue_limit_below_the_kind_limit_caps_the_parked_weight(claimers: Any) -> None:
    """Queue limit 2, kind limit 5, claimers of 8: a parked job of weight 5 counts as 2, so
    it comes back when 2 of the kind's permits (and 2 of the queue's) are free."""
    queue_limit(Q, global_concurrency=2)
    kind_limit(HEAVY, global_concurrency=5)
    kind_limit(LIGHT, global_concurrency=5)
    a, b = claimers(8), claimers(8)
    # The kind's permits are taken in another queue (limits span queues), the queue's own are
    # free: the heavy job parks on its kind.
    busy = enqueue(HEAVY, queue=Q2, n=5)
    assert a.claim(8, queue=Q2) == busy
    [h] = enqueue(HEAVY, weight=5)
    assert b.claim(8) == [] and parked() == [h]
    a.hand_back(busy[:1])
    assert b.claim(8) == [] and parked() == [h]  # one free: 2 wanted
    a.hand_back(busy[1:2])
    assert b.claim(8) == [h]
    # 2 queue permits, 3 above the queue's limit (its weight, should the limit be raised), and
    # 2 kind permits.
    assert b.held[h][2] == 2 and len(b.held[h][0]) == 7
    assert queue_permits(Q) == 5 and queue_permits(Q, 2) == 2
    assert kind_permits(HEAVY) == 5  # 3 in upk2, 2 here


def test_unparked_job_blocked_by_queue_permits_waits_in_the_ready_ring(claimers: Any) -> None:
    """Un-parking looks at the kind's permits only: a job moved back while its queue's
    permits are taken is claimed once they free, not lost, and nothing passes the limits."""
    queue_limit(Q, global_concurrency=4)
    kind_limit(HEAVY, global_concurrency=2)
    a, b, c = claimers(8), claimers(8), claimers(8)
    l1, l2 = enqueue(HEAVY, n=2)
    assert a.claim(8) == [l1, l2]
    [h] = enqueue(HEAVY, weight=2)
    o1, o2, o3 = enqueue(OTHER, n=3)
    assert b.claim(2) == [o1, o2] and parked() == [h]  # queue: 4 of 4
    a.hand_back([l1, l2])  # kind: 0 of 2, queue 2 of 4
    assert c.claim(1) == [o3]  # queue 3 of 4; one unit: h stays parked
    assert parked() == [h]
    assert b.claim(8) == []  # h moved back, but one queue permit is free: 2 wanted
    assert queue_permits(Q) == 3 and kind_permits(HEAVY) == 0
    b.hand_back([o1])
    assert b.claim(8) == [h]
    assert parked() == [] and states([h]) == {h: "running"}
    assert queue_permits(Q) == 4 and kind_permits(HEAVY) == 2


def _fill_and_park(
    claimers: Any, limit: int, weight: int
) -> tuple[Claimer, Claimer, list[int], int]:
    """``limit`` light jobs of HEAVY running on ``a`` (every permit of the kind), then one of
    ``weight`` parked by ``b``."""
    a, b = claimers(8), claimers(8)
    light = enqueue(HEAVY, n=limit)
    assert a.claim(8) == light
    [h] = enqueue(HEAVY, weight=weight)
    assert b.claim(8) == [] and parked() == [h]
    return a, b, light, h


def test_kind_limit_lowered_while_a_heavy_job_is_parked(claimers: Any) -> None:
    kind_limit(HEAVY, global_concurrency=4)
    a, b, light, h = _fill_and_park(claimers, 4, 4)
    kind_limit(HEAVY, global_concurrency=2)
    a.hand_back(light[:2])  # 2 held, limit 2: nothing free
    assert b.claim(8) == [] and parked() == [h]
    assert kind_permits(HEAVY) == 2
    a.hand_back(light[2:3])
    assert b.claim(8) == [] and parked() == [h]  # one free: it counts 2 now
    a.hand_back(light[3:])
    assert b.claim(8) == [h]
    # 4 units: the kind's 2 permits, and 2 above its limit (its weight, should it be raised).
    assert b.held[h][2] == 4 and len(b.held[h][0]) == 4
    assert kind_permits(HEAVY) == 4 and kind_permits(HEAVY, 2) == 2


def test_kind_limit_raised_while_a_heavy_job_is_parked(claimers: Any) -> None:
    kind_limit(HEAVY, global_concurrency=2)
    _a, b, _light, h = _fill_and_park(claimers, 2, 4)
    kind_limit(HEAVY, global_concurrency=6)  # 4 free now: h counts 4
    assert b.claim(8) == [h] and b.held[h][2] == 4
    assert kind_permits(HEAVY) == 6


def test_kind_limit_cleared_while_a_heavy_job_is_parked(claimers: Any) -> None:
    kind_limit(HEAVY, global_concurrency=2)
    a, b, light, h = _fill_and_park(claimers, 2, 5)
    clear_kind_limits(HEAVY, actor="upk-test")  # no @job for it: no limit at all
    assert b.claim(8) == [h] and b.held[h][2] == 5
    assert parked() == []
    a.hand_back(light)
    b.hand_back([h])
    assert kind_permits(HEAVY) == 0


def test_queue_limit_lowered_and_cleared_while_a_heavy_job_is_parked(claimers: Any) -> None:
    kind_limit(HEAVY, global_concurrency=4)
    a, b, light, h = _fill_and_park(claimers, 4, 4)
    queue_limit(Q, global_concurrency=1)  # the four light ones started before: no permits
    a.hand_back(light[:3])  # 3 of the kind's free, h counts 1 now
    assert b.claim(8) == [h] and b.held[h][2] == 1
    assert queue_permits(Q) == 4 and queue_permits(Q, 1) == 1 and kind_permits(HEAVY) == 2
    [h2] = enqueue(HEAVY, weight=4)
    assert b.claim(8) == []  # the queue's one permit is h's
    b.hand_back([h])
    from awa_django.operator import clear_queue_limits

    clear_queue_limits(Q, actor="upk-test")  # no settings: no queue limit, h2 counts 4 again
    a.hand_back(light[3:])
    assert b.claim(8) == [h2] and b.held[h2][2] == 4 and kind_permits(HEAVY) == 4


def test_cancelling_the_heavy_parked_job_lets_younger_parked_ones_go(claimers: Any) -> None:
    from awa_django.operator import cancel

    kind_limit(HEAVY, global_concurrency=2)
    a, b, light, h = _fill_and_park(claimers, 2, 2)
    p1, p2 = enqueue(HEAVY, n=2)
    assert b.claim(8) == [] and parked() == [h, p1, p2]
    a.hand_back(light[:1])
    assert b.claim(8) == []  # documented: p1, p2 wait behind h
    assert cancel(h) is not None
    assert parked() == [p1, p2] and states([h]) == {h: "cancelled"}
    assert b.claim(8) == [p1]
    a.hand_back(light[1:])
    assert b.claim(8) == [p2]
    assert parked() == [] and kind_permits(HEAVY) == 2


def test_cancelling_a_parked_job_while_a_claim_unparks_it(claimers: Any) -> None:
    """A cancel holding the parked row: the un-park passes over it (SKIP LOCKED), the cancel
    wins, nothing is claimed twice or lost."""
    kind_limit(HEAVY, global_concurrency=2)
    a, b, light, h = _fill_and_park(claimers, 2, 2)
    [p] = enqueue(HEAVY)
    assert b.claim(8) == [] and parked() == [h, p]
    a.hand_back(light)
    with pg(autocommit=False) as locker:
        locker.execute("SELECT 1 FROM awa.flow_waiting WHERE job_id = %s FOR UPDATE", [h])
        got = b.claim(8)  # h is passed over; p is younger: does it overtake?
        locker.rollback()
    assert h not in got
    assert kind_permits(HEAVY) <= 2
    got += b.claim(8)
    assert got == [h]  # p (younger) did not overtake it, and now the kind is full again
    assert parked() == [p] and kind_permits(HEAVY) == 2
    b.hand_back([h])
    assert b.claim(8) == [p] and parked() == []


def test_serial_key_on_a_heavy_parked_job(claimers: Any) -> None:
    """A heavy job with a key, parked by its kind, takes no key; a younger job of the key (of
    another kind) parks behind it; once the heavy one fits it runs, then the key goes on."""
    kind_limit(HEAVY, global_concurrency=2)
    a, b = claimers(4), claimers(4)
    light = enqueue(HEAVY, n=2)
    assert a.claim(4) == light
    [h] = enqueue(HEAVY, weight=3, serial="acct:1")
    [j] = enqueue(OTHER, serial="acct:1")
    [free] = enqueue(OTHER, serial="acct:2")
    assert b.claim(4) == [free]
    assert parked() == [h]
    a.hand_back(light[:1])
    assert b.claim(4) == []
    a.hand_back(light[1:])
    assert b.claim(4) == [h]
    # The kind's 2 permits and 1 above its limit.
    assert b.held[h][1] is not None and b.held[h][2] == 3 and len(b.held[h][0]) == 3
    c = claimers(4)
    assert c.claim(4) == []  # j waits for h's key
    b.finish([h])
    got = b.claim(4)  # hands the key on, and may take j itself
    if not got:
        got = wait_for(lambda: c.claim(4), timeout=5, message="the key's next job")
    assert got == [j]
    assert states([h, j, free]) == {h: "completed", j: "running", free: "running"}


def test_parked_heavy_jobs_in_two_queues_both_run(claimers: Any) -> None:
    kind_limit(HEAVY, global_concurrency=2)
    a, b = claimers(8), claimers(8)
    light = enqueue(HEAVY, n=2)
    assert a.claim(8) == light
    [h1] = enqueue(HEAVY, weight=2)
    [h2] = enqueue(HEAVY, weight=2, queue=Q2)
    assert b.claim(8) == [] and b.claim(8, queue=Q2) == []
    assert parked() == [h1, h2]
    a.hand_back(light)
    assert b.claim(8, queue=Q2) == [h2]
    assert b.claim(8) == []  # the queue that claimed first got them (documented)
    b.hand_back([h2])
    assert b.claim(8) == [h1]
    assert kind_permits(HEAVY) == 2


def test_younger_parked_jobs_of_higher_priority_wait_only_until_the_heavy_one_fits(
    claimers: Any,
) -> None:
    kind_limit(HEAVY, global_concurrency=3)
    a, b = claimers(8), claimers(8)
    light = enqueue(HEAVY, n=3)
    assert a.claim(8) == light
    [h] = enqueue(HEAVY, weight=3, priority=5)
    urgent = enqueue(HEAVY, priority=-5, n=2)
    assert b.claim(8) == []
    assert parked() == [h, *urgent]
    a.hand_back(light[:2])
    assert b.claim(8) == []  # documented: the younger ones wait behind h
    a.hand_back(light[2:])
    got = b.claim(8)
    assert h in got, got
    b.hand_back(got)
    rest = got[1:] + b.claim(8)
    assert sorted(rest) == urgent and parked() == []


@pytest.mark.parametrize(
    ("p_max", "max_weight"),
    [
        (None, None),
        (0, 0),
        (-1, -7),
        (1, 0),
        (5, -7),
        (5, 10**6),
        (2**31 - 1, None),
        (2**31 - 1, 2**31 - 1),
    ],
)
def test_raw_sql_claims_with_odd_bounds_leave_nothing_corrupt(
    claimers: Any, max_weight: int | None, p_max: int | None
) -> None:
    """Raw-SQL claimers passing odd ``p_max``/``p_max_weight`` over parked heavy jobs: no
    error (or a clear one), never past the kind's limit, permits all handed back, and every
    job still claimed exactly once by a normal claimer afterwards."""
    kind_limit(HEAVY, global_concurrency=3)
    a, b = claimers(3), claimers(3)
    light = enqueue(HEAVY, n=3)
    assert a.claim(3) == light
    heavy = enqueue(HEAVY, weight=7, n=3)
    assert b.claim(3) == [] and parked() == heavy
    a.hand_back(light[:2])
    odd = claimers(max_weight)
    got = odd.claim(p_max)
    if p_max is None or p_max <= 0:
        assert got == [] and parked() == heavy
    else:
        # A weight counts as min(weight, p_max_weight (at least 1), the kind's limit).
        cap = 3 if max_weight is None else min(max(max_weight, 1), 3)
        if cap <= 2:  # two of the kind's permits are free
            assert got, "nothing claimed though the parked jobs fit"
        for job_id in got:
            assert len(odd.held[job_id][0]) == cap
    assert kind_permits(HEAVY) <= 3
    odd.hand_back(list(odd.held))
    a.hand_back(light[2:])
    assert kind_permits(HEAVY) == 0
    done = set(got)
    for _ in range(10):
        batch = b.claim(3)
        assert not done & set(batch), f"claimed twice: {done & set(batch)}"
        done |= set(batch)
        b.hand_back(batch)
        if done == set(heavy):
            break
    assert done == set(heavy) and parked() == [] and kind_permits(HEAVY) == 0


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_fuzz_mixed_claimers_weights_and_kinds(claimers: Any, seed: int) -> None:
    """Claimers of 2, 3 and 8 units; a queue limit of 6; kinds limited to 3 and 2 (the second
    also rated, not binding); weights 1-9, some serial keys. After every step: no limit is
    passed; at the end, with the load gone, every job runs exactly once and nothing stays
    parked or held."""
    import random

    rnd = random.Random(seed)
    queue_limit(Q, global_concurrency=6)
    kind_limit(HEAVY, global_concurrency=3)
    kind_limit(LIGHT, global_concurrency=2, rate_limit=10000, rate_burst=100)
    pool = [claimers(2), claimers(3), claimers(8)]
    jobs: list[int] = []
    ran: dict[int, int] = {}
    owner: dict[int, Claimer] = {}

    def check() -> None:
        # Permits above a limit are held only by a job heavier than the limit, which holds
        # every permit below it: more than the limit is held only while those are all taken.
        for held, below, limit in (
            (queue_permits(Q), queue_permits(Q, 6), 6),
            (kind_permits(HEAVY), kind_permits(HEAVY, 3), 3),
            (kind_permits(LIGHT), kind_permits(LIGHT, 2), 2),
        ):
            assert below <= limit and (held <= limit or below == limit), (held, below, limit)
        seen: set[int] = set()
        for c in pool:
            assert not seen & set(c.held), "a job held by two sessions"
            seen |= set(c.held)

    def claim(c: Claimer) -> None:
        for job_id in c.claim(max(c.wcap - c.units(), 0)):  # type: ignore[operator]
            ran[job_id] = ran.get(job_id, 0) + 1
            owner[job_id] = c

    for _ in range(120):
        r = rnd.random()
        if r < 0.35:
            kind = rnd.choice([HEAVY, HEAVY, LIGHT, OTHER])
            serial = rnd.choice([None, None, None, "k1", "k2"])
            jobs += enqueue(kind, weight=rnd.choice([1, 1, 2, 3, 5, 9]), serial=serial)
        elif r < 0.75:
            claim(rnd.choice(pool))
        else:
            c = rnd.choice(pool)
            if c.held:
                c.finish(rnd.sample(sorted(c.held), rnd.randint(1, len(c.held))))
        check()
    for _ in range(200):
        for c in pool:
            if c.held:
                c.finish(list(c.held))
            claim(c)
            check()
        if len(ran) == len(jobs) and not any(c.held for c in pool):
            break
    assert ran == dict.fromkeys(jobs, 1), {
        "never ran": sorted(set(jobs) - set(ran)),
        "parked": parked(),
        "twice": [j for j, n in ran.items() if n > 1],
    }
    assert parked() == [] and queue_permits(Q) == 0 and kind_permits(HEAVY) == 0
    assert set(states(jobs).values()) == {"completed"}


# --- Real workers -------------------------------------------------------------------------

WQ = "upkw"


@pytest.fixture
def runs() -> Iterator[None]:
    with pg() as conn:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS upk_runs (job_id bigint, kind text, attempt int,"
            " pid int, started timestamptz, ended timestamptz)"
        )
        conn.execute("CREATE TABLE IF NOT EXISTS upk_flags (name text PRIMARY KEY)")
        conn.execute("TRUNCATE upk_runs, upk_flags")
    yield
    with pg() as conn:
        conn.execute("DROP TABLE IF EXISTS upk_runs, upk_flags")


def worker(manage_py: Any, *args: str, **overrides: Any) -> Any:
    from tests.jobs import kind_unpark, worker_env

    env = worker_env(kind_unpark, **overrides)
    return manage_py("awa_worker", "--queue", WQ, *args, extra_env=env)


def wjob(kind: str, weight: int = 1, block: str | None = None, priority: int = 0) -> int:
    body: dict[str, Any] = {
        "kind": kind,
        "queue": WQ,
        "priority": priority,
        "args": {"args": [], "kwargs": {"block": block} if block else {}},
        "metadata": {"awa:weight": weight},
    }
    with pg() as conn:
        [(job_id, _)] = enqueue_sql(conn, json.dumps([body]))
    return job_id


def ended(job_ids: Sequence[int]) -> bool:
    rows = (
        _observer[0]
        .execute(
            "SELECT count(*) FROM upk_runs WHERE job_id = ANY(%s) AND ended IS NOT NULL",
            [list(job_ids)],
        )
        .fetchone()
    )
    return rows is not None and rows[0] == len(job_ids)


@pytest.mark.usefixtures("runs")
def test_worker_with_a_claim_batch_below_a_weight_runs_the_heavy_job(manage_py: Any) -> None:
    """docs/flow.md, "Weights": a weight above what the claiming process can run counts as
    that bound, so a heavy job never blocks its lane for ever. A worker of 4 slots with
    ``CLAIM_BATCH_SIZE`` 2 caps weights at 4 but asks for at most 2 units per claim: a job of
    weight 3 would never fit any of its claims."""
    h = wjob("upkw.heavy", weight=3)
    w = worker(manage_py, "--concurrency", "4", CLAIM_BATCH_SIZE=2)
    # The worker claims: a light job in another lane (another priority) runs.
    light = wjob("upkw.light", priority=-1)
    wait_for(lambda: ended([light]), timeout=15, message=lambda: f"the light job; {w.output()}")
    wait_for(lambda: ended([h]), timeout=5, message=lambda: f"the heavy job; {w.output()}")


def wparked() -> list[int]:
    return parked(WQ)


def flag(name: str) -> None:
    _observer[0].execute("INSERT INTO upk_flags VALUES (%s) ON CONFLICT DO NOTHING", [name])


def started(job_id: int) -> bool:
    row = _observer[0].execute("SELECT count(*) FROM upk_runs WHERE job_id = %s", [job_id])
    one = row.fetchone()
    return one is not None and one[0] > 0


@pytest.mark.usefixtures("runs")
def test_sigkill_of_the_worker_holding_the_permits_a_heavy_parked_job_waits_for(
    manage_py: Any,
) -> None:
    import signal

    kind_limit("upkw.heavy", global_concurrency=3)
    blocker = wjob("upkw.heavy", weight=2, block="never")
    a = worker(manage_py, "--concurrency", "4")
    wait_for(lambda: started(blocker), timeout=15, message=lambda: f"blocker; {a.output()}")
    b = worker(manage_py, "--concurrency", "4")
    h = wjob("upkw.heavy", weight=5)  # counts 3: parked while the blocker holds 2
    wait_for(lambda: wparked() == [h], timeout=10, message="the heavy job parked")
    assert not started(h)
    a.send_signal(signal.SIGKILL)
    a.wait()
    wait_for(lambda: ended([h]), timeout=10, message=lambda: f"the heavy job; {b.output()}")
    assert wparked() == [] and kind_permits("upkw.heavy") == 0


@pytest.mark.usefixtures("runs")
def test_mixed_fleet_runs_heavy_parked_jobs_without_busy_polling_or_churn(
    manage_py: Any,
) -> None:
    """A worker of 2 slots and one of 8 on one queue; a kind limited to 6; a blocker holds 4
    of its permits while three jobs of weight 6 wait parked. While they wait, the workers claim
    about once per POLL_INTERVAL (0.25 s), not in a loop, and the parked jobs are not moved
    back and parked again over and over; once the blocker ends all three run."""
    from django.db import connection

    db = connection.settings_dict["NAME"]
    with pg() as conn:
        conn.execute(f"ALTER DATABASE \"{db}\" SET track_functions = 'pl'")
    try:
        kind_limit("upkw.heavy", global_concurrency=6)
        blocker = wjob("upkw.heavy", weight=4, block="go")
        big = worker(manage_py, "--concurrency", "8", POLL_INTERVAL=0.25)
        wait_for(lambda: started(blocker), timeout=15, message=lambda: big.output())
        small = worker(manage_py, "--concurrency", "2", POLL_INTERVAL=0.25)
        heavy = [wjob("upkw.heavy", weight=6, block="go") for _ in range(3)]
        # The small worker counts each as 2 (its slots): 2 are free, so one may run there.
        wait_for(lambda: any(started(j) for j in heavy), timeout=10, message="a heavy job started")

        def calls() -> int:
            row = (
                _observer[0]
                .execute(
                    "SELECT pg_stat_force_next_flush(), coalesce(sum(calls), 0)"
                    " FROM pg_stat_user_functions WHERE funcname = 'claim_v3'"
                )
                .fetchone()
            )
            return int(row[1]) if row else 0

        def parks() -> int:
            row = (
                _observer[0]
                .execute(
                    "SELECT count(*) FROM awa.claim_closures WHERE outcome = 'parked'"
                    " AND job_id = ANY(%s)",
                    [heavy],
                )
                .fetchone()
            )
            return int(row[0]) if row else 0

        import time

        before_calls, before_parks, t0 = calls(), parks(), time.monotonic()
        # At least 12 claims while the jobs stay parked (about 1.5 s at one claim per 0.25 s
        # per worker): busy polling would show hundreds at the first stats flush.
        during_calls = wait_for(
            lambda: max(calls() - before_calls, 0) // 12 and calls() - before_calls,
            timeout=15,
            interval=0.1,
            message="the workers' claims",
        )
        window = time.monotonic() - t0
        during_parks = parks() - before_parks
        assert sum(started(j) for j in heavy) == 1  # 4 + 2 of 6: the others wait
        flag("go")
        wait_for(
            lambda: ended([blocker, *heavy]),
            timeout=20,
            message=lambda: f"the heavy jobs; {small.output()}\n{big.output()}",
        )
    finally:
        with pg() as conn:
            conn.execute(f'ALTER DATABASE "{db}" RESET track_functions')
    # 2 workers at one claim per 0.25 s: about 16 in 2 s (NOTIFY wake-ups add a few).
    assert during_calls <= 60, f"{during_calls} claims in {window:.1f}s: busy polling"
    assert during_parks <= 6, f"parked jobs re-parked {during_parks} times in {window:.1f}s"
    runs_per_job = (
        _observer[0]
        .execute(
            "SELECT job_id, count(*) FROM upk_runs WHERE job_id = ANY(%s) GROUP BY job_id",
            [heavy],
        )
        .fetchall()
    )
    assert dict(runs_per_job) == dict.fromkeys(heavy, 1)
    assert wparked() == [] and kind_permits("upkw.heavy") == 0


def test_pause_drain_and_resume_with_heavy_jobs_parked(claimers: Any) -> None:
    from awa_django.operator import queue_drain, queue_pause

    kind_limit(HEAVY, global_concurrency=2)
    a, b, light, h = _fill_and_park(claimers, 2, 3)
    queue_pause(Q)
    a.hand_back(light)
    assert b.claim(8) == [] and parked() == [h]  # paused: nothing un-parked or claimed
    queue_pause(Q, paused=False)
    assert b.claim(8) == [h]
    [h2] = enqueue(HEAVY, weight=3)
    assert b.claim(8) == [] and parked() == [h2]
    assert queue_drain(Q) == 1
    assert parked() == [] and states([h2]) == {h2: "cancelled"}
    b.hand_back([h])
    assert b.claim(8) == [] and kind_permits(HEAVY) == 0


@pytest.mark.parametrize("raw", [0, -3, 10_001, "2", 2.5, None, True])
def test_a_parked_job_with_an_invalid_raw_weight_comes_back_as_weight_1(
    claimers: Any, raw: Any
) -> None:
    kind_limit(HEAVY, global_concurrency=1)
    a, b = claimers(8), claimers(8)
    [l1] = enqueue(HEAVY)
    assert a.claim(8) == [l1]
    body = {"kind": HEAVY, "queue": Q, "metadata": {"awa:weight": raw}}
    with pg() as conn:
        [(h, _)] = enqueue_sql(conn, json.dumps([body]))
    assert b.claim(8) == [] and parked() == [h]
    a.hand_back([l1])
    assert b.claim(8) == [h]
    assert b.held[h][2] == 1 and len(b.held[h][0]) == 1


def test_serial_sweep_does_not_run_a_younger_job_of_the_key_before_a_parked_heavy_one(
    claimers: Any,
) -> None:
    """docs/flow.md: a key and a limited kind on one job. The heavy job of key k waits for its
    kind; a younger job of k (another kind, not limited) waits behind it. The leader's sweep may
    hand the key on to the younger one, which must park again at once: one at a time and
    enqueue order within the key hold."""
    kind_limit(HEAVY, global_concurrency=2)
    a, b = claimers(8), claimers(8)
    light = enqueue(HEAVY, n=2)
    assert a.claim(8) == light
    [h] = enqueue(HEAVY, weight=2, serial="k")
    [j] = enqueue(OTHER, serial="k")
    assert b.claim(8) == []
    assert parked() == [h]
    for _ in range(3):
        _observer[0].execute("SELECT awa.serial_sweep_v1()")
        assert b.claim(8) == [], "the younger job of the key ran before the older one"
    a.hand_back(light)
    assert b.claim(8) == [h]
    b.finish([h])
    got = b.claim(8)
    assert got == [j]
    assert states([h, j]) == {h: "completed", j: "running"}


def test_concurrent_claimers_racing_to_unpark_never_pass_the_limits(claimers: Any) -> None:
    """Three sessions of 2, 3 and 8 units claim and finish in threads at once over parked jobs
    of weights 1-9 (kind limit 4, queue limit 5); a sampler reads the permits held all along.
    Never more than the limits; every job runs once; nothing stays parked or held."""
    import random
    import threading

    queue_limit(Q, global_concurrency=5)
    kind_limit(HEAVY, global_concurrency=4)
    rnd = random.Random(7)
    pool = [claimers(2), claimers(3), claimers(8)]
    blockers = enqueue(HEAVY, n=4)
    assert pool[2].claim(8) == blockers
    jobs: list[int] = []
    for _ in range(30):
        jobs += enqueue(rnd.choice([HEAVY, HEAVY, OTHER]), weight=rnd.choice([1, 2, 3, 5, 9]))
    ran: dict[int, int] = {}
    for c in pool[:2]:  # they park what their kind holds back
        ran.update(dict.fromkeys(c.claim(c.wcap), 1))
    lock = threading.Lock()
    stop = threading.Event()
    errors: list[BaseException] = []
    peaks = {"queue": 0, "kind": 0}

    def sample() -> None:
        with pg() as conn:
            _observer.insert(0, conn)
            try:
                while not stop.is_set():
                    peaks["queue"] = max(peaks["queue"], queue_permits(Q))
                    peaks["kind"] = max(peaks["kind"], kind_permits(HEAVY))
            finally:
                _observer.remove(conn)

    def run(c: Claimer, seed: int) -> None:
        r = random.Random(seed)
        try:
            for _ in range(200):
                if c.held and r.random() < 0.5:
                    c.finish(r.sample(sorted(c.held), 1))
                for job_id in c.claim(max(c.wcap - c.units(), 0)):  # type: ignore[operator]
                    with lock:
                        ran[job_id] = ran.get(job_id, 0) + 1
                with lock:
                    if len(ran) == len(jobs) and not c.held:
                        return
        except BaseException as exc:
            errors.append(exc)

    sampler = threading.Thread(target=sample)
    sampler.start()
    pool[2].finish(blockers)
    threads = [threading.Thread(target=run, args=(c, i)) for i, c in enumerate(pool)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    stop.set()
    sampler.join(10)
    assert not errors, errors
    for _ in range(100):  # the load gone: whatever is left runs
        for c in pool:
            if c.held:
                c.finish(list(c.held))
            for job_id in c.claim(c.wcap):
                ran[job_id] = ran.get(job_id, 0) + 1
        if len(ran) == len(jobs):
            break
    missing = sorted(set(jobs) - set(ran))
    assert not missing, {
        "never ran": missing,
        "states": states(missing),
        "parked": parked(),
        "markers": [c.last_marker for c in pool],
    }
    assert peaks["queue"] <= 5 and peaks["kind"] <= 4, peaks
    assert ran == dict.fromkeys(jobs, 1), {
        "never ran": sorted(set(jobs) - set(ran)),
        "parked": parked(),
    }


def test_a_job_unparked_by_a_claimer_without_the_units_is_claimed_by_one_with_them(
    claimers: Any,
) -> None:
    """Kind limit 2, weight 5: the job takes 5 of a process's units but 2 of the kind's
    permits. A busy claimer (3 units free) may move it back without taking it; it must not be
    lost or stuck: an idle claimer of 8 takes it, counting 5 units: the kind's 2 permits and 3
    above its limit."""
    kind_limit(HEAVY, global_concurrency=2)
    a, b, light, h = _fill_and_park(claimers, 2, 5)
    a.hand_back(light)
    busy = claimers(8)
    assert busy.claim(3) == []
    assert kind_permits(HEAVY) == 0
    got = b.claim(8)
    assert got == [h] and b.held[h][2] == 5 and len(b.held[h][0]) == 5
    assert parked() == []


@pytest.mark.usefixtures("runs")
def test_per_queue_cap_bounds_the_parked_weight(manage_py: Any) -> None:
    """``--queue upkw=2`` in a worker of 8: a parked job of weight 6 (kind limit 6) counts 2
    there, so it runs once 2 permits are free (not 6)."""
    kind_limit("upkw.heavy", global_concurrency=6)
    holder = Claimer(8)
    try:
        busy = [wjob("upkw.heavy") for _ in range(5)]
        assert sorted(holder.claim(8, queue=WQ)) == busy  # 5 of the kind's 6 permits
        h = wjob("upkw.heavy", weight=6)
        from tests.jobs import kind_unpark, worker_env

        env = worker_env(kind_unpark)
        w = manage_py("awa_worker", "--queue", f"{WQ}=2", "--concurrency", "8", extra_env=env)
        wait_for(lambda: wparked() == [h], timeout=15, message=lambda: w.output())
        holder.finish(busy[:1])
        holder.claim(0)  # 2 free now
        wait_for(lambda: ended([h]), timeout=10, message=lambda: f"the heavy job; {w.output()}")
    finally:
        holder.close()


def test_unpark_counts_units_as_the_claim_does_not_only_kind_permits(claimers: Any) -> None:
    """The claim counts a job of weight 5 of a kind limited to 2 as 5 units of the process and 2
    permits of the kind. A claimer with 4 units free must not move it back (it cannot take it):
    moved, it heads the hand-off lane and blocks the parked job of another kind behind it, which
    that claim had room for."""
    kind_limit(HEAVY, global_concurrency=2)
    kind_limit(LIGHT, global_concurrency=1)
    a, b = claimers(8), claimers(8)
    light = enqueue(HEAVY, n=2)
    [l0] = enqueue(LIGHT)
    assert a.claim(8) == [*light, l0]
    [h] = enqueue(HEAVY, weight=5)
    [p] = enqueue(LIGHT)
    assert b.claim(8) == [] and parked() == [h, p]
    a.hand_back([*light, l0])
    busy = claimers(8)
    got = busy.claim(4)  # 4 units free: p fits, h does not
    try:
        assert got == [p], f"claimed {got}; parked now {parked()}"
    finally:  # not lost either way: a claimer with 8 units free takes what is left
        rest = [j for j in (h, p) if j not in got]
        assert sorted(b.claim(8)) == rest


def test_heavy_parked_job_and_a_younger_one_of_its_kind_and_key_run_in_order(
    claimers: Any,
) -> None:
    kind_limit(HEAVY, global_concurrency=3)
    a, b = claimers(8), claimers(8)
    light = enqueue(HEAVY, n=3)
    assert a.claim(8) == light
    [h] = enqueue(HEAVY, weight=3, serial="k")
    [j] = enqueue(HEAVY, serial="k")
    [other] = enqueue(HEAVY, serial="other")
    assert b.claim(8) == []
    assert parked() == [h, j, other]
    a.hand_back(light[:1])
    assert b.claim(8) == []  # h wants 3; j and other wait behind it (documented)
    a.hand_back(light[1:])
    got = b.claim(8)
    assert got == [h], got  # the kind is full again with h
    b.finish([h])
    seen: list[int] = []

    def both() -> bool:
        seen.extend(b.claim(8))
        return sorted(seen) == [j, other]

    wait_for(
        both,
        timeout=5,
        message=lambda: f"j and other; got {seen}, parked {parked()}",
    )
    assert kind_permits(HEAVY) == 2


@pytest.mark.usefixtures("runs")
def test_real_workers_run_heavy_jobs_of_a_kind_with_burst_1_within_its_rate(
    manage_py: Any,
) -> None:
    """Kind limited to 3 at once and 4 per second with a burst of 1; four jobs of weight 3 on
    two workers of 4 slots: all run, one at a time, and never faster than the rate."""
    kind_limit("upkw.heavy", global_concurrency=3, rate_limit=4, rate_burst=1)
    heavy = [wjob("upkw.heavy", weight=3) for _ in range(4)]
    ws = [worker(manage_py, "--concurrency", "4") for _ in range(2)]
    wait_for(
        lambda: ended(heavy),
        timeout=20,
        message=lambda: f"the heavy jobs; parked {wparked()}; {ws[0].output()}",
    )
    rows = (
        _observer[0]
        .execute(
            "SELECT started, ended FROM upk_runs WHERE job_id = ANY(%s) ORDER BY started", [heavy]
        )
        .fetchall()
    )
    assert len(rows) == 4
    for (_, e1), (s2, _) in itertools.pairwise(rows):
        assert s2 >= e1, "two jobs of weight 3 ran at once under a kind limit of 3"
    span = (rows[-1][0] - rows[0][0]).total_seconds()
    assert span >= 3 / 4 - 0.1, f"4 starts in {span:.2f}s: past 4/s with a burst of 1"


def test_unpark_of_a_rate_only_kind_counts_the_units_the_claim_has(claimers: Any) -> None:
    """Kind limited to 2 per second (burst 1) only; a job of weight 5 parked for want of a
    token; once a token comes, a claimer with 4 units free has no room for it and must leave
    it parked, taking the parked job of another kind behind it instead."""
    kind_limit(HEAVY, rate_limit=2, rate_burst=1)
    kind_limit(LIGHT, global_concurrency=1)
    a, b = claimers(8), claimers(8)
    [l1] = enqueue(HEAVY)
    [l0] = enqueue(LIGHT)
    assert a.claim(8) == [l1, l0]  # the token, and LIGHT's permit
    [h] = enqueue(HEAVY, weight=5)
    [p] = enqueue(LIGHT)
    got = b.claim(8)
    assert got == [] and parked() == [h, p], got
    a.hand_back([l0])

    # A token for the kind again (0.5 s at 2/s): the rate state's tat is in the past.
    def token() -> bool:
        row = (
            _observer[0]
            .execute(
                "SELECT tat <= clock_timestamp() FROM awa.flow_kind_rate_state WHERE kind = %s",
                [HEAVY],
            )
            .fetchone()
        )
        return bool(row and row[0])

    wait_for(token, timeout=5, message="a token")
    busy = claimers(8)
    got = busy.claim(4)  # 4 units free: p fits, h does not
    try:
        assert got == [p], f"claimed {got}; parked now {parked()}"
    finally:
        rest = [j for j in (h, p) if j not in got]
        assert sorted(wait_for(lambda: b.claim(8), timeout=5, message="the rest")) == rest


@pytest.mark.parametrize(
    "priorities",
    [(5, 0, 5, 0), (0, 5, 0, 5), (3, 3, -3, -3)],
)
def test_parked_jobs_across_priorities_come_back_within_the_free_permits(
    claimers: Any, priorities: tuple[int, ...]
) -> None:
    """Two of the kind's permits free, four parked jobs of weight 1 in two priorities: at most
    two are moved back (docs: "while their weights fit the permits free now"), so none is
    parked a second time by the claim that un-parks them; the two oldest go (with the
    priorities given, the two oldest are also never of a lower priority than the others)."""
    kind_limit(HEAVY, global_concurrency=2)
    a, b = claimers(8), claimers(8)
    light = enqueue(HEAVY, n=2)
    assert a.claim(8) == light
    waiting = [enqueue(HEAVY, priority=p)[0] for p in priorities]
    assert b.claim(8) == [] and parked() == waiting
    a.hand_back(light)
    got = b.claim(8)
    rows = (
        _observer[0]
        .execute(
            "SELECT job_id, count(*) FROM awa.claim_closures WHERE outcome = 'parked'"
            " AND job_id = ANY(%s) GROUP BY job_id",
            [waiting],
        )
        .fetchall()
    )
    assert dict(rows) == dict.fromkeys(waiting, 1), f"claimed {got}, parked {parked()}"
    assert sorted(got) == waiting[:2] and parked() == waiting[2:]
