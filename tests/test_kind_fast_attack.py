"""Hostile tests of the kind-limit fast claim path (migration 0013, docs/flow.md "Per kind").

Raw ``awa.claim_v3`` claimers (tests/kfast_model.py) walk a random schedule of enqueues (mixed
kinds, weights and serial keys in one lane, producers that roll back), cancels, limit changes
(raised, lowered, cleared, set on a kind that had none; a queue limit beside) and claims with
``p_held``/``p_release`` from several connections; the model checks every claimed row's
permits against ``awa._flow_kind_key_v1``/``awa._flow_key_v1`` and ``pg_locks`` after every
claim. Threads claim concurrently while another changes limits. Worker processes (four, one
SIGKILLed) drain a mixed backlog while a limit moves.
"""

from __future__ import annotations

import os
import random
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from tests.helpers import conninfo, pg, wait_for
from tests.kfast_model import PERMIT_CLASS, World

pytestmark = pytest.mark.usefixtures("clean_awa")

QUEUE = "kfa"
A, B, C, R, F = "kfa.a", "kfa.b", "kfa.c", "kfa.rate", "kfa.free"


@pytest.fixture
def world() -> Iterator[World]:
    w = World(conninfo(), QUEUE, 3)
    try:
        yield w
    finally:
        w.close()


def drain(w: World, rng: random.Random, timeout: float = 20.0) -> None:
    """Claim and finish until the queue holds nothing live (rate-limited kinds make it wait on
    the database's clock: the loop waits on the live count, with a deadline)."""

    def step() -> bool:
        # The maintenance leader's serial sweep (no leader runs here): hands on keys whose
        # next job was cancelled.
        w.admin.execute("SELECT awa.serial_sweep_v1()")
        for c in w.claimers:
            w.claim(c.index, rng.randint(1, 8))
            if c.running and rng.random() < 0.8:
                w.finish(c.index, list(c.running))
        w.finish_all()
        return w.live() == 0

    wait_for(step, timeout=timeout, interval=0.02, message=lambda: f"drain: {stuck(w)}")
    w.flush()


def stuck(w: World) -> str:
    with pg() as conn:
        live = conn.execute(
            "SELECT id, kind, state, metadata FROM awa.live_jobs WHERE queue = %s ORDER BY id",
            [w.queue],
        ).fetchall()
        fw = conn.execute("SELECT job_id, kind FROM awa.flow_waiting ORDER BY job_id").fetchall()
        sw = conn.execute("SELECT job_id FROM awa.serial_waiting ORDER BY job_id").fetchall()
        st = conn.execute("SELECT * FROM awa.flow_kind_status_v1()").fetchall()
        locks = conn.execute(
            "SELECT pid, classid, objid FROM pg_locks WHERE locktype = 'advisory'"
        ).fetchall()
    return (
        f"{len(live)} live: {live}\nflow_waiting {fw}\nserial_waiting {sw}\nstatus {st}\n"
        f"locks {locks}\nlimits {w.limits} queue {w.queue_limit}"
    )


def assert_clean(w: World) -> None:
    assert not w.violations, "\n".join(w.violations[:20])
    with pg() as conn:
        assert conn.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = %s",
            [PERMIT_CLASS],
        ).fetchone() == (0,)
        rows = conn.execute("SELECT kind, in_use, waiting FROM awa.flow_kind_status_v1()").fetchall()
        assert all(r[1] in (0, None) and r[2] == 0 for r in rows), rows
        assert conn.execute("SELECT count(*) FROM awa.flow_waiting").fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM awa.serial_waiting").fetchone() == (0,)
    done = [j for j in w.jobs.values() if j.state == "done"]
    assert len(w.starts) == len(set(w.starts)) == len(done)
    assert all(j.state in ("done", "cancelled") for j in w.jobs.values())
    with pg() as conn:
        states = dict(
            conn.execute(
                "SELECT id, state FROM awa.jobs WHERE id = ANY(%s)", [list(w.jobs)]
            ).fetchall()
        )
    for j in w.jobs.values():
        want = "completed" if j.state == "done" else "cancelled"
        assert states.get(j.job_id) == want, (j, states.get(j.job_id))


KINDS = [A, A, B, B, C, R, F, F]


def random_specs(rng: random.Random, n: int, keys: bool = True) -> list[tuple[str, int, str | None]]:
    out = []
    for _ in range(n):
        kind = rng.choice(KINDS)
        weight = rng.choice([1, 1, 1, 2, 3, 5])
        key = f"k{rng.randint(0, 3)}" if keys and rng.random() < 0.2 else None
        out.append((kind, weight, key))
    return out


