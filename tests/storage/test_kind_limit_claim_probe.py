"""The edges of the claim's fast path for limited kinds (docs/flow.md, "Per kind").

Beyond the random walks of tests/storage/test_kind_limit_claim_walks.py, case by case: the
probe of the lane's next job and the second pass from the first job of a limited kind, the keys of a
row drawn by a running sum (one cleared kind) or by per-kind offsets (several), the rate state
locked first and inserted only when missing, rows after a gap, a tombstone or a serial key. Raw
``awa.claim_v3`` claimers (tests/support/kind_limit_model.py) check every invariant after every
claim."""

from __future__ import annotations

import json
import os
import random
import threading
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from awa_django.db import storage
from awa_django.db.storage import Finalization
from tests.support.database import conninfo, pg
from tests.support.kind_limit_model import (
    A,
    B,
    C,
    F,
    R,
    World,
    assert_clean,
    drain,
    note_holders,
    open_world,
    stuck,
)
from tests.support.polling import wait_for

pytestmark = pytest.mark.usefixtures("clean_awa")

QUEUE = "kfb"


@pytest.fixture
def world() -> Iterator[World]:
    yield from open_world(conninfo(), QUEUE)


def one_lane(w: World, *priorities: int) -> None:
    """One lane per priority (one shard): the lane order is the enqueue order."""
    for p in priorities or (0,):
        w.admin.execute("SELECT awa.ensure_lanes_v1(%s, %s, 1)", [w.queue, p])


def ids_of(got: list[Any]) -> list[int]:
    return [a.job_id for a in got]


# ---- the rate state: locked first, inserted only when missing -----------------------------------


def _waiting(pid: int) -> bool:
    with pg() as conn:
        row = conn.execute(
            "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", [pid]
        ).fetchone()
    return row is not None and row[0] == "Lock"


def _raw_claim(conn: psycopg.Connection[Any], queue: str, out: dict[str, Any]) -> None:
    try:
        out["rows"] = conn.execute(
            "SELECT job_id FROM awa.claim_v3(p_queue => %s, p_max => 10, "
            "p_worker => gen_random_uuid())",
            [queue],
        ).fetchall()
    except psycopg.Error as exc:
        out["error"] = exc


@pytest.mark.parametrize("path", ["fast", "slow"])
def test_two_claims_over_rate_states_in_opposite_orders_do_not_deadlock(path: str) -> None:
    """A kind's rate state row is made when the rate is set (by any writer), never by a claim:
    two claims making two kinds' rows in opposite orders would deadlock (an insert waits for
    another claim's uncommitted insert of the same row, which SKIP LOCKED cannot see). So a claim
    only ever locks rows that exist: the first
    rate-limited kind of a claim waits for its row, later ones skip a held one. ``slow``: every
    job has a serial key, so the lanes go to the slow path, awa._claim_kind_v1."""
    r0, r1, r2 = "kfb.r0", "kfb.r1", "kfb.r2"
    with pg() as admin:
        admin.execute(
            "SELECT * FROM awa.flow_kind_set_v1(%s, NULL, 1000, 100, 'katk3', false)", [r0]
        )
        # A raw-SQL writer of the limits table gets the row too.
        admin.execute(
            "INSERT INTO awa.flow_kind_limits (kind, rate, burst) VALUES (%s, 1000, 100)", [r1]
        )
        admin.execute("INSERT INTO awa.flow_kind_limits (kind) VALUES (%s)", [r2])
        admin.execute(
            "UPDATE awa.flow_kind_limits SET rate = 1000, burst = 100 WHERE kind = %s", [r2]
        )
        for queue, kinds in (("kfb.x", [r1, r0, r2]), ("kfb.y", [r2, r1])):
            admin.execute("SELECT awa.ensure_lanes_v1(%s, 0, 1)", [queue])
            admin.execute(
                "SELECT awa.enqueue_v1(%s::jsonb)",
                [
                    json.dumps(
                        [
                            {
                                "kind": k,
                                "queue": queue,
                                "metadata": {"awa:serial": k} if path == "slow" else None,
                            }
                            for k in kinds
                        ]
                    )
                ],
            )
        assert admin.execute(
            "SELECT array_agg(kind ORDER BY kind) FROM awa.flow_kind_rate_state"
        ).fetchone() == ([r0, r1, r2],)
    # Another claim holds R0's state (its first rate-limited kind) for the whole time.
    other = psycopg.connect(conninfo())
    cx = psycopg.connect(conninfo(), autocommit=True)
    cy = psycopg.connect(conninfo(), autocommit=True)
    try:
        other.execute("SELECT 1 FROM awa.flow_kind_rate_state WHERE kind = %s FOR UPDATE", [r0])
        x: dict[str, Any] = {}
        y: dict[str, Any] = {}
        tx = threading.Thread(target=_raw_claim, args=(cx, "kfb.x", x))
        ty = threading.Thread(target=_raw_claim, args=(cy, "kfb.y", y))
        tx.start()
        ty.start()
        # Neither waits for R0 (a later kind of X, skipped while held; not in Y's lane).
        tx.join(20)
        ty.join(20)
        assert not tx.is_alive() and not ty.is_alive(), "a claim waited"
        other.rollback()
    finally:
        other.close()
        cx.close()
        cy.close()
    errors = [str(o["error"]) for o in (x, y) if "error" in o]
    assert not errors, errors
    assert len(x["rows"]) >= 1 and len(y["rows"]) >= 1


