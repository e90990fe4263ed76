"""Hostile tests of migration 0017's claim path (``awa.claim_v3``'s lean common path).

Written from the docs (docs/storage.md, docs/flow.md, docs/performance.md "Claim, fourth
pass") and the public SQL API only. Each scenario runs concurrent claimer sessions (threads,
each with its own psycopg connection, calling ``awa.claim_v3`` with batch sizes alternating
between 1, the one-row statement, and larger ones) against concurrent producers and a chaos
thread (promotion, ring rotations and prunes, cancels, ``pg_cancel_backend`` of claimers),
keeps a ledger of every attempt handed out, and checks the contract against the database at
the end: every committed job ends exactly once, no ``(job_id, run_lease)`` is handed out twice,
lane order and priority order hold, flow limits are never exceeded at any instant.
"""

from __future__ import annotations

import itertools
import json
import random
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import psycopg
import pytest

from awa_django.db.storage import Finalization, finalize
from tests.helpers import ManagedProcess, conninfo, pg, wait_for
from tests.lean17jobs import L17_OVERRIDES, L17_TABLES

pytestmark = pytest.mark.usefixtures("clean_awa")

CLAIM = (
    "SELECT job_id, run_lease, attempt, claim_slot, kind, priority, weight, permits,"
    " serial_lock, wait_secs, metadata FROM awa.claim_v3(%s, %s, NULL, %s, NULL, %s, %s, %s,"
    " %s, %s)"
)
ERROR = {"type": "E", "message": "retry on purpose", "traceback": ""}
BATCHES = (1, 1, 5, 1, 3, 16, 1, 2)


@dataclass
class Claim:
    """One claim call's result, as the ledger keeps it."""

    thread: int
    at: float
    rows: list[dict[str, Any]]
    lanes: dict[tuple[int, int], tuple[int, int]] = field(default_factory=dict)


class Ledger:
    """Everything the claimers were handed, under one lock."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.claims: list[Claim] = []
        self.attempts: list[tuple[int, int]] = []
        self.errors: list[str] = []
        self.committed: set[int] = set()
        self.rolled_back: set[int] = set()
        self.finals: dict[int, list[str]] = defaultdict(list)
        self.cancelled: dict[int, str] = {}

    def ended(self) -> set[int]:
        """Jobs the ledger saw end: a completion that won, or a cancel that acted. (The queue
        ring's prune reclaims terminal rows, so a run that rotates the ring 16 times must not
        rely on ``done_entries`` for old jobs.)"""
        with self.lock:
            done = {j for j, f in self.finals.items() if "completed" in f}
            return done | set(self.cancelled)

    def fail(self, message: str) -> None:
        with self.lock:
            self.errors.append(message)


def _connect() -> psycopg.Connection[Any]:
    return psycopg.connect(conninfo(), autocommit=True)


def _claim(
    conn: psycopg.Connection[Any],
    queue: str,
    units: int,
    *,
    aging: float = 3600.0,
    max_weight: int | None = None,
    held: Iterable[int] = (),
    release: Iterable[int] = (),
    serial_held: Iterable[int] = (),
    serial_release: Iterable[int] = (),
) -> list[dict[str, Any]]:
    cur = conn.execute(
        CLAIM,
        [
            queue,
            units,
            aging,
            max_weight,
            list(held) or None,
            list(release) or None,
            list(serial_held) or None,
            list(serial_release) or None,
        ],
    )
    names = [d.name for d in cur.description or ()]
    return [r for r in (dict(zip(names, row, strict=True)) for row in cur) if r["job_id"]]


def _lanes(conn: psycopg.Connection[Any], rows: list[dict[str, Any]]) -> dict[int, tuple[int, int]]:
    """(lane_id, lane_seq) of each claimed attempt, read while its claim is still open."""
    if not rows:
        return {}
    cur = conn.execute(
        "SELECT DISTINCT job_id, lane_id, lane_seq FROM awa.claims"
        " WHERE (job_id, run_lease) IN (SELECT * FROM unnest(%s::bigint[], %s::bigint[]))",
        [[r["job_id"] for r in rows], [r["run_lease"] for r in rows]],
    )
    return {j: (lane, seq) for j, lane, seq in cur}


def _finalize(conn: psycopg.Connection[Any], items: list[Finalization]) -> list[tuple[int, int]]:
    for _ in range(20):
        try:
            return finalize(conn, items)
        except psycopg.errors.QueryCanceled:
            continue
    raise AssertionError("finalize cancelled 20 times in a row")


def _enqueue(
    conn: psycopg.Connection[Any], jobs: list[dict[str, Any]], *, commit: bool = True
) -> list[int]:
    """Enqueue ``jobs`` in one transaction and commit it (or roll it back); a REPEATABLE READ
    producer's serialization failure (the first enqueue of a new queue or priority creating its
    lanes under a concurrent one) is rolled back and reported as ``[]``, as an application
    would retry it."""
    try:
        ids = [
            r[0] for r in conn.execute("SELECT job_id FROM awa.enqueue_v1(%s)", [json.dumps(jobs)])
        ]
    except psycopg.errors.SerializationFailure:
        conn.rollback()
        return []
    conn.commit() if commit else conn.rollback()
    return ids


def _producer_conn() -> psycopg.Connection[Any]:
    """A producer's session; a lock wait that would hang the test fails it instead."""
    conn = psycopg.connect(conninfo())
    conn.execute("SET lock_timeout = '10s'")
    conn.commit()
    return conn


