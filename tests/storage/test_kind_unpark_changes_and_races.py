"""Jobs parked by their kind (docs/flow.md, "Per kind") while things change around them: the
kind's or the queue's limit lowered, raised or cleared, the heavy parked job cancelled (also
while a claim unparks it), the queue paused, drained and resumed, claimers racing to unpark,
raw claims with odd bounds, and a fuzz of claimers, weights and kinds. No limit is passed, no
permit leaks, no job is lost or claimed twice.

The tests drive ``awa.claim_v3`` from psycopg sessions directly (tests/support/unpark_sessions.py).
"""

from __future__ import annotations

from typing import Any

import pytest

from awa_django.operator import (
    clear_kind_limits,
)
from tests.support.database import pg
from tests.support.unpark_sessions import (
    HEAVY,
    LIGHT,
    OTHER,
    Claimer,
    Q,
    enqueue,
    fill_and_park,
    kind_limit,
    kind_permits,
    observer_conns,
    parked,
    queue_limit,
    queue_permits,
    states,
)

pytestmark = pytest.mark.usefixtures("clean_awa", "observer")


def test_kind_limit_lowered_while_a_heavy_job_is_parked(claimers: Any) -> None:
    kind_limit(HEAVY, global_concurrency=4)
    a, b, light, h = fill_and_park(claimers, 4, 4)
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
    _a, b, _light, h = fill_and_park(claimers, 2, 4)
    kind_limit(HEAVY, global_concurrency=6)  # 4 free now: h counts 4
    assert b.claim(8) == [h] and b.held[h][2] == 4
    assert kind_permits(HEAVY) == 6


def test_kind_limit_cleared_while_a_heavy_job_is_parked(claimers: Any) -> None:
    kind_limit(HEAVY, global_concurrency=2)
    a, b, light, h = fill_and_park(claimers, 2, 5)
    clear_kind_limits(HEAVY, actor="upk-test")  # no @job for it: no limit at all
    assert b.claim(8) == [h] and b.held[h][2] == 5
    assert parked() == []
    a.hand_back(light)
    b.hand_back([h])
    assert kind_permits(HEAVY) == 0


def test_queue_limit_lowered_and_cleared_while_a_heavy_job_is_parked(claimers: Any) -> None:
    kind_limit(HEAVY, global_concurrency=4)
    a, b, light, h = fill_and_park(claimers, 4, 4)
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
    a, b, light, h = fill_and_park(claimers, 2, 2)
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
    a, b, light, h = fill_and_park(claimers, 2, 2)
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


def test_pause_drain_and_resume_with_heavy_jobs_parked(claimers: Any) -> None:
    from awa_django.operator import queue_drain, queue_pause

    kind_limit(HEAVY, global_concurrency=2)
    a, b, light, h = fill_and_park(claimers, 2, 3)
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
            observer_conns.insert(0, conn)
            try:
                while not stop.is_set():
                    peaks["queue"] = max(peaks["queue"], queue_permits(Q))
                    peaks["kind"] = max(peaks["kind"], kind_permits(HEAVY))
            finally:
                observer_conns.remove(conn)

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
    # A job heavier than a limit holds the permits below it and those above it it can take
    # (so that a raised limit counts it in full), and runs alone: at most the heaviest weight
    # (9) is held at once. The weighted sum of running jobs is checked from the claimers' side
    # by the concurrent sessions of tests/storage/test_kind_limit_fast_path_sessions.py.
    assert peaks["queue"] <= 9 and peaks["kind"] <= 9, peaks
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
    a, b, light, h = fill_and_park(claimers, 2, 5)
    a.hand_back(light)
    busy = claimers(8)
    assert busy.claim(3) == []
    assert kind_permits(HEAVY) == 0
    got = b.claim(8)
    assert got == [h] and b.held[h][2] == 5 and len(b.held[h][0]) == 5
    assert parked() == []