# ---- the random walk aimed at the new logic ----------------------------------------------------


def lanes(w: World) -> list[list[tuple[str, int, bool]]]:
    """Per lane of the queue (hand-off lanes too), its rows after the lane's cursor that are
    not tombstoned, in lane order: (kind, weight, has a serial key)."""
    rows = w.admin.execute(
        "SELECT e.lane_id, e.kind, COALESCE((e.metadata ->> 'awa:weight')::int, 1), "
        "COALESCE(e.metadata ? 'awa:serial', false) FROM awa.ready_entries e "
        "JOIN awa.queue_lanes l ON l.lane_id = e.lane_id WHERE l.queue = %s "
        "AND e.lane_seq > awa.lane_cursor_v1(e.lane_id) AND NOT EXISTS (SELECT 1 FROM "
        "awa.ready_tombstones t WHERE t.lane_id = e.lane_id AND t.lane_seq = e.lane_seq "
        "AND t.ready_slot = e.ready_slot) ORDER BY e.lane_id, e.lane_seq",
        [w.queue],
    ).fetchall()
    out: dict[int, list[tuple[str, int, bool]]] = {}
    for lane, kind, weight, skey in rows:
        out.setdefault(lane, []).append((kind, weight, skey))
    return list(out.values())


def edge_units(w: World, rng: random.Random) -> int:
    """Units that run out exactly at (or one around) the first row of a limited kind or with a
    serial key in some lane: the second pass's edges."""
    limited = {k for k, v in w.limits.items() if v} | {k for k, v in w.rates.items() if v}
    choices = []
    for lane in lanes(w):
        before = 0
        for kind, weight, skey in lane:
            if kind in limited or skey:
                choices += [before, before + 1, before + weight, before + weight - 1]
                break
            before += weight
    choices = [c for c in choices if c > 0]
    return rng.choice(choices) if choices else rng.randint(1, 8)


