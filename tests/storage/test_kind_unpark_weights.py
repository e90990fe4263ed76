"""How jobs parked by their kind come back (docs/flow.md, "Per kind"): ``awa._flow_unpark_v2``
counts a parked job's weight as the claim counts it and bounds the jobs it moves by the kind's
rate tokens. A parked job is never stranded; queue and kind limits (counted by weight) and rates
are never exceeded; younger jobs of a kind wait behind a heavy parked one only until it fits;
serial keys and priorities keep their order.

The tests drive ``awa.claim_v3`` from two or three psycopg sessions directly
(tests/support/unpark_sessions.py), so they are fast and deterministic.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.support.database import pg
from tests.support.factories import enqueue_sql
from tests.support.polling import wait_for
from tests.support.unpark_sessions import (
    HEAVY,
    LIGHT,
    OTHER,
    Q2,
    Q,
    enqueue,
    kind_limit,
    kind_permits,
    observer_conns,
    parked,
    queue_limit,
    queue_permits,
    states,
)

pytestmark = pytest.mark.usefixtures("clean_awa", "observer")


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
        observer_conns[0].execute("SELECT awa.serial_sweep_v1()")
        assert b.claim(8) == [], "the younger job of the key ran before the older one"
    a.hand_back(light)
    assert b.claim(8) == [h]
    b.finish([h])
    got = b.claim(8)
    assert got == [j]
    assert states([h, j]) == {h: "completed", j: "running"}


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


def test_unpark_of_a_rate_only_kind_counts_the_units_the_claim_has(claimers: Any) -> None:
    """Kind limited to one job every 2 s (burst 1) only; a job of weight 5 parked for want of
    a token; once a token comes, a claimer with 4 units free has no room for it and must leave
    it parked, taking the parked job of another kind behind it instead. (At 2 per second, a
    loaded machine took more than the 0.5 s to the next token between two claims.)"""
    kind_limit(HEAVY, rate_limit=0.5, rate_burst=1)
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

    # A token for the kind again (2 s at 0.5/s): the rate state's tat is in the past.
    def token() -> bool:
        row = (
            observer_conns[0]
            .execute(
                "SELECT tat <= clock_timestamp() FROM awa.flow_kind_rate_state WHERE kind = %s",
                [HEAVY],
            )
            .fetchone()
        )
        return bool(row and row[0])

    wait_for(token, timeout=10, message="a token")
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
        observer_conns[0]
        .execute(
            "SELECT job_id, count(*) FROM awa.claim_closures WHERE outcome = 'parked'"
            " AND job_id = ANY(%s) GROUP BY job_id",
            [waiting],
        )
        .fetchall()
    )
    assert dict(rows) == dict.fromkeys(waiting, 1), f"claimed {got}, parked {parked()}"
    assert sorted(got) == waiting[:2] and parked() == waiting[2:]
