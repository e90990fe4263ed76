"""The claim's fast path for limited kinds (the kind asked for the units left up front, the
second pass after an unlimited run, the probe before the lane lock), driven by raw
``awa.claim_v3`` sessions in process: a fuzz of kinds, weights, keys and limits, concurrent
sessions hammering one lane, a lowered limit counting old permits, heavy parked jobs never
stranded. Judged only by what docs/flow.md promises; helpers in tests/support/fast_path_runs.py.
"""

from __future__ import annotations

import json
import threading
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import pytest

import awa_django
from awa_django.operator import set_kind_limits
from tests.support.database import pg
from tests.support.fast_path_runs import (
    KIND_PERMIT_CLASS,
    RATES,
    Session,
    fuzz,
    set_limit,
    sound_window_violations,
)
from tests.support.polling import wait_for

pytestmark = pytest.mark.usefixtures("clean_awa")


@pytest.mark.parametrize(
    ("seed", "slots", "weights", "qlimit"),
    [
        (1, (6, 8, 10), (1, 1, 1, 2, 3, 4, 7, 12), None),
        (2, (6, 8, 10), (1, 1, 1, 2, 3, 4, 7, 12), 5),
        (3, (2, 3), (1, 1, 2), None),
        # Sessions smaller than the heavy jobs: a parked job whose min(weight, limit) is above
        # a session's slots is still un-parked.
        (4, (2, 3, 5), (1, 1, 2, 3, 4, 7), None),
    ],
)
def test_claim_v3_fuzz_kinds_weights_keys_limits(
    seed: int, slots: tuple[int, ...], weights: tuple[int, ...], qlimit: int | None
) -> None:
    """Three claim sessions of 2-8 slots claim from one queue where kinds limited to 1, 2, 3
    and 5 (some changed at runtime: lowered, raised, cleared), unlimited kinds and serial keys
    mix, with weights 1-12 (and raw-SQL producers' bad weights), new jobs arriving and the claim
    ring rotating. After every claim: each new job carries min(weight, limit) permits of its
    kind, a kind's running units never pass its limit, no permit is carried twice or held by a
    session for no running job, a key runs once at a time; at the end every job was claimed
    exactly once and each key's jobs in enqueue order."""
    fuzz(seed, 250, slots, weights, qlimit)