MIXES = [
    # Unlimited rows, then a limited kind's run, then more: the second pass's shape.
    lambda rng: (
        [(F, rng.choice([1, 2, 3]), None) for _ in range(rng.randint(1, 3))]
        + [(rng.choice([A, B]), rng.choice([1, 2, 5]), None) for _ in range(rng.randint(1, 3))]
        + [(F, 1, None)]
    ),
    # Two limited kinds interleaved (per-kind offsets), one with a serial key inside.
    lambda rng: [
        (rng.choice([A, B]), rng.choice([1, 2]), "s1" if rng.random() < 0.2 else None)
        for _ in range(rng.randint(2, 6))
    ],
    # One limited kind beside a rate-only kind (v_npk = 1 with two cleared kinds).
    lambda rng: [(rng.choice([A, R, F]), rng.choice([1, 1, 3]), None) for _ in range(5)],
    # A serial key on an unlimited job right before a limited one.
    lambda rng: [(F, 1, None), (F, 2, "s2"), (A, 1, None), (B, 2, None), (F, 1, "s2")],
]


def rotate(w: World, ring: str) -> None:
    w.admin.execute("SELECT awa.prune_v1(%s)", [ring])
    w.admin.execute("SELECT awa.rotate_v3(%s)", [ring])


WALK_SEEDS = int(os.environ.get("KFB_SEEDS", "6"))


@pytest.mark.parametrize("seed", range(WALK_SEEDS))
def test_random_walk_at_the_second_pass_edges(world: World, seed: int) -> None:
    rng = random.Random(1000 + seed)
    w = world
    one_lane(w, 0, 5, -5)
    w.set_kind(A, 3)
    w.set_kind(B, 4)
    w.set_kind(C, 1)
    w.set_kind(R, 4 if seed % 2 else None, 500.0, 6)
    for step in range(110):
        op = rng.random()
        if op < 0.2:
            w.enqueue(
                rng.choice(MIXES)(rng),
                rollback=rng.random() < 0.15,
                priority=rng.choice([0, 0, 5, -5]),
            )
        elif op < 0.26:
            waiting = [j.job_id for j in w.jobs.values() if j.state == "available"]
            for job_id in rng.sample(waiting, min(len(waiting), rng.randint(1, 2))):
                w.cancel(job_id)
        elif op < 0.3:
            w.set_kind(rng.choice([A, B, C]), rng.choice([None, 1, 2, 3, 5]))
        elif op < 0.32:
            w.set_queue(rng.choice([None, None, 3, 6]))
        elif op < 0.35:
            rotate(w, rng.choice(["queue", "claim"]))
        elif op < 0.75:
            w.claim(rng.randrange(3), edge_units(w, rng), rng.choice([None, None, 2, 4]))
        else:
            index = rng.randrange(3)
            running = list(w.claimers[index].running)
            if running:
                w.finish(index, rng.sample(running, rng.randint(1, len(running))))
        assert not w.violations, f"step {step}: " + "\n".join(w.violations[:10])
    drain(w, rng)
    assert_clean(w)


def test_two_claims_taking_lowered_kinds_in_opposite_orders_do_not_deadlock() -> None:
    a, b, r1 = "kfb.la", "kfb.lb", "kfb.r1"
    with pg() as admin:
        for kind in (a, b):
            for limit in (3, 1):
                admin.execute(
                    "SELECT * FROM awa.flow_kind_set_v1(%s, %s, NULL, NULL, 'katk3', false)",
                    [kind, limit],
                )
        admin.execute(
            "SELECT * FROM awa.flow_kind_set_v1(%s, NULL, 1000, 100, 'katk3', false)", [r1]
        )
        # The rate state row exists once the rate is set (trigger flow_kind_rate_row).
        assert admin.execute(
            "SELECT count(*) FROM awa.flow_kind_rate_state WHERE kind = %s", [r1]
        ).fetchone() == (1,)
        for queue, kinds in (("kfb.x", [a, r1, b]), ("kfb.y", [b, a])):
            admin.execute("SELECT awa.ensure_lanes_v1(%s, 0, 1)", [queue])
            admin.execute(
                "SELECT awa.enqueue_v1(%s::jsonb)",
                [json.dumps([{"kind": k, "queue": queue} for k in kinds])],
            )
    # Another claim holds R1's rate state (its first rate-limited kind) for a moment.
    other = psycopg.connect(conninfo())
    cx = psycopg.connect(conninfo(), autocommit=True)
    cy = psycopg.connect(conninfo(), autocommit=True)
    try:
        other.execute("SELECT 1 FROM awa.flow_kind_rate_state WHERE kind = %s FOR UPDATE", [r1])
        px = cx.execute("SELECT pg_backend_pid()").fetchone()[0]  # type: ignore[index]
        x: dict[str, Any] = {}
        y: dict[str, Any] = {}
        tx = threading.Thread(target=_raw_claim, args=(cx, "kfb.x", x))
        tx.start()
        wait_for(lambda: _waiting(px), timeout=10, message="X waiting on R1's state")
        ty = threading.Thread(target=_raw_claim, args=(cy, "kfb.y", y))
        ty.start()
        # Y resets B's max_seen, then skips A's reset (X holds A's row): it never waits on X.
        ty.join(20)
        assert not ty.is_alive(), "Y waited on X"
        other.rollback()
        tx.join(20)
    finally:
        other.close()
        cx.close()
        cy.close()
    errors = [str(o["error"]) for o in (x, y) if "error" in o]
    assert not errors, errors