SEEDS = int(os.environ.get("KFA_SEEDS", "4"))


def max_starts(kind: str, seconds: float) -> int:
    """The most jobs of ``kind`` that started in any window of ``seconds`` (database clock)."""
    with pg() as conn:
        row = conn.execute(
            "WITH a AS (SELECT attempted_at AS t FROM awa.terminal_jobs WHERE kind = %s) "
            "SELECT coalesce(max((SELECT count(*) FROM a b WHERE b.t >= a.t "
            "AND b.t < a.t + make_interval(secs => %s))), 0) FROM a",
            [kind, seconds],
        ).fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.parametrize("seed", range(SEEDS))
def test_random_walk_of_raw_claims_keeps_every_invariant(world: World, seed: int) -> None:
    rng = random.Random(seed)
    w = world
    w.set_kind(A, 2)
    w.set_kind(B, 3)
    w.set_kind(C, 1)
    w.set_kind(R, None, 200.0, 3)
    for step in range(140):
        op = rng.random()
        if op < 0.18:
            w.enqueue(
                random_specs(rng, rng.randint(1, 12)),
                rollback=rng.random() < 0.25,
                priority=rng.choice([0, 0, 0, 5, -5]),
            )
        elif op < 0.25:
            waiting = [j.job_id for j in w.jobs.values() if j.state == "available"]
            for job_id in rng.sample(waiting, min(len(waiting), rng.randint(1, 3))):
                w.cancel(job_id)
        elif op < 0.31:
            kind = rng.choice([A, B, C])
            w.set_kind(kind, rng.choice([None, 1, 2, 3, 4, 6]))
        elif op < 0.34:
            w.set_queue(rng.choice([None, None, 4, 7]))
        elif op < 0.75:
            index = rng.randrange(3)
            w.claim(index, rng.randint(1, 12), rng.choice([None, None, 4]))
        else:
            index = rng.randrange(3)
            running = list(w.claimers[index].running)
            if running:
                w.finish(index, rng.sample(running, rng.randint(1, len(running))))
        assert not w.violations, f"step {step}: " + "\n".join(w.violations[:10])
    drain(w, rng)
    assert_clean(w)
    for seconds in (0.01, 0.05, 0.2):
        assert max_starts(R, seconds) <= 200 * seconds + 3, seconds


def test_kinds_exactly_at_the_edge_of_binding(world: World) -> None:
    """A lane where each limited kind's rows weigh exactly its limit, then one unit more: the
    first claim takes the whole run at once, the second leaves exactly the extra row."""
    w = world
    w.set_kind(A, 3)
    w.set_kind(B, 4)
    w.set_kind(C, 1)
    ids = w.enqueue([(A, 2, None), (B, 3, None), (F, 1, None), (A, 1, None), (B, 1, None), (C, 1, None)])
    got = w.claim(0, 20)
    assert sorted(a.job_id for a in got) == sorted(ids)
    more = w.enqueue([(A, 1, None), (B, 1, None), (C, 1, None), (F, 1, None)])
    got = w.claim(1, 20)
    assert [a.job_id for a in got] == [more[3]]  # only the free kind: the others bind
    w.finish(0, ids[:2])  # A w2 and B w3 end: their permits go back with claimer 0's next claim
    w.claim(0, 0)
    got = w.claim(1, 20)
    assert sorted(a.kind for a in got) == [A, B]  # C still held by claimer 0
    assert not w.violations, w.violations
    drain(w, random.Random(1))
    assert_clean(w)


def test_a_weight_above_the_kind_limit_counts_as_the_limit(world: World) -> None:
    w = world
    w.set_kind(A, 2)
    ids = w.enqueue([(A, 7, None), (A, 7, None), (F, 1, None), (A, 1, None)])
    got = w.claim(0, 30)
    assert [a.job_id for a in got if a.kind == A] == [ids[0]]
    assert len(got[0].permits) == 2
    drain(w, random.Random(2))
    assert_clean(w)