def _enqueue_now(jobs: list[dict[str, Any]]) -> list[int]:
    with psycopg.connect(conninfo()) as conn:
        return _enqueue(conn, jobs)


def _run_threads(targets: list[Callable[[], None]]) -> list[threading.Thread]:
    threads = [threading.Thread(target=t, daemon=True) for t in targets]
    for t in threads:
        t.start()
    return threads


def _join(threads: list[threading.Thread], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.1, deadline - time.monotonic()))
        assert not t.is_alive(), "a test thread did not finish"


def _terminal(ids: Iterable[int]) -> dict[int, list[tuple[str, int]]]:
    with pg() as c:
        cur = c.execute(
            "SELECT job_id, state, attempt FROM awa.done_entries WHERE job_id = ANY(%s)",
            [list(ids)],
        )
        out: dict[int, list[tuple[str, int]]] = defaultdict(list)
        for job_id, state, attempt in cur:
            out[job_id].append((state, attempt))
        return out


def _all_terminal(ids: set[int]) -> bool:
    return set(_terminal(ids)) >= ids


def _missing(ids: set[int]) -> str:
    """What the jobs not yet terminal look like (for a timeout's message)."""
    left = sorted(ids - set(_terminal(ids)))
    with pg() as c:
        rows = c.execute(
            "SELECT id, state, priority, run_at, now() - run_at, metadata FROM awa.jobs"
            " WHERE id = ANY(%s) ORDER BY id LIMIT 8",
            [left],
        ).fetchall()
        lanes = c.execute(
            "SELECT e.job_id, e.lane_id, e.lane_seq, e.ready_slot, e.ready_generation,"
            " EXISTS (SELECT 1 FROM awa.ready_tombstones t WHERE t.job_id = e.job_id)"
            " FROM awa.ready_entries e WHERE e.job_id = ANY(%s) ORDER BY e.job_id LIMIT 8",
            [left],
        ).fetchall()
        depth = c.execute("SELECT * FROM awa.queue_depth_v1()").fetchall()
        rings = c.execute("SELECT * FROM awa.ring_state").fetchall()
    return (
        f"{len(left)} not terminal, e.g. {rows}; ready rows {lanes}; depth {depth}; rings {rings}"
    )


def _check_attempts(ledger: Ledger) -> None:
    """No (job_id, run_lease) twice; no rolled-back job claimed; attempts never go back."""
    seen: set[tuple[int, int]] = set()
    for pair in ledger.attempts:
        assert pair not in seen, f"attempt {pair} handed out twice"
        seen.add(pair)
    claimed = {j for j, _ in ledger.attempts}
    bad = sorted(claimed & ledger.rolled_back)
    if bad:
        with pg() as c:
            rows = c.execute(
                "SELECT id, state, args, created_at FROM awa.jobs WHERE id = ANY(%s)", [bad[:6]]
            ).fetchall()
        raise AssertionError(f"jobs of rolled-back producers were claimed: {rows}")
    assert claimed <= ledger.committed, "a claimed job was never committed by a producer"


def _check_lane_order(ledger: Ledger) -> None:
    """Per lane, first attempts are claimed in lane order: the lane positions one claim call
    took from a lane form a run that never interleaves with another call's run."""
    runs: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for claim in ledger.claims:
        per_lane: dict[int, list[int]] = defaultdict(list)
        for r in claim.rows:
            lane = claim.lanes.get(r["job_id"])
            assert lane is not None, f"no claim row for {r['job_id']}"
            per_lane[lane[0]].append(lane[1])
        for lane_id, seqs in per_lane.items():
            assert seqs == sorted(seqs), f"lane {lane_id}: one claim took {seqs} out of order"
            runs[lane_id].append((seqs[0], seqs[-1]))
    for lane_id, spans in runs.items():
        spans.sort()
        for (a0, a1), (b0, b1) in itertools.pairwise(spans):
            assert a1 < b0, f"lane {lane_id}: claims {a0}..{a1} and {b0}..{b1} interleave"