@pytest.mark.parametrize("changing", [False, True], ids=["fixed", "changing"])
def test_claim_v3_concurrent_sessions_hammer(changing: bool) -> None:
    """Four claim sessions in threads claim and hand back at once (the races of the fast path:
    probe before the lane lock, kinds asked up front and given back, the second pass), on a
    queue where kinds limited to 1, 2, 3 and 5, unlimited kinds and serial keys mix with
    weights 1-4 and producers keep adding jobs (Python COPY and raw SQL). Observed holding
    intervals (from the claim's return to the call that hands back) lie inside the real
    ones: a kind's units over overlapping intervals never pass its limit, a permit key and a
    serial key are never held twice at once, each job is claimed once, and all are claimed.
    ``changing``: a thread also sets the limits of two of the kinds (1-6, cleared) all the while,
    and jobs of kinds limited by rate (alone, and with 2 permits) mix in: each job still carries
    the permits of a limit in force, nothing is lost or claimed twice, rates hold over every
    window, and the sessions hold exactly the permits their running jobs carry."""
    import random
    import time

    kinds = {"fa3.k1": 1, "fa3.k2": 2, "fa3.k3": 3, "fa3.k5": 5}
    for kind, limit in kinds.items():
        set_limit(kind, limit)
    set_kind_limits("fa3.rated", rate_limit=20.0, rate_burst=4, actor="fa3")
    set_kind_limits("fa3.both", global_concurrency=2, rate_limit=30.0, rate_burst=3, actor="fa3")
    extra = ["fa3.rated", "fa3.both"] if changing else []
    changed = {"fa3.k3", "fa3.k5"} if changing else set()
    enqueued: list[int] = []
    serial_of: dict[int, str] = {}
    lock = threading.Lock()

    def produce(seed: int, n: int) -> None:
        rnd = random.Random(seed)
        for _ in range(n):
            batch = []
            for _ in range(rnd.randint(1, 8)):
                kind = rnd.choice([*kinds, *extra, "fa3.free", "fa3.free2"])
                key = rnd.choice([None, None, "p", "q"])
                opts: dict[str, Any] = {
                    "weight": rnd.choice([1, 1, 2, 4]),
                    "priority": rnd.choice([0, 3, 9]),
                }
                if key:
                    opts["serial_key"] = key
                batch.append((awa_django.get_job(kind).using(**opts).prepare(), key))
            if rnd.random() < 0.3:
                raw = [r.payload_value() for r, _ in batch]
                with pg() as c:
                    got = [
                        j
                        for (j,) in c.execute(
                            "SELECT job_id FROM awa.enqueue_v1(%s::jsonb)", [json.dumps(raw)]
                        ).fetchall()
                    ]
            else:
                from django.db import connection

                got = [j.id for j in awa_django.enqueue_many([r for r, _ in batch])]
                connection.close()
            with lock:
                enqueued.extend(got)
                for j, (_, key) in zip(got, batch, strict=True):
                    if key:
                        serial_of[j] = key

    held: list[dict[str, Any]] = []  # every claimed job with its observed holding interval
    errors: list[BaseException] = []
    stop = threading.Event()

    def claimer(seed: int) -> None:
        rnd = random.Random(seed)
        s = Session(rnd.choice([4, 6]))  # >= every min(weight, limit): see the stranding bug
        try:
            since: dict[int, float] = {}
            while not stop.is_set():
                release = [j for j in s.running if rnd.random() < 0.6]
                t_release = time.monotonic()
                entries = {j: s.running[j] for j in release}
                new = s.claim("fa3", release)
                t_claimed = time.monotonic()
                for j, e in entries.items():
                    held.append({**e, "from": since.pop(j), "to": t_release})
                for e in new:
                    since[e["job_id"]] = t_claimed
            for j, e in s.running.items():
                held.append({**e, "from": since[j], "to": time.monotonic()})
            with pg() as c:
                row = c.execute(
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"
                    " AND classid = %s AND pid = %s AND granted",
                    [KIND_PERMIT_CLASS, s.pid],
                ).fetchone()
            carried = sum(len(e["permits"]) for e in s.running.values())
            if row is None or row[0] != carried:
                raise AssertionError(f"session {s.pid} holds {row} permits, carries {carried}")
        except BaseException as exc:
            errors.append(exc)
        finally:
            s.conn.close()

    def change_limits() -> None:
        rnd = random.Random(99)
        while not stop.is_set():
            set_limit(rnd.choice(sorted(changed)), rnd.choice([1, 2, 4, 6, None]))
            stop.wait(0.03)  # a change every 30 ms, until the test stops the thread
        from django.db import connection

        connection.close()

    produce(0, 20)
    initial = set(enqueued)
    producers = [threading.Thread(target=produce, args=(i, 40)) for i in (1, 2)]
    claimers = [threading.Thread(target=claimer, args=(i,)) for i in range(4)]
    if changing:
        claimers.append(threading.Thread(target=change_limits))
    for t in producers + claimers:
        t.start()
    for t in producers:
        t.join()

    def unclaimed() -> str:
        missing = sorted(set(enqueued) - {h["job_id"] for h in held})
        with pg() as c:
            where = c.execute(
                "SELECT 'flow', job_id, kind, metadata FROM awa.flow_waiting"
                " WHERE job_id = ANY(%s) UNION ALL SELECT 'serial', job_id, kind, metadata"
                " FROM awa.serial_waiting WHERE job_id = ANY(%s)",
                [missing, missing],
            ).fetchall()
            limits = c.execute("SELECT kind, max_running, rate, burst FROM awa.flow_kind_limits")
        return (
            f"{len(enqueued) - len(missing)} of {len(enqueued)} claimed; missing {missing[:10]}"
            f" parked {where[:10]}; limits {limits.fetchall()}"
        )

    try:
        wait_for(
            lambda: len({h["job_id"] for h in held}) >= len(enqueued) or errors,
            timeout=30,
            message=unclaimed,
        )
    finally:
        stop.set()
        for t in claimers:
            t.join()
    assert errors == []
    problems: list[str] = []
    counts: dict[int, int] = defaultdict(int)
    for h in held:
        counts[h["job_id"]] += 1
    problems += [f"job {j} claimed {n} times" for j, n in counts.items() if n > 1]
    missing = set(enqueued) - set(counts)
    if missing:
        problems.append(f"never claimed: {sorted(missing)[:10]}")

    def overlap(items: list[dict[str, Any]], units: Callable[[dict[str, Any]], int]) -> int:
        events = sorted(
            [(h["from"], 1, units(h)) for h in items] + [(h["to"], 0, -units(h)) for h in items]
        )
        cur = peak = 0
        for _, _, u in events:
            cur += u
            peak = max(peak, cur)
        return peak

    for kind, limit in kinds.items():
        if kind in changed:
            continue
        mine = [h for h in held if h["kind"] == kind]
        # A job heavier than the limit holds every permit below it, and those above it it can
        # take (so that a raised limit counts it in full): it runs alone.
        bad = [h for h in mine if not min(h["weight"], limit) <= len(h["permits"]) <= h["weight"]]
        if bad:
            problems.append(f"{kind}: jobs with the wrong number of permits: {bad[:3]}")
        bound = max([limit] + [h["weight"] for h in mine])
        peak = overlap(mine, lambda h: h["weight"])
        if peak > bound:
            problems.append(f"{kind}: weight {peak} running at once, limit {limit}")
    by_permit: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for h in held:
        for k in h["permits"]:
            by_permit[k].append(h)
    for k, items in by_permit.items():
        if overlap(items, lambda h: 1) > 1:
            problems.append(f"permit key {k} held by two jobs at once")
    by_key: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for h in held:
        if h["job_id"] in serial_of:
            by_key[serial_of[h["job_id"]]].append(h)
    for key, items in by_key.items():
        if overlap(items, lambda h: 1) > 1:
            problems.append(f"serial key {key} held by two jobs at once")
        # Two producers' concurrent jobs of a key are ordered as they become visible; the jobs
        # enqueued before the claimers started were all visible: none of them may be claimed
        # after a younger job of its key.
        order = [h["job_id"] for h in sorted(items, key=lambda h: h["from"])]
        for i, j in enumerate(order):
            if j in initial and any(o > j for o in order[:i]):
                problems.append(f"serial key {key}: job {j} claimed after a younger one")
    # Each token was taken between the claim's transaction start and the row's return.
    with pg() as c:
        began = dict(
            c.execute(
                "SELECT id, extract(epoch FROM attempted_at) FROM awa.jobs"
                " WHERE kind = ANY(%s) AND attempted_at IS NOT NULL",
                [list(RATES)],
            ).fetchall()
        )
    for kind, (rate, burst) in RATES.items():
        tokens = [
            (float(began[h["job_id"]]), h["at"].timestamp())
            for h in held
            if h["kind"] == kind and h["job_id"] in began
        ]
        problems += [f"{kind}: {v}" for v in sound_window_violations(tokens, rate, burst)]
    assert problems == [], "\n".join(problems[:10])