# ---- deterministic edges ---------------------------------------------------------------------


R0 = "kfa.rate0"


def test_a_kind_cleared_in_the_second_pass_whose_rate_state_another_claim_holds(
    world: World,
) -> None:
    """Lane [F, F, R0, R, F]: the first pass stops at R0, the second clears R0 (the claim's
    first rate-limited kind) but not R, whose state another claim holds (SKIP LOCKED): the
    claim takes F, F, R0 and leaves R; nothing is lost: once R's state is free, R and the
    last F go, and every invariant holds."""
    w = world
    one_lane(w)
    w.set_kind(R0, None, 1000.0, 10)
    w.set_kind(R, 2, 1000.0, 10)
    w.admin.execute(
        "INSERT INTO awa.flow_kind_rate_state (kind, tat) VALUES (%s, now()) "
        "ON CONFLICT DO NOTHING",
        [R],
    )
    ids = w.enqueue([(F, 1, None), (F, 2, None), (R0, 1, None), (R, 1, None), (F, 1, None)])
    with pg(autocommit=False) as other:
        other.execute("SELECT tat FROM awa.flow_kind_rate_state WHERE kind = %s FOR UPDATE", [R])
        rows = (
            w.claimers[0]
            .conn.execute(
                "SELECT job_id, wait_secs, timeout_secs FROM awa.claim_v3(p_queue => %s, "
                "p_max => 10, p_worker => gen_random_uuid())",
                [QUEUE],
            )
            .fetchall()
        )
        got = [r[0] for r in rows if r[0] is not None]
        assert got[:3] == ids[:3], rows
        assert ids[3] not in got, rows
        other.rollback()
    # The raw call's attempts end (outside the model's claimers: they carry no kind permits).
    leases = w.admin.execute(
        "SELECT c.job_id, c.run_lease, c.claim_slot FROM awa.claims c WHERE c.job_id = ANY(%s)",
        [got],
    ).fetchall()
    assert (
        storage.finalize(
            w.admin, [Finalization(j, lease, slot, "completed") for j, lease, slot in leases]
        )
        == []
    )
    for job_id in got:
        w.jobs[job_id].state = "done"
        w.starts.append(job_id)
    rest = w.claim(1, 10)
    assert sorted(ids_of(rest)) == sorted(set(ids) - set(got)), rest
    assert not w.violations, w.violations
    w.finish_all()
    w.flush()
    assert_clean(w)