def _check_terminal(ledger: Ledger, ids: set[int]) -> dict[int, list[tuple[str, int]]]:
    done = _terminal(ids)
    twice = {j: v for j, v in done.items() if len(v) != 1}
    assert not twice, f"jobs ended more than once: {dict(list(twice.items())[:5])}"
    assert set(done) == ids, f"committed jobs never ended: {sorted(ids - set(done))[:20]}"
    return done


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
            conn = _producer_conn()
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
                    ids = _enqueue(conn, jobs, commit=not rollback)
                with ledger.lock:
                    (ledger.rolled_back if rollback else ledger.committed).update(ids)
            conn.close()

        return run

    def claimer(n: int) -> Callable[[], None]:
        def run() -> None:
            conn = _connect()
            with ledger.lock:
                claimer_pids.append(conn.info.backend_pid)
            r = random.Random(100 + n)
            k = n
            while not stop_all.is_set():
                k += 1
                try:
                    rows = _claim(conn, queue, BATCHES[k % len(BATCHES)])
                except psycopg.errors.QueryCanceled:
                    continue
                if not rows:
                    stop_all.wait(0.005)
                    continue
                try:
                    lanes = _lanes(conn, rows)
                except psycopg.errors.QueryCanceled:
                    lanes = _lanes(conn, rows)
                items = []
                for row in rows:
                    # wait_secs is measured from the claim's now() (its transaction's start),
                    # and a claim's later statements see rows committed after it, so it can be
                    # a few ms below 0 for a job enqueued while the claim ran; a delayed job
                    # claimed before its run_at would show about -0.3 s.
                    if row["wait_secs"] is not None and row["wait_secs"] < -0.2:
                        ledger.fail(f"job {row['job_id']} claimed {row['wait_secs']} s early")
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
                stale = set(_finalize(conn, items))
                with ledger.lock:
                    for item in items:
                        if (item.job_id, item.run_lease) not in stale:
                            ledger.finals[item.job_id].append(item.outcome)
            conn.close()

        return run

    def chaos() -> None:
        conn = _connect()
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

    threads = _run_threads(
        [producer(n) for n in range(3)] + [claimer(n) for n in range(3)] + [chaos]
    )
    try:
        wait_for(lambda: len(ledger.committed) >= 3000, timeout=40, message="3000 jobs enqueued")
    finally:
        stop_producing.set()
    try:
        wait_for(
            lambda: ledger.ended() >= ledger.committed,
            timeout=40,
            interval=0.2,
            message=lambda: f"every job ended: {_missing(ledger.committed - ledger.ended())}",
        )
    finally:
        stop_all.set()
        _join(threads)
    assert not ledger.errors, ledger.errors[:5]
    _check_attempts(ledger)
    _check_lane_order(ledger)
    assert ledger.ended() == ledger.committed
    done = _terminal(ledger.committed)  # the terminal rows the queue ring still holds
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
    conns = [_producer_conn() for _ in range(4)]
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
            ids = _enqueue(conn, jobs, commit=not rollback)
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
    with _connect() as conn:
        assert _claim(conn, queue, 1) == []
        assert _claim(conn, queue, 16) == []
    queue_pause(queue, paused=False)
    ledger = Ledger()
    ledger.committed = set(committed)
    order: list[int] = []
    with _connect() as conn:
        k = 0
        while True:
            k += 1
            rows = _claim(conn, queue, BATCHES[k % len(BATCHES)])
            if not rows:
                break
            ledger.claims.append(Claim(0, 0.0, rows, _lanes(conn, rows)))
            ledger.attempts.extend((row["job_id"], row["run_lease"]) for row in rows)
            order.extend(row["job_id"] for row in rows)
            _finalize(
                conn,
                [
                    Finalization(
                        row["job_id"], row["run_lease"], row["claim_slot"], "completed", "null"
                    )
                    for row in rows
                ],
            )
    _check_attempts(ledger)
    _check_lane_order(ledger)
    assert sorted(order) == sorted(set(committed) - cancelled)
    prios = [prio[j] for j in order]
    assert prios == sorted(prios, reverse=True), f"priority order broken: {prios}"


# --------------------------------------------------------------------------------------------
# Scenario 3: a queue's global concurrency with weights, concurrent claimers.


def _permit_sampler(
    queue: str, limit: int, stop: threading.Event, ledger: Ledger
) -> Callable[[], None]:
    def run() -> None:
        with _connect() as conn:
            while not stop.is_set():
                n = conn.execute(
                    "SELECT count(*) FROM pg_locks l WHERE locktype = 'advisory'"
                    " AND classid = 4282182 AND granted AND l.objid::bigint IN"
                    " (SELECT (awa._flow_key_v1(%s, i)::bigint + 4294967296) %% 4294967296"
                    "  FROM generate_series(0, 99) i)",
                    [queue],
                ).fetchone()
                if n and n[0] > limit:
                    ledger.fail(f"{n[0]} permits of {queue} held at once (limit {limit})")
                stop.wait(0.003)

    return run