def test_cancel_gaps_and_serial_keys_inside_a_limited_run(world: World) -> None:
    """Permits taken up front for a run whose rows are cancelled, rolled back or held behind
    a serial key go back: nothing is held after the claim but what its rows carry."""
    w = world
    w.set_kind(A, 6)
    w.set_kind(B, 6)
    first = w.enqueue([(A, 1, "s1"), (A, 1, None), (B, 2, None)])
    w.enqueue([(A, 3, None), (B, 3, None)], rollback=True)
    second = w.enqueue([(A, 1, None), (A, 1, "s1"), (B, 1, "s1"), (B, 2, None)])
    w.cancel(first[1])
    w.cancel(second[0])
    got = w.claim(0, 30)
    assert first[0] in [a.job_id for a in got]
    assert second[1] not in [a.job_id for a in got]  # behind s1
    assert not w.violations, w.violations
    w.finish(0, list(w.claimers[0].running))
    drain(w, random.Random(3))
    assert_clean(w)


def test_a_rate_limited_kind_beside_a_concurrency_limited_one(world: World) -> None:
    w = world
    w.set_kind(A, 2)
    w.set_kind(R, None, 50.0, 4)
    w.enqueue([(R if i % 3 else A, 1, None) for i in range(90)])
    drain(w, random.Random(4), timeout=30)
    assert_clean(w)
    with pg() as conn:
        for seconds in (0.1, 0.5, 1.0):
            row = conn.execute(
                "WITH a AS (SELECT attempted_at AS t FROM awa.terminal_jobs WHERE kind = %s) "
                "SELECT max((SELECT count(*) FROM a b WHERE b.t >= a.t "
                "AND b.t < a.t + make_interval(secs => %s))) FROM a",
                [R, seconds],
            ).fetchone()
            assert row is not None and row[0] <= 50 * seconds + 4, (seconds, row)


def test_concurrent_raw_claimers_while_limits_change(world: World) -> None:
    """Four threads claim and finish through their own connections while a fifth moves the
    kinds' limits; permits are checked in pg_locks by a sixth, sampling all the time."""
    from tests.kfast_model import Claimer

    w = world
    w.set_kind(A, 2)
    w.set_kind(B, 3)
    w.set_kind(C, 1)
    rng = random.Random(7)
    w.enqueue(random_specs(rng, 400, keys=False))
    stop = threading.Event()
    errors: list[str] = []
    lock = threading.Lock()
    owners: dict[int, int] = {}

    def claimer(i: int) -> None:
        c = Claimer(conninfo(), 10 + i)
        local = random.Random(i)
        try:
            while not stop.is_set():
                rows = c.claim(QUEUE, local.randint(1, 10))
                with lock:
                    for row in rows:
                        if row["job_id"] is None:
                            continue
                        for k in row["permits"] or []:
                            if k in owners:
                                errors.append(f"permit {k} of {row['job_id']} held by {owners[k]}")
                            owners[k] = row["job_id"]
                for row in rows:
                    if row["job_id"] is not None:
                        from tests.kfast_model import Attempt

                        c.running[row["job_id"]] = Attempt(
                            row["job_id"], row["run_lease"], row["claim_slot"], row["kind"],
                            row["weight"] or 1, list(row["permits"] or []), row["serial_lock"],
                            None, c.index,
                        )
                done = [j for j in c.running if local.random() < 0.7]
                if done:
                    with lock:
                        for j in done:
                            for k in c.running[j].permits:
                                owners.pop(k, None)
                    c.finish(done)
            c.finish(list(c.running))
            c.claim(QUEUE, 0)
        except Exception as exc:  # noqa: BLE001
            errors.append(repr(exc))
        finally:
            c.close()

    def sampler() -> None:
        with pg() as conn:
            while not stop.is_set():
                for kind in (A, B, C):
                    row = conn.execute(
                        "SELECT max_running, in_use FROM awa.flow_kind_status_v1() WHERE kind = %s",
                        [kind],
                    ).fetchone()
                    # A limit just lowered may still see the old attempts: only flag what no
                    # limit ever allowed.
                    if row and row[0] is not None and row[1] is not None and row[1] > 6:
                        errors.append(f"{kind}: {row[1]} in use")

    threads = [threading.Thread(target=claimer, args=(i,)) for i in range(4)]
    threads.append(threading.Thread(target=sampler))
    for t in threads:
        t.start()
    try:
        for limit in [1, 4, None, 2, 6, 1, 3]:
            w.set_kind(rng.choice([A, B, C]), limit)
            wait_for(lambda: True, timeout=0.1)
            w.enqueue(random_specs(rng, 30, keys=False), rollback=rng.random() < 0.3)
        wait_for(lambda: w.live() == 0 or bool(errors), timeout=30, message="the backlog to drain")
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert not errors, errors[:10]
    with pg() as conn:
        assert conn.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = %s",
            [PERMIT_CLASS],
        ).fetchone() == (0,)


def _unused(*_: Any) -> None:
    pass