def test_lowered_kind_limit_counts_old_permits_on_the_fast_path() -> None:
    """docs/flow.md: a lowered limit holds at once, a claim counts every held permit of the
    kind before it takes one. A session holds 5 permits of a kind limited to 5; the limit goes
    to 1. Claims of 1 slot (limit >= units left: the fast path asks the kind up front) take
    nothing until all the old permits are back, then exactly one job at a time. Raised to 3,
    the next claims take up to 3."""
    kind = "fa3.k5"
    set_limit(kind, 5)
    ids = [awa_django.enqueue(kind).id for _ in range(12)]
    ids += [awa_django.enqueue("fa3.free").id for _ in range(3)]
    a, b, c = Session(5), Session(1), Session(1)
    try:
        got = a.claim("fa3", [])
        assert [j["kind"] for j in got] == [kind] * 5, got
        set_limit(kind, 1)
        assert [j["kind"] for j in b.claim("fa3", [])] in ([], ["fa3.free"])
        first = list(a.running)
        a.claim("fa3", first[:3])  # 2 old permits still held: free jobs only
        assert all(
            j["kind"] == "fa3.free"
            for s in (a, b)
            for j in s.running.values()
            if j["job_id"] not in first
        )
        for s in (b, c):
            new = s.claim("fa3", [j for j in s.running if s.running[j]["kind"] == "fa3.free"])
            assert all(j["kind"] != kind for j in new), new
        a.claim("fa3", list(a.running))  # every old permit back; a may take one job of the kind
        running_kind = [j for s in (a, b, c) for j in s.running.values() if j["kind"] == kind]
        assert len(running_kind) <= 1, running_kind
        for s in (b, c):
            s.claim("fa3", [j for j in s.running if s.running[j]["kind"] == "fa3.free"])
        running_kind = [j for s in (a, b, c) for j in s.running.values() if j["kind"] == kind]
        assert len(running_kind) == 1, running_kind
        set_limit(kind, 3)
        for s in (b, c, a):
            s.claim("fa3", [])
        running_kind = [j for s in (a, b, c) for j in s.running.values() if j["kind"] == kind]
        assert len(running_kind) == 3, running_kind
        assert sum(len(j["permits"]) for j in running_kind) == 3
    finally:
        for s in (a, b, c):
            s.conn.close()