def _holding_claimers(
    queue: str,
    ledger: Ledger,
    stop: threading.Event,
    *,
    n_threads: int,
    units: tuple[int, ...],
    max_weight: int | None,
    on_claim: Callable[[int, list[dict[str, Any]]], None],
    on_release: Callable[[int, list[dict[str, Any]]], None],
    serial: bool = False,
) -> list[Callable[[], None]]:
    """Claimers that hold what they claim for one or two further claims, then hand it back
    (permits and serial keys through ``p_release``/``p_serial_release`` of the next claim) and
    complete it. ``on_release`` runs before the claim that hands things back is sent, so a
    ledger built with it holds at most what the database holds."""

    def claimer(n: int) -> Callable[[], None]:
        def run() -> None:
            conn = _connect()
            r = random.Random(n)
            running: list[tuple[int, dict[str, Any]]] = []
            k = n
            while not stop.is_set():
                k += 1
                ending = [row for left, row in running if left <= 0]
                running = [(left - 1, row) for left, row in running if left > 0]
                if ending:
                    on_release(n, ending)
                release = [p for row in ending for p in (row["permits"] or [])]
                serial_release = [row["serial_lock"] for row in ending if row["serial_lock"]]
                held = [p for _, row in running for p in (row["permits"] or [])]
                serial_held = [row["serial_lock"] for _, row in running if row["serial_lock"]]
                rows = _claim(
                    conn,
                    queue,
                    units[k % len(units)],
                    max_weight=max_weight,
                    held=held,
                    release=release,
                    serial_held=serial_held if serial else (),
                    serial_release=serial_release if serial else (),
                )
                if ending:
                    _finalize(
                        conn,
                        [
                            Finalization(
                                row["job_id"],
                                row["run_lease"],
                                row["claim_slot"],
                                "completed",
                                "null",
                            )
                            for row in ending
                        ],
                    )
                if rows:
                    on_claim(n, rows)
                    with ledger.lock:
                        ledger.attempts.extend((row["job_id"], row["run_lease"]) for row in rows)
                    running.extend((r.randint(0, 2), row) for row in rows)
                elif not running:
                    stop.wait(0.005)
            conn.close()

        return run

    return [claimer(n) for n in range(n_threads)]


def test_queue_global_concurrency_and_heavy_weights_hold_under_concurrent_claims() -> None:
    from awa_django.operator import set_queue_limits

    queue, limit = "l17g", 4
    set_queue_limits(queue, global_concurrency=limit, actor="attack17")
    r = random.Random(5)
    weights = [r.choice((1, 1, 1, 2, 3, 4, 6)) for _ in range(500)]
    ids = _enqueue_now(
        [
            {
                "kind": "l17.g",
                "queue": queue,
                "metadata": {"awa:weight": w},
                "args": {"args": [w], "kwargs": {}},
            }
            for w in weights
        ]
    )
    weight_of = dict(zip(ids, weights, strict=True))
    with pg() as c:
        keys = {
            k
            for (k,) in c.execute(
                "SELECT awa._flow_key_v1(%s, i) FROM generate_series(0, %s) i", [queue, limit - 1]
            )
        }
    ledger = Ledger()
    ledger.committed = set(ids)
    held: dict[tuple[int, int], tuple[int, list[int]]] = {}
    stop = threading.Event()

    def on_claim(n: int, rows: list[dict[str, Any]]) -> None:
        with ledger.lock:
            for row in rows:
                want = min(weight_of[row["job_id"]], limit, 5)
                permits = row["permits"] or []
                if row["weight"] != want or len(permits) != want:
                    ledger.errors.append(
                        f"job {row['job_id']}: weight {row['weight']}, permits {permits},"
                        f" want {want}"
                    )
                if not set(permits) <= keys or len(set(permits)) != len(permits):
                    ledger.errors.append(f"permits not {want} of the queue's {limit}: {permits}")
                taken = {p for _, ps in held.values() for p in ps}
                if taken & set(permits):
                    ledger.errors.append(f"permits {taken & set(permits)} handed out twice")
                held[(row["job_id"], row["run_lease"])] = (row["weight"], permits)
                if sum(w for w, _ in held.values()) > limit:
                    ledger.errors.append(
                        f"{sum(w for w, _ in held.values())} units running (limit {limit})"
                    )

    def on_release(n: int, rows: list[dict[str, Any]]) -> None:
        with ledger.lock:
            for row in rows:
                held.pop((row["job_id"], row["run_lease"]), None)

    claimers = _holding_claimers(
        queue,
        ledger,
        stop,
        n_threads=4,
        units=(1, 5, 1, 2),
        max_weight=5,
        on_claim=on_claim,
        on_release=on_release,
    )
    threads = _run_threads([*claimers, _permit_sampler(queue, limit, stop, ledger)])
    try:
        wait_for(
            lambda: _all_terminal(set(ids)), timeout=30, interval=0.1, message="every job done"
        )
    finally:
        stop.set()
        _join(threads)
    assert not ledger.errors, ledger.errors[:5]
    _check_attempts(ledger)
    done = _check_terminal(ledger, set(ids))
    assert {s for v in done.values() for s, _ in v} == {"completed"}