def test_parked_jobs_come_back_through_the_hand_off_lane_beside_a_second_pass(
    world: World,
) -> None:
    """A binds (limit 1): its next jobs are parked. When A's permit comes back, a claim
    un-parks one into the hand-off lane (shard 64) and takes it there with the fast path,
    beside a producer lane whose first pass stops at a limited kind B (second pass)."""
    w = world
    one_lane(w, 0)
    w.set_kind(A, 1)
    w.set_kind(B, 2)
    first = w.enqueue([(A, 1, None), (A, 1, None), (A, 2, None), (F, 1, None)])
    got = w.claim(0, 10)
    assert ids_of(got) == [first[0], first[3]]  # A1 runs, A2 and A3 parked, F goes on
    assert w.admin.execute("SELECT count(*) FROM awa.flow_waiting").fetchone() == (2,)
    second = w.enqueue([(F, 2, None), (B, 1, None), (B, 1, None), (F, 1, None)])
    w.finish(0, [first[0]])
    got = w.claim(0, 6)  # hands A1's permit back, un-parks A2, takes it and the lane's run
    assert first[1] in ids_of(got), got
    assert set(ids_of(got)) >= set(second), got
    lanes_used = w.admin.execute(
        "SELECT l.shard FROM awa.claims c JOIN awa.queue_lanes l "
        "ON l.lane_id = c.lane_id WHERE c.job_id = %s ORDER BY c.run_lease DESC LIMIT 1",
        [first[1]],
    ).fetchall()
    assert lanes_used == [(64,)]  # its parked claim was in shard 0
    assert not w.violations, w.violations
    drain(w, random.Random(5))
    assert_clean(w)


def test_several_cleared_kinds_draw_keys_by_offsets_in_one_pass(world: World) -> None:
    """Lane [F w2, A w2, B w1, A w1, B w3(->cap 2), C w1, F]: the second pass clears A, B and
    C; each row carries its own kind's keys, none twice, exactly min(weight, limit)."""
    w = world
    one_lane(w)
    w.set_kind(A, 3)
    w.set_kind(B, 4)
    w.set_kind(C, 1)
    ids = w.enqueue(
        [
            (F, 2, None),
            (A, 2, None),
            (B, 1, None),
            (A, 1, None),
            (B, 3, None),
            (C, 1, None),
            (F, 1, None),
        ]
    )
    got = w.claim(0, 11, max_weight=2)
    assert ids_of(got) == ids, got
    assert not w.violations, w.violations
    w.finish_all()
    w.flush()
    assert_clean(w)


# ---- concurrent claims while limits move, cancels race, rings rotate ----------------------------