def test_parked_heavy_job_not_stranded_sql() -> None:
    """The SQL form of test_parked_heavy_job_not_stranded_on_small_workers: two claim sessions of 2
    slots, jobs of weight 3 of a kind limited to 3 (each counts 2: the slots). The first holds
    2 permits; the second's job cannot have 2 and is parked. Once the first hands its permits
    back, rounds of claims of both sessions must take the parked job."""
    set_limit("fa3.k3", 3)
    a_id = awa_django.enqueue("fa3.k3", weight=3).id
    b_id = awa_django.enqueue("fa3.k3", weight=3).id
    a, b = Session(2), Session(2)
    try:
        assert [j["job_id"] for j in a.claim("fa3", [])] == [a_id]
        assert b.claim("fa3", []) == []
        with pg() as c:
            assert c.execute("SELECT job_id FROM awa.flow_waiting").fetchall() == [(b_id,)]
        got = [j["job_id"] for j in a.claim("fa3", [a_id])]  # the hand-back claims too
        got += [j["job_id"] for _ in range(5) for s in (a, b) for j in s.claim("fa3", [])]
        assert got == [b_id]
    finally:
        a.conn.close()
        b.conn.close()


@pytest.mark.parametrize("burst", [1, None], ids=["burst1", "default_burst"])
def test_parked_heavy_job_not_stranded_by_burst_one(burst: int | None) -> None:
    """A kind limited to 2 at once and 10/s with a burst of 1; jobs of weight 2, claim sessions
    of 8 slots (nothing small here). docs/flow.md: a rate limit counts jobs started, not
    weight; a parked job is never stranded. The first job runs (2 permits); the second is
    parked; once the first is handed back, claims over the next second must take it. The
    default burst at 10/s is ceil(10 / 10) = 1: the same."""
    set_kind_limits(
        "fa3.both", global_concurrency=2, rate_limit=10.0, rate_burst=burst, actor="fa3"
    )
    a_id = awa_django.enqueue("fa3.both", weight=2).id
    b_id = awa_django.enqueue("fa3.both", weight=2).id
    a, b = Session(8), Session(8)
    try:
        assert [j["job_id"] for j in a.claim("fa3", [])] == [a_id]
        assert b.claim("fa3", []) == []
        with pg() as c:
            assert c.execute("SELECT job_id FROM awa.flow_waiting").fetchall() == [(b_id,)]
        # The hand-back claims too: once the next token is due (0.1 s), it may take the job.
        back = [j["job_id"] for j in a.claim("fa3", [a_id])]
        got = back or wait_for(
            lambda: [j["job_id"] for s in (a, b) for j in s.claim("fa3", [])],
            timeout=5,
            message="the parked job to be claimed",
        )
        assert got == [b_id]
    finally:
        a.conn.close()
        b.conn.close()