# --------------------------------------------------------------------------------------------
# Scenario 4: a kind's global concurrency (parked jobs) and a queue rate limit.


def test_kind_limit_parks_and_unparks_without_exceeding_or_stranding() -> None:
    from awa_django.operator import set_kind_limits

    queue, limit = "l17k", 2
    set_kind_limits("l17.k2", global_concurrency=limit, actor="attack17")
    r = random.Random(9)
    kinds = [r.choice(("l17.k2", "l17.k2", "l17.free")) for _ in range(400)]
    ids = _enqueue_now([{"kind": k, "queue": queue} for k in kinds])
    ledger = Ledger()
    ledger.committed = set(ids)
    running: set[tuple[int, int]] = set()
    stop = threading.Event()

    def on_claim(n: int, rows: list[dict[str, Any]]) -> None:
        with ledger.lock:
            for row in rows:
                if row["kind"] == "l17.k2":
                    running.add((row["job_id"], row["run_lease"]))
            if len(running) > limit:
                ledger.errors.append(f"{len(running)} jobs of l17.k2 running (limit {limit})")

    def on_release(n: int, rows: list[dict[str, Any]]) -> None:
        with ledger.lock:
            for row in rows:
                running.discard((row["job_id"], row["run_lease"]))

    threads = _run_threads(
        _holding_claimers(
            queue,
            ledger,
            stop,
            n_threads=3,
            units=(1, 4, 1, 8),
            max_weight=None,
            on_claim=on_claim,
            on_release=on_release,
        )
    )
    try:
        wait_for(
            lambda: _all_terminal(set(ids)), timeout=30, interval=0.1, message="every job done"
        )
    finally:
        stop.set()
        _join(threads)
    assert not ledger.errors, ledger.errors[:5]
    _check_attempts(ledger)
    _check_terminal(ledger, set(ids))
    with pg() as c:
        assert c.execute("SELECT count(*) FROM awa.flow_waiting").fetchone() == (0,)


@pytest.mark.parametrize("owner", ["queue", "kind"])
def test_rate_limit_holds_for_one_job_and_batch_claims(owner: str) -> None:
    from awa_django.operator import set_kind_limits, set_queue_limits

    queue, rate, burst = f"l17r{owner}", 40.0, 3
    if owner == "queue":
        set_queue_limits(queue, rate_limit=rate, rate_burst=burst, actor="attack17")
        kinds = ["l17.r"] * 50
    else:
        set_kind_limits("l17.kr", rate_limit=rate, rate_burst=burst, actor="attack17")
        kinds = [random.Random(4).choice(("l17.kr", "l17.kr", "l17.free")) for _ in range(75)]
    ids = _enqueue_now([{"kind": k, "queue": queue} for k in kinds])
    limited = {"l17.r", "l17.kr"}
    starts: list[tuple[float, int]] = []
    lock = threading.Lock()
    attempts: list[tuple[int, int]] = []
    stop = threading.Event()

    def claimer(n: int) -> Callable[[], None]:
        def run() -> None:
            with psycopg.connect(conninfo()) as conn:
                k = n
                while not stop.is_set():
                    k += 1
                    now = conn.execute("SELECT extract(epoch FROM now())::float8").fetchone()
                    rows = _claim(conn, queue, BATCHES[k % len(BATCHES)])
                    conn.commit()
                    if rows:
                        assert now is not None
                        with lock:
                            starts.append((now[0], sum(r["kind"] in limited for r in rows)))
                            attempts.extend((row["job_id"], row["run_lease"]) for row in rows)
                        _finalize(
                            conn,
                            [
                                Finalization(
                                    r["job_id"],
                                    r["run_lease"],
                                    r["claim_slot"],
                                    "completed",
                                    "null",
                                )
                                for r in rows
                            ],
                        )
                        conn.commit()
                    else:
                        stop.wait(0.005)

        return run

    threads = _run_threads([claimer(n) for n in range(3)])
    try:
        wait_for(
            lambda: _all_terminal(set(ids)), timeout=20, interval=0.1, message="every job done"
        )
    finally:
        stop.set()
        _join(threads)
    assert len(set(attempts)) == len(attempts) == len(ids)
    starts.sort()
    for i, (t0, _) in enumerate(starts):
        total = 0
        for t1, n in starts[i:]:
            total += n
            assert total <= rate * (t1 - t0) + burst + 1e-6, (
                f"{total} jobs started in {t1 - t0:.3f} s (rate {rate}, burst {burst})"
            )


