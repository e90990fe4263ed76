"""Concurrent claimer sessions against ``awa.claim_v3``'s common path: its run statements while
no job kind has limits (one window over the run after each lane's cursor, or one row when one
unit is left).

Written from the docs (docs/storage.md, docs/flow.md) and the public SQL API only. Each
scenario runs concurrent claimer sessions (threads, each with its own psycopg connection,
calling ``awa.claim_v3`` with batch sizes alternating between 1, the one-row statement, and
larger ones) against concurrent producers and a chaos thread (promotion, ring rotations and
prunes, cancels, ``pg_cancel_backend`` of claimers), keeps a ledger of every attempt handed
out, and checks the contract against the database at the end: every committed job ends exactly
once, no ``(job_id, run_lease)`` is handed out twice, lane order and priority order hold, flow
limits are never exceeded at any instant.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from awa_django.db.storage import Finalization
from tests.jobs import concurrent_claims, worker_env
from tests.jobs.concurrent_claims import L17_TABLES
from tests.support.claimer_sessions import (
    BATCHES,
    ERROR,
    Claim,
    Ledger,
    all_terminal,
    check_attempts,
    check_lane_order,
    check_terminal,
    claim,
    claim_lanes,
    complete,
    connect,
    enqueue,
    enqueue_now,
    finalize_items,
    join,
    produce_then_drain,
    producer_conn,
    run_threads,
    terminal,
)
from tests.support.database import conninfo, pg
from tests.support.polling import wait_for
from tests.support.processes import ManagedProcess

pytestmark = pytest.mark.usefixtures("clean_awa")


# --------------------------------------------------------------------------------------------
# Scenario 1: no limits, everything at once.


def test_claimers_producers_and_maintenance_lose_and_duplicate_nothing() -> None:
    queue = "l17a"
    ledger = Ledger()
    stop_producing = threading.Event()
    stop_all = threading.Event()
    claimer_pids: list[int] = []
    rng = random.Random(17)

    def producer(n: int) -> Callable[[], None]:
        def run() -> None:
            conn = producer_conn()
            if n == 1:
                conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
            r = random.Random(n)
            i = 0
            while not stop_producing.is_set():
                i += 1
                jobs = [
                    {
                        "kind": "l17.x",
                        "queue": queue,
                        "priority": r.choice((-1, 0, 0, 1)),
                        "args": {"args": [n, i, k], "kwargs": {}},
                        **({"delay": 0.3} if r.random() < 0.05 else {}),
                    }
                    for k in range(r.randint(1, 4))
                ]
                long_open = n == 2 and i % 7 == 0
                rollback = n == 2 and i % 3 == 0 and not long_open
                if long_open:
                    # A long-open producer transaction: holds its lane until it commits.
                    ids = [
                        r_[0]
                        for r_ in conn.execute(
                            "SELECT job_id FROM awa.enqueue_v1(%s)", [json.dumps(jobs)]
                        )
                    ]
                    stop_producing.wait(0.3)
                    conn.commit()
                else:
                    ids = enqueue(conn, jobs, commit=not rollback)
                with ledger.lock:
                    (ledger.rolled_back if rollback else ledger.committed).update(ids)
            conn.close()

        return run

    def claimer(n: int) -> Callable[[], None]:
        def run() -> None:
            conn = connect()
            with ledger.lock:
                claimer_pids.append(conn.info.backend_pid)
            r = random.Random(100 + n)
            k = n
            while not stop_all.is_set():
                k += 1
                began = time.monotonic()
                try:
                    rows = claim(conn, queue, BATCHES[k % len(BATCHES)])
                except psycopg.errors.QueryCanceled:
                    continue
                took = time.monotonic() - began
                if not rows:
                    stop_all.wait(0.005)
                    continue
                try:
                    lanes = claim_lanes(conn, rows)
                except psycopg.errors.QueryCanceled:
                    lanes = claim_lanes(conn, rows)
                items = []
                for row in rows:
                    # wait_secs is measured from the claim's now(), its transaction's start; the
                    # statement sees rows committed (and due) while it runs, so a job claimed in
                    # time is at most the statement's duration below 0, a delayed job claimed
                    # before it was due more than that.
                    if row["wait_secs"] is not None and row["wait_secs"] < -(took + 0.05):
                        ledger.fail(
                            f"job {row['job_id']} claimed {row['wait_secs']} s early"
                            f" by a claim of {took:.3f} s"
                        )
                    x = r.random()
                    outcome = "completed" if x < 0.8 else "retry" if x < 0.9 else "snooze"
                    items.append(
                        Finalization(
                            row["job_id"],
                            row["run_lease"],
                            row["claim_slot"],
                            outcome,
                            result_json="null" if outcome == "completed" else None,
                            error=ERROR if outcome == "retry" else None,
                            delay=0.0 if outcome != "completed" else None,
                        )
                    )
                with ledger.lock:
                    ledger.claims.append(Claim(n, time.monotonic(), rows, lanes))
                    ledger.attempts.extend((row["job_id"], row["run_lease"]) for row in rows)
                stale = set(finalize_items(conn, items))
                with ledger.lock:
                    for item in items:
                        if (item.job_id, item.run_lease) not in stale:
                            ledger.finals[item.job_id].append(item.outcome)
            conn.close()

        return run

    def chaos() -> None:
        conn = connect()
        i = 0
        while not stop_all.is_set():
            i += 1
            conn.execute("SELECT awa.promote_v1(1000)")
            if i % 5 == 0:
                conn.execute("SELECT awa.rotate_v3('claim', 0)")
                conn.execute("SELECT awa.prune_v1('claim')")
            if i % 11 == 0:
                conn.execute("SELECT awa.rotate_v3('queue', 0)")
                conn.execute("SELECT awa.prune_v1('queue')")
            if i % 3 == 0 and not stop_producing.is_set():
                with ledger.lock:
                    pool = sorted(ledger.committed)[-30:]
                if pool:
                    victim = rng.choice(pool)
                    row = conn.execute("SELECT awa.cancel_v1(%s)", [victim]).fetchone()
                    if row and row[0] is not None:
                        with ledger.lock:
                            ledger.cancelled[victim] = row[0]
            if i % 4 == 0:
                with ledger.lock:
                    pid = rng.choice(claimer_pids) if claimer_pids else None
                if pid:
                    conn.execute("SELECT pg_cancel_backend(%s)", [pid])
            stop_all.wait(0.01)
        conn.close()

    threads = run_threads(
        [producer(n) for n in range(3)] + [claimer(n) for n in range(3)] + [chaos]
    )
    produce_then_drain(
        ledger, threads, producers=3, jobs=3000, timeout=40, interval=0.2,
        stop_producing=stop_producing, stop_all=stop_all,
    )  # fmt: skip
    assert not ledger.errors, ledger.errors[:5]
    check_attempts(ledger)
    check_lane_order(ledger)
    assert ledger.ended() == ledger.committed
    with pg() as c:
        pruned = c.execute(
            "SELECT count(*) FROM awa.ring_prunes WHERE ring = 'claim' AND outcome = 'pruned'"
        ).fetchone()
        rotations = c.execute(
            "SELECT count(*) FROM awa.ring_rotations WHERE ring = 'queue'"
        ).fetchone()
    # The chaos really truncated claim slots and rotated the queue ring while claims ran (the
    # queue ring's prune needs 16 rotations, which a run of this length reaches only sometimes).
    assert pruned and pruned[0] >= 1 and rotations and rotations[0] >= 4, (pruned, rotations)
    done = terminal(ledger.committed)  # the terminal rows the queue ring still holds
    assert all(len(v) == 1 for v in done.values()), "a job ended twice"
    for job_id in ledger.committed:
        finals = ledger.finals.get(job_id, [])
        cancelled = job_id in ledger.cancelled
        assert finals.count("completed") == (0 if cancelled else 1), (job_id, finals, cancelled)
        if job_id in done:
            [(state, attempt)] = done[job_id]
            assert state == ("cancelled" if cancelled else "completed"), (job_id, state)
            if not cancelled:
                assert attempt == 1 + finals.count("retry"), (job_id, attempt, finals)


# --------------------------------------------------------------------------------------------
# Scenario 2: priority and lane order, one claimer, alternating batches, cancels and gaps.


def test_priority_and_lane_order_with_alternating_batches_cancels_and_gaps() -> None:
    queue = "l17p"
    conns = [producer_conn() for _ in range(4)]
    committed: list[int] = []
    r = random.Random(3)
    # Four producer sessions (four home shards, so several lanes per priority); one of their
    # transactions rolls back in the middle (a gap in its lane).
    for round_ in range(8):
        for n, conn in enumerate(conns):
            jobs = [
                {"kind": "l17.p", "queue": queue, "priority": r.choice((-5, 0, 0, 3, 7))}
                for _ in range(r.randint(1, 6))
            ]
            rollback = round_ == 2 and n == 1
            ids = enqueue(conn, jobs, commit=not rollback)
            if not rollback:
                committed.extend(ids)
    for conn in conns:
        conn.close()
    cancelled = set(r.sample(committed, 10))
    with pg() as c:
        for j in cancelled:
            c.execute("SELECT awa.cancel_v1(%s)", [j])
        prio = dict(
            c.execute(
                "SELECT id, priority FROM awa.jobs WHERE id = ANY(%s)", [committed]
            ).fetchall()
        )
    from awa_django.operator import queue_pause

    # Paused: nothing is claimed, by one-job claims or batches.
    queue_pause(queue)
    with connect() as conn:
        assert claim(conn, queue, 1) == []
        assert claim(conn, queue, 16) == []
    queue_pause(queue, paused=False)
    ledger = Ledger()
    ledger.committed = set(committed)
    order: list[int] = []
    with connect() as conn:
        k = 0
        while True:
            k += 1
            rows = claim(conn, queue, BATCHES[k % len(BATCHES)])
            if not rows:
                break
            ledger.claims.append(Claim(0, 0.0, rows, claim_lanes(conn, rows)))
            ledger.attempts.extend((row["job_id"], row["run_lease"]) for row in rows)
            order.extend(row["job_id"] for row in rows)
            complete(conn, rows)
    check_attempts(ledger)
    check_lane_order(ledger)
    assert sorted(order) == sorted(set(committed) - cancelled)
    prios = [prio[j] for j in order]
    assert prios == sorted(prios, reverse=True), f"priority order broken: {prios}"


# --------------------------------------------------------------------------------------------
# Scenario 6: real workers (two processes, CLAIM_BATCH_SIZE 1) beside raw claimers.


def test_worker_processes_and_raw_claimers_share_a_queue_under_chaos(
    manage_py: Callable[..., ManagedProcess],
) -> None:
    queue = "l17w"
    with pg() as c:
        c.execute(L17_TABLES)
    worker = manage_py(
        "awa_worker",
        "--processes",
        "2",
        "--concurrency",
        "2",
        "--queue",
        queue,
        extra_env=worker_env(concurrent_claims),
    )
    ledger = Ledger()
    stop_producing = threading.Event()
    stop_claimer = threading.Event()
    stop_all = threading.Event()
    rng = random.Random(21)

    def producer(n: int) -> Callable[[], None]:
        def run() -> None:
            conn = producer_conn()
            if n == 1:
                conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
            r = random.Random(50 + n)
            i = 0
            while not stop_producing.is_set():
                i += 1
                jobs = [
                    {
                        "kind": r.choice(("l17.plain", "l17.plain", "l17.flaky", "l17.sleepy")),
                        "queue": queue,
                    }
                    for _ in range(r.randint(1, 3))
                ]
                rollback = i % 4 == 0
                ids = enqueue(conn, jobs, commit=not rollback)
                with ledger.lock:
                    (ledger.rolled_back if rollback else ledger.committed).update(ids)
                stop_producing.wait(0.01)
            conn.close()

        return run

    def claimer() -> None:
        conn = connect()
        k = 0
        while not stop_claimer.is_set():
            k += 1
            try:
                rows = claim(conn, queue, BATCHES[k % len(BATCHES)])
            except psycopg.errors.QueryCanceled:
                continue
            if rows:
                with ledger.lock:
                    ledger.attempts.extend((row["job_id"], row["run_lease"]) for row in rows)
                complete(conn, rows)
            else:
                stop_all.wait(0.01)
        conn.close()

    def chaos() -> None:
        conn = connect()
        i = 0
        while not stop_all.is_set():
            i += 1
            if i % 5 == 0:
                conn.execute("SELECT awa.rotate_v3('claim', 0)")
                conn.execute("SELECT awa.prune_v1('claim')")
            if i % 40 == 0:  # under 16 rotations: the terminal rows checked below stay
                conn.execute("SELECT awa.rotate_v3('queue', 0)")
                conn.execute("SELECT awa.prune_v1('queue')")
            if i % 3 == 0:
                conn.execute(
                    "SELECT pg_cancel_backend(pid) FROM pg_stat_activity"
                    " WHERE pid <> pg_backend_pid() AND state = 'active'"
                    " AND query LIKE '%%claim_v3%%'"
                )
            if i % 6 == 0 and not stop_producing.is_set():
                with ledger.lock:
                    pool = sorted(ledger.committed)[-20:]
                if pool:
                    conn.execute("SELECT awa.cancel_v1(%s)", [rng.choice(pool)])
            stop_all.wait(0.02)
        conn.close()

    threads = run_threads([producer(0), producer(1), claimer, chaos])
    try:
        wait_for(lambda: len(ledger.committed) >= 800, timeout=30, message="800 jobs enqueued")
    finally:
        stop_producing.set()
        join(threads[:2])  # every producer's last commit is in the ledger before the drain
    # Jobs only the worker processes can take (the raw claimer stops first): however the
    # claims above split the work, the workers must finish what is left under the chaos.
    stop_claimer.set()
    join(threads[2:3])
    conn = producer_conn()
    last = enqueue(conn, [{"kind": "l17.plain", "queue": queue} for _ in range(20)], commit=True)
    conn.close()
    with ledger.lock:
        ledger.committed.update(last)
    try:
        wait_for(
            lambda: all_terminal(set(ledger.committed)),
            timeout=40,
            interval=0.2,
            message=lambda: f"every job terminal; worker output:\n{worker.output()[-3000:]}",
        )
    finally:
        stop_all.set()
        join(threads)
        worker.kill()
    with pg() as c:
        runs = c.execute("SELECT job_id, run_lease FROM l17_runs").fetchall()
    assert set(last) <= {j for j, _ in runs}, "the worker processes ran what was left"
    all_attempts = ledger.attempts + [(j, lease) for j, lease in runs]
    seen: set[tuple[int, int]] = set()
    for pair in all_attempts:
        assert pair not in seen, f"attempt {pair} delivered twice"
        seen.add(pair)
    assert not {j for j, _ in all_attempts} & ledger.rolled_back
    done = check_terminal(ledger, ledger.committed)
    assert {s for v in done.values() for s, _ in v} <= {"completed", "cancelled"}


# --------------------------------------------------------------------------------------------
# Scenario 7: one lane, one-job claimers racing at its head: cancels of the head, rollback
# gaps, heavy and keyed jobs at the head (the one-row statement must hand each to the full
# path), weights above what a claim may take.


def test_one_lane_head_races_with_cancels_gaps_weights_and_keys() -> None:
    queue = "l17one"
    with pg() as c:
        c.execute("SELECT awa.ensure_lanes_v1(%s, 0, 1)", [queue])
    ledger = Ledger()
    stop_producing = threading.Event()
    stop_all = threading.Event()

    def producer() -> None:
        conn = producer_conn()
        r = random.Random(77)
        i = 0
        while not stop_producing.is_set():
            i += 1
            weights = [r.choice((1, 1, 1, 1, 2, 3, 9)) for _ in range(r.randint(1, 3))]
            jobs: list[dict[str, Any]] = [
                {
                    "kind": "l17.one",
                    "queue": queue,
                    "metadata": {
                        **({"awa:weight": w} if w > 1 else {}),
                        **({"awa:serial": "k"} if r.random() < 0.1 else {}),
                    },
                }
                for w in weights
            ]
            rollback = i % 3 == 0
            ids = enqueue(conn, jobs, commit=not rollback)
            with ledger.lock:
                (ledger.rolled_back if rollback else ledger.committed).update(ids)
            stop_producing.wait(0.002)
        conn.close()

    def claimer(n: int) -> Callable[[], None]:
        def run() -> None:
            conn = connect()
            serial_release: list[int] = []
            k = 0
            while not stop_all.is_set():
                k += 1
                units = 1 if n < 4 else (2, 3)[k % 2]
                rows = claim(conn, queue, units, max_weight=2, serial_release=serial_release)
                serial_release = []
                if not rows:
                    stop_all.wait(0.002)
                    continue
                lanes = claim_lanes(conn, rows)
                with ledger.lock:
                    if sum(row["weight"] for row in rows) > units:
                        ledger.errors.append(f"claim of {units} units took {rows}")
                    for row in rows:
                        # (from the row: the producer's ledger may lag its commit)
                        w = (row["metadata"] or {}).get("awa:weight", 1)
                        if row["weight"] != min(w, 2):
                            ledger.errors.append(f"weight {row['weight']} for {row['job_id']}")
                    ledger.claims.append(Claim(n, time.monotonic(), rows, lanes))
                    ledger.attempts.extend((row["job_id"], row["run_lease"]) for row in rows)
                stale = set(complete(conn, rows))
                serial_release = [row["serial_lock"] for row in rows if row["serial_lock"]]
                with ledger.lock:
                    for row in rows:
                        if (row["job_id"], row["run_lease"]) not in stale:
                            ledger.finals[row["job_id"]].append("completed")
            if serial_release:
                conn.execute("SELECT awa.serial_release_v1(%s)", [serial_release])
            conn.close()

        return run

    def canceller() -> None:
        conn = connect()
        while not stop_producing.is_set():
            # The lowest job not yet ended: most often the lane's head, ready or just claimed.
            with ledger.lock:
                ended = {j for j, f in ledger.finals.items() if f} | set(ledger.cancelled)
                pool = sorted(ledger.committed - ended)[:3]
            for victim in pool[:1]:
                row = conn.execute("SELECT awa.cancel_v1(%s)", [victim]).fetchone()
                if row and row[0] is not None:
                    with ledger.lock:
                        ledger.cancelled[victim] = row[0]
            stop_producing.wait(0.01)
        conn.close()

    def sweeper() -> None:
        # The maintenance leader's serial sweep (every RESCUE_INTERVAL): a key handed on to a
        # job that the canceller then cancelled before it ran is handed on by nobody else
        # (docs/flow.md, "Crash safety"); without it the key's younger jobs wait for ever.
        conn = connect()
        while not stop_all.is_set():
            conn.execute("SELECT awa.serial_sweep_v1()")
            stop_all.wait(0.05)
        conn.close()

    threads = run_threads([producer, canceller, sweeper] + [claimer(n) for n in range(5)])
    produce_then_drain(
        ledger, threads, producers=2, jobs=600, timeout=30, interval=0.1,
        stop_producing=stop_producing, stop_all=stop_all,
    )  # fmt: skip
    assert not ledger.errors, ledger.errors[:5]
    check_attempts(ledger)
    check_lane_order(ledger)
    for job_id in ledger.committed:
        completed = ledger.finals.get(job_id, []).count("completed")
        assert completed == (0 if job_id in ledger.cancelled else 1), job_id
    with pg() as c:
        assert c.execute("SELECT count(*) FROM awa.serial_waiting").fetchone() == (0,)


# --------------------------------------------------------------------------------------------
# Scenario 8: a pause takes hold for every claim that starts after it, one-job or batch.


def test_a_pause_holds_for_claims_started_after_it_under_load() -> None:
    from awa_django.operator import queue_pause

    queue = "l17z"
    ids = set(enqueue_now([{"kind": "l17.z", "queue": queue} for _ in range(3000)]))
    ledger = Ledger()
    ledger.committed = ids
    # A claim is checked when it started after the pause committed and returned before the
    # resume began (a claim in flight across the resume may take jobs).
    paused_at = [float("inf")]
    resuming_at = [float("inf")]
    after = [0]
    stop = threading.Event()

    def claimer(n: int) -> Callable[[], None]:
        def run() -> None:
            conn = connect()
            k = n
            while not stop.is_set():
                k += 1
                started = time.monotonic()
                rows = claim(conn, queue, BATCHES[k % len(BATCHES)])
                ended = time.monotonic()
                with ledger.lock:
                    if paused_at[0] < started and ended < resuming_at[0]:
                        after[0] += 1
                        if rows:
                            ledger.errors.append(f"claimed {len(rows)} jobs after the pause")
                    ledger.attempts.extend((row["job_id"], row["run_lease"]) for row in rows)
                if rows:
                    complete(conn, rows)
                    with ledger.lock:
                        for row in rows:
                            ledger.finals[row["job_id"]].append("completed")
                else:
                    stop.wait(0.005)
            conn.close()

        return run

    threads = run_threads([claimer(n) for n in range(3)])
    try:
        wait_for(lambda: len(ledger.attempts) >= 300, timeout=20, message="300 claims")
        queue_pause(queue)
        with ledger.lock:
            paused_at[0] = time.monotonic()
        wait_for(lambda: after[0] >= 60, timeout=10, message="60 claims after the pause")
        assert len(ledger.attempts) < len(ids), "the queue drained before the pause"
        with ledger.lock:
            resuming_at[0] = time.monotonic()
        queue_pause(queue, paused=False)
        wait_for(lambda: ledger.ended() >= ids, timeout=30, interval=0.1, message="every job")
    finally:
        stop.set()
        join(threads)
    assert not ledger.errors, ledger.errors[:5]
    check_attempts(ledger)
    assert all(ledger.finals[j] == ["completed"] for j in ids)


# --------------------------------------------------------------------------------------------
# Scenario 10: the one-row statement when the lane's next row is not in the current queue slot
# (a REPEATABLE READ producer writes to the slot its snapshot saw) or is a rollback's gap.


@pytest.mark.parametrize("batch", [1, 2])
def test_one_job_claims_take_a_row_written_to_an_older_queue_slot_in_lane_order(
    batch: int,
) -> None:
    queue = f"l17rr{batch}"
    with pg() as c:
        c.execute("SELECT awa.ensure_lanes_v1(%s, 0, 1)", [queue])
    job = [{"kind": "l17.rr", "queue": queue}]
    order: list[int] = []
    with connect() as claimer, producer_conn() as rr:
        rr.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ

        def claim_all(expect: int) -> None:
            for _ in range(expect):
                rows = claim(claimer, queue, batch)
                order.extend(row["job_id"] for row in rows)
                complete(claimer, rows)

        a = enqueue_now(job)
        a += enqueue_now(job * 2)
        claim_all(3)
        rr.execute("SELECT 1")  # the snapshot: the queue ring's current slot as of now
        with pg() as c:
            assert c.execute("SELECT awa.rotate_v3('queue', 0)").fetchone() == ("rotated",)
        b = enqueue_now(job)  # the new current slot
        with psycopg.connect(conninfo()) as gap:
            enqueue(gap, job, commit=False)  # a gap in the lane
        c_ = enqueue(rr, job)  # the older slot, after b in the lane
        d = enqueue_now(job)
        with pg() as c:
            slots = dict(
                c.execute(
                    "SELECT job_id, ready_slot FROM awa.ready_entries WHERE job_id = ANY(%s)",
                    [b + c_],
                ).fetchall()
            )
        assert slots[c_[0]] != slots[b[0]], "the REPEATABLE READ row went to the current slot"
        claim_all(4)
        e = enqueue_now(job * 3)
        claim_all(3)
        with connect() as check:
            left = claim(check, queue, 16)
        assert left == []
    assert order[3:] == b + c_ + d + e, (a, order)


# --------------------------------------------------------------------------------------------
# The checks themselves catch what they look for (so a green run means something).


def test_the_ledger_checks_catch_duplicates_and_interleaved_lane_runs() -> None:
    ledger = Ledger()
    ledger.committed = {1, 2, 3}
    ledger.attempts = [(1, 1), (2, 1), (1, 1)]
    with pytest.raises(AssertionError, match="twice"):
        check_attempts(ledger)
    row = {"job_id": 0}
    ledger.claims = [
        Claim(0, 0.0, [{**row, "job_id": 1}, {**row, "job_id": 3}], {1: (7, 1), 3: (7, 3)}),
        Claim(1, 0.0, [{**row, "job_id": 2}], {2: (7, 2)}),
    ]
    with pytest.raises(AssertionError, match="interleave"):
        check_lane_order(ledger)
    ledger.claims = [
        Claim(0, 0.0, [{**row, "job_id": 2}, {**row, "job_id": 1}], {1: (7, 1), 2: (7, 2)})
    ]
    with pytest.raises(AssertionError, match="out of order"):
        check_lane_order(ledger)