def test_concurrent_claims_while_kinds_gain_and_lose_limits(world: World) -> None:
    """Four threads claim (units at the edges, max_weight caps) and finish while a fifth sets
    and clears kind limits and rates between the probe and the statement of their claims,
    cancels waiting jobs and rotates the rings. Kept clear of the two deadlocks above: rate
    states exist, and a kind's limit only toggles between none and one value (never lowered).
    Every claimed row carries only its own kind's keys, no key is carried twice, no serial key
    runs twice at once, and at the end every job completed once or was cancelled, nothing is
    held."""
    from tests.support.kind_limit_model import PERMIT_CLASS, Claimer

    w = world
    one_lane(w, 0, 5)
    values = {A: 2, B: 3, C: 1}
    for kind, limit in values.items():
        w.set_kind(kind, limit)
    w.set_kind(R, None, 400.0, 5)
    w.set_kind(R0, 2, 400.0, 5)
    for kind in (R, R0):
        w.admin.execute(
            "INSERT INTO awa.flow_kind_rate_state (kind, tat) VALUES (%s, now()) "
            "ON CONFLICT DO NOTHING",
            [kind],
        )
    rng = random.Random(77)
    for _ in range(30):
        w.enqueue(
            rng.choice([*MIXES, lambda r: [(R0, 1, None), (F, 2, None), (R, 1, None)]])(rng),
            priority=rng.choice([0, 5]),
        )
    key_sets = {kind: set(w.kind_keys(kind, 8)) for kind in (A, B, C, R, R0, F)}
    stop = threading.Event()
    errors: list[str] = []
    lock = threading.Lock()
    owners: dict[int, int] = {}
    keys_running: dict[str, int] = {}
    starts: list[int] = []

    def claimer(i: int) -> None:
        c = Claimer(conninfo(), 20 + i)
        local = random.Random(i)
        try:
            while not stop.is_set():
                rows = [
                    r
                    for r in c.claim(
                        QUEUE, local.choice([1, 2, 3, 4, 6, 9]), local.choice([None, None, 2, 3])
                    )
                    if r["job_id"] is not None
                ]
                with lock:
                    for row in rows:
                        starts.append(row["job_id"])
                        permits = list(row["permits"] or [])
                        foreign = [k for k in permits if k not in key_sets[row["kind"]]]
                        if foreign:
                            errors.append(f"job {row['job_id']} ({row['kind']}): {foreign}")
                        if len(set(permits)) != len(permits):
                            errors.append(f"job {row['job_id']} carries a key twice")
                        note_holders(row, owners, keys_running, errors)
                c.adopt_and_end_some(rows, local, lock, owners, keys_running)
            c.finish(list(c.running))
            c.claim(QUEUE, 0)
        except Exception as exc:  # reported by the test
            errors.append(f"claimer {i}: {exc!r}")
        finally:
            c.close()

    def chaos() -> None:
        local = random.Random(5)
        with pg() as conn:
            while not stop.is_set():
                kind = local.choice([A, B, C, R])
                if kind == R:
                    rate = local.choice([None, 400.0])
                    conn.execute(
                        "SELECT * FROM awa.flow_kind_set_v1(%s, NULL, %s, %s, 'katk3', %s)",
                        [kind, rate, 5 if rate else None, rate is None],
                    )
                else:
                    on = local.random() < 0.6
                    conn.execute(
                        "SELECT * FROM awa.flow_kind_set_v1(%s, %s, NULL, NULL, 'katk3', %s)",
                        [kind, values[kind] if on else None, not on],
                    )
                ids = [
                    r[0]
                    for r in conn.execute(
                        "SELECT id FROM awa.live_jobs WHERE queue = %s AND state = 'available' "
                        "ORDER BY random() LIMIT 2",
                        [QUEUE],
                    ).fetchall()
                ]
                for job_id in ids:
                    conn.execute("SELECT awa.cancel_v1(%s)", [job_id])
                if local.random() < 0.1:
                    conn.execute("SELECT awa.prune_v1('queue')")
                    conn.execute("SELECT awa.rotate_v3(%s)", [local.choice(["queue", "claim"])])
                conn.execute("SELECT awa.serial_sweep_v1()")

    threads = [threading.Thread(target=claimer, args=(i,)) for i in range(4)]
    threads.append(threading.Thread(target=chaos))
    for t in threads:
        t.start()
    try:
        for round_ in range(3):
            if round_:
                for _ in range(8):
                    w.enqueue(rng.choice(MIXES)(rng), priority=rng.choice([0, 5]))
            wait_for(
                lambda: w.live() == 0 or bool(errors),
                timeout=30,
                message=lambda: f"the backlog to drain: {stuck(w)}",
            )
            if errors:
                break
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert not errors, errors[:10]
    assert len(starts) == len(set(starts))
    with pg() as conn:
        assert conn.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = %s "
            "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
            [PERMIT_CLASS],
        ).fetchone() == (0,)
        states = dict(
            conn.execute("SELECT id, state FROM awa.jobs WHERE queue = %s", [QUEUE]).fetchall()
        )
        pruned = conn.execute(
            "SELECT count(*) FROM awa.ring_prunes WHERE ring = 'queue' AND outcome = 'pruned'"
        ).fetchone()
    assert set(states.values()) <= {"completed", "cancelled"}, states
    # Every job completed once (it started once), or was cancelled (maybe while it ran: a
    # cancel that raced its claim).
    assert {j for j, s in states.items() if s == "completed"} <= set(starts)
    # A started job is in history, unless the chaos thread's queue-ring prune took its slot
    # (a slot is pruned only once every job in it has ended).
    missing = set(starts) - set(states)
    assert not missing or pruned != (0,), sorted(missing)[:10]