# --------------------------------------------------------------------------------------------
# Scenario 5: serial keys, one at a time and in enqueue order.


def test_serial_keys_run_one_at_a_time_in_enqueue_order() -> None:
    queue = "l17s"
    r = random.Random(11)
    keys = [r.choice(("a", "b", "c", None)) for _ in range(240)]
    # Several producer transactions so the keys' jobs spread over lanes and priorities.
    ids: list[int] = []
    for chunk in range(0, 240, 15):
        ids += _enqueue_now(
            [
                {
                    "kind": "l17.s",
                    "queue": queue,
                    "priority": r.choice((0, 0, 2)),
                    **({"metadata": {"awa:serial": k}} if k else {}),
                }
                for k in keys[chunk : chunk + 15]
            ]
        )
    key_of = dict(zip(ids, keys, strict=True))
    ledger = Ledger()
    ledger.committed = set(ids)
    running: dict[str, set[int]] = defaultdict(set)
    started: dict[str, list[int]] = defaultdict(list)
    stop = threading.Event()

    def on_claim(n: int, rows: list[dict[str, Any]]) -> None:
        with ledger.lock:
            for row in rows:
                key = key_of[row["job_id"]]
                if key:
                    running[key].add(row["job_id"])
                    started[key].append(row["job_id"])
                    if len(running[key]) > 1:
                        ledger.errors.append(f"key {key}: {sorted(running[key])} run at once")

    def on_release(n: int, rows: list[dict[str, Any]]) -> None:
        with ledger.lock:
            for row in rows:
                key = key_of[row["job_id"]]
                if key:
                    running[key].discard(row["job_id"])

    threads = _run_threads(
        _holding_claimers(
            queue,
            ledger,
            stop,
            n_threads=3,
            units=(1, 6, 1, 3),
            max_weight=None,
            on_claim=on_claim,
            on_release=on_release,
            serial=True,
        )
    )
    try:
        wait_for(
            lambda: _all_terminal(set(ids)), timeout=30, interval=0.1, message="every job done"
        )
    finally:
        stop.set()
        _join(threads)
    assert not ledger.errors, ledger.errors[:5]
    _check_attempts(ledger)
    _check_terminal(ledger, set(ids))
    for key, order in started.items():
        assert order == sorted(order), f"key {key} started out of enqueue order: {order}"


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
        extra_env={"AWA_TEST_OVERRIDES": json.dumps(L17_OVERRIDES)},
    )
    ledger = Ledger()
    stop_producing = threading.Event()
    stop_all = threading.Event()
    rng = random.Random(21)

    def producer(n: int) -> Callable[[], None]:
        def run() -> None:
            conn = _producer_conn()
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
                ids = _enqueue(conn, jobs, commit=not rollback)
                with ledger.lock:
                    (ledger.rolled_back if rollback else ledger.committed).update(ids)
                stop_producing.wait(0.01)
            conn.close()

        return run

    def claimer() -> None:
        conn = _connect()
        k = 0
        while not stop_all.is_set():
            k += 1
            try:
                rows = _claim(conn, queue, BATCHES[k % len(BATCHES)])
            except psycopg.errors.QueryCanceled:
                continue
            if rows:
                with ledger.lock:
                    ledger.attempts.extend((row["job_id"], row["run_lease"]) for row in rows)
                _finalize(
                    conn,
                    [
                        Finalization(
                            r_["job_id"], r_["run_lease"], r_["claim_slot"], "completed", "null"
                        )
                        for r_ in rows
                    ],
                )
            else:
                stop_all.wait(0.01)
        conn.close()

    def chaos() -> None:
        conn = _connect()
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

    threads = _run_threads([producer(0), producer(1), claimer, chaos])
    try:
        wait_for(lambda: len(ledger.committed) >= 800, timeout=30, message="800 jobs enqueued")
    finally:
        stop_producing.set()
    try:
        wait_for(
            lambda: _all_terminal(set(ledger.committed)),
            timeout=40,
            interval=0.2,
            message=lambda: f"every job terminal; worker output:\n{worker.output()[-3000:]}",
        )
    finally:
        stop_all.set()
        _join(threads)
        worker.kill()
    with pg() as c:
        runs = c.execute("SELECT job_id, run_lease FROM l17_runs").fetchall()
        pids = c.execute("SELECT count(DISTINCT pid) FROM l17_runs").fetchone()
    assert pids == (2,), f"both worker processes ran jobs: {pids}"
    assert len(runs) >= 50 and len(ledger.attempts) >= 50, (len(runs), len(ledger.attempts))
    all_attempts = ledger.attempts + [(j, lease) for j, lease in runs]
    seen: set[tuple[int, int]] = set()
    for pair in all_attempts:
        assert pair not in seen, f"attempt {pair} delivered twice"
        seen.add(pair)
    assert not {j for j, _ in all_attempts} & ledger.rolled_back
    done = _check_terminal(ledger, ledger.committed)
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
        conn = _producer_conn()
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
            ids = _enqueue(conn, jobs, commit=not rollback)
            with ledger.lock:
                (ledger.rolled_back if rollback else ledger.committed).update(ids)
            stop_producing.wait(0.002)
        conn.close()

    def claimer(n: int) -> Callable[[], None]:
        def run() -> None:
            conn = _connect()
            serial_release: list[int] = []
            k = 0
            while not stop_all.is_set():
                k += 1
                units = 1 if n < 4 else (2, 3)[k % 2]
                rows = _claim(conn, queue, units, max_weight=2, serial_release=serial_release)
                serial_release = []
                if not rows:
                    stop_all.wait(0.002)
                    continue
                lanes = _lanes(conn, rows)
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
                stale = set(
                    _finalize(
                        conn,
                        [
                            Finalization(
                                row["job_id"],
                                row["run_lease"],
                                row["claim_slot"],
                                "completed",
                                "null",
                            )
                            for row in rows
                        ],
                    )
                )
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
        conn = _connect()
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

    threads = _run_threads([producer, canceller] + [claimer(n) for n in range(5)])
    try:
        wait_for(lambda: len(ledger.committed) >= 600, timeout=30, message="600 jobs enqueued")
    finally:
        stop_producing.set()
    try:
        wait_for(
            lambda: ledger.ended() >= ledger.committed,
            timeout=30,
            interval=0.1,
            message=lambda: f"every job ended: {_missing(ledger.committed - ledger.ended())}",
        )
    finally:
        stop_all.set()
        _join(threads)
    assert not ledger.errors, ledger.errors[:5]
    _check_attempts(ledger)
    _check_lane_order(ledger)
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
    ids = set(_enqueue_now([{"kind": "l17.z", "queue": queue} for _ in range(3000)]))
    ledger = Ledger()
    ledger.committed = ids
    paused_at = [float("inf")]
    after = [0]
    stop = threading.Event()

    def claimer(n: int) -> Callable[[], None]:
        def run() -> None:
            conn = _connect()
            k = n
            while not stop.is_set():
                k += 1
                started = time.monotonic()
                rows = _claim(conn, queue, BATCHES[k % len(BATCHES)])
                with ledger.lock:
                    if started > paused_at[0]:
                        after[0] += 1
                        if rows:
                            ledger.errors.append(f"claimed {len(rows)} jobs after the pause")
                    ledger.attempts.extend((row["job_id"], row["run_lease"]) for row in rows)
                if rows:
                    _finalize(
                        conn,
                        [
                            Finalization(
                                row["job_id"],
                                row["run_lease"],
                                row["claim_slot"],
                                "completed",
                                "null",
                            )
                            for row in rows
                        ],
                    )
                    with ledger.lock:
                        for row in rows:
                            ledger.finals[row["job_id"]].append("completed")
                else:
                    stop.wait(0.005)
            conn.close()

        return run

    threads = _run_threads([claimer(n) for n in range(3)])
    try:
        wait_for(lambda: len(ledger.attempts) >= 300, timeout=20, message="300 claims")
        queue_pause(queue)
        with ledger.lock:
            paused_at[0] = time.monotonic()
        wait_for(lambda: after[0] >= 60, timeout=10, message="60 claims after the pause")
        assert len(ledger.attempts) < len(ids), "the queue drained before the pause"
        queue_pause(queue, paused=False)
        with ledger.lock:
            paused_at[0] = float("inf")
        wait_for(lambda: ledger.ended() >= ids, timeout=30, interval=0.1, message="every job")
    finally:
        stop.set()
        _join(threads)
    assert not ledger.errors, ledger.errors[:5]
    _check_attempts(ledger)
    assert all(ledger.finals[j] == ["completed"] for j in ids)


# --------------------------------------------------------------------------------------------
# Scenario 9: a kind's limit set, cleared and set again while claimers run (0017's first
# statement reads the limited kinds): the limit holds, and jobs parked under it are un-parked
# once it is cleared, also when nothing else is left in the queue.


def test_kind_limit_set_cleared_and_set_again_mid_run_strands_nothing() -> None:
    from awa_django.operator import clear_kind_limits, set_kind_limits

    queue, kind = "l17c", "l17.c"
    r = random.Random(12)
    ids = _enqueue_now(
        [{"kind": r.choice((kind, kind, kind, "l17.free")), "queue": queue} for _ in range(500)]
    )
    ledger = Ledger()
    ledger.committed = set(ids)
    bound = [10_000]
    running: set[tuple[int, int]] = set()
    stop = threading.Event()

    def on_claim(n: int, rows: list[dict[str, Any]]) -> None:
        with ledger.lock:
            for row in rows:
                if row["kind"] == kind and row["permits"]:
                    running.add((row["job_id"], row["run_lease"]))
            if len(running) > bound[0]:
                ledger.errors.append(f"{len(running)} jobs of {kind} hold permits (<= {bound[0]})")

    def on_release(n: int, rows: list[dict[str, Any]]) -> None:
        with ledger.lock:
            for row in rows:
                running.discard((row["job_id"], row["run_lease"]))

    claimers = _holding_claimers(
        queue,
        ledger,
        stop,
        n_threads=3,
        units=(1, 4, 1, 2),
        max_weight=None,
        on_claim=on_claim,
        on_release=on_release,
    )
    threads = _run_threads(claimers)

    def attempts() -> int:
        with ledger.lock:
            return len(ledger.attempts)

    try:
        wait_for(lambda: attempts() >= 40, timeout=10, message="40 attempts")
        with ledger.lock:
            bound[0] = 1
        set_kind_limits(kind, global_concurrency=1, actor="attack17")
        base = attempts()
        wait_for(lambda: attempts() >= base + 60, timeout=20, message="60 more attempts")
        clear_kind_limits(kind, actor="attack17")
        with ledger.lock:
            bound[0] = 10_000
        base = attempts()
        wait_for(lambda: attempts() >= base + 40, timeout=20, message="40 more attempts")
        with ledger.lock:
            bound[0] = 2
        set_kind_limits(kind, global_concurrency=2, actor="attack17")
        # Wait until every job of other kinds is done and only the limited kind is left,
        # most of it parked; then lift the limit: the parked jobs must still run.
        wait_for(
            lambda: _parked() > 0 or _all_terminal(set(ids)), timeout=20, message="parked jobs"
        )
        clear_kind_limits(kind, actor="attack17")
        with ledger.lock:
            bound[0] = 10_000
        wait_for(
            lambda: _all_terminal(set(ids)),
            timeout=30,
            interval=0.1,
            message=lambda: f"every job done: {_missing(set(ids))}; parked {_parked()}",
        )
    finally:
        stop.set()
        _join(threads)
    assert not ledger.errors, ledger.errors[:5]
    _check_attempts(ledger)
    _check_terminal(ledger, set(ids))
    assert _parked() == 0


def _parked() -> int:
    with pg() as c:
        row = c.execute("SELECT count(*) FROM awa.flow_waiting").fetchone()
        return int(row[0]) if row else 0


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
    with _connect() as claimer, _producer_conn() as rr:
        rr.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ

        def claim_all(expect: int) -> None:
            for _ in range(expect):
                rows = _claim(claimer, queue, batch)
                order.extend(row["job_id"] for row in rows)
                _finalize(
                    claimer,
                    [
                        Finalization(
                            r_["job_id"], r_["run_lease"], r_["claim_slot"], "completed", "null"
                        )
                        for r_ in rows
                    ],
                )

        a = _enqueue_now(job)
        a += _enqueue_now(job * 2)
        claim_all(3)
        rr.execute("SELECT 1")  # the snapshot: the queue ring's current slot as of now
        with pg() as c:
            assert c.execute("SELECT awa.rotate_v3('queue', 0)").fetchone() == ("rotated",)
        b = _enqueue_now(job)  # the new current slot
        with psycopg.connect(conninfo()) as gap:
            _enqueue(gap, job, commit=False)  # a gap in the lane
        c_ = _enqueue(rr, job)  # the older slot, after b in the lane
        d = _enqueue_now(job)
        with pg() as c:
            slots = dict(
                c.execute(
                    "SELECT job_id, ready_slot FROM awa.ready_entries WHERE job_id = ANY(%s)",
                    [b + c_],
                ).fetchall()
            )
        assert slots[c_[0]] != slots[b[0]], "the REPEATABLE READ row went to the current slot"
        claim_all(4)
        e = _enqueue_now(job * 3)
        claim_all(3)
        with _connect() as check:
            left = _claim(check, queue, 16)
        assert left == []
    assert order[3:] == b + c_ + d + e, (a, order)
