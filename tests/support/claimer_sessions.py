"""Shared harness of tests/storage/test_claim_concurrent_sessions*.py (``awa.claim_v3``).

Claimer sessions call ``awa.claim_v3`` through psycopg connections of their own; a ``Ledger``
keeps every attempt they were handed, and the ``check_*`` functions hold it against the
contract (docs/storage.md, docs/flow.md).
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

from awa_django.db import storage
from awa_django.db.storage import Finalization
from tests.support.database import conninfo, pg
from tests.support.polling import wait_for

__all__ = [
    "BATCHES",
    "CLAIM",
    "ERROR",
    "Claim",
    "Ledger",
    "all_terminal",
    "check_attempts",
    "check_lane_order",
    "check_terminal",
    "claim",
    "claim_lanes",
    "complete",
    "connect",
    "enqueue",
    "enqueue_now",
    "finalize_items",
    "holding_claimers",
    "join",
    "missing",
    "parked",
    "permit_sampler",
    "produce_then_drain",
    "producer_conn",
    "run_threads",
    "run_until_terminal",
    "terminal",
]

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


def connect() -> psycopg.Connection[Any]:
    return psycopg.connect(conninfo(), autocommit=True)


def claim(
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


def claim_lanes(
    conn: psycopg.Connection[Any], rows: list[dict[str, Any]]
) -> dict[int, tuple[int, int]]:
    """(lane_id, lane_seq) of each claimed attempt, read while its claim is still open."""
    if not rows:
        return {}
    cur = conn.execute(
        "SELECT DISTINCT job_id, lane_id, lane_seq FROM awa.claims"
        " WHERE (job_id, run_lease) IN (SELECT * FROM unnest(%s::bigint[], %s::bigint[]))",
        [[r["job_id"] for r in rows], [r["run_lease"] for r in rows]],
    )
    return {j: (lane, seq) for j, lane, seq in cur}


def finalize_items(
    conn: psycopg.Connection[Any], items: list[Finalization]
) -> list[tuple[int, int]]:
    for _ in range(20):
        try:
            return storage.finalize(conn, items)
        except psycopg.errors.QueryCanceled:
            continue
    raise AssertionError("finalize cancelled 20 times in a row")


def complete(conn: psycopg.Connection[Any], rows: list[dict[str, Any]]) -> list[tuple[int, int]]:
    """Finalize every claimed row of ``rows`` as completed (result ``null``); the stale ones."""
    return finalize_items(
        conn,
        [
            Finalization(r["job_id"], r["run_lease"], r["claim_slot"], "completed", "null")
            for r in rows
        ],
    )


def enqueue(
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


def producer_conn() -> psycopg.Connection[Any]:
    """A producer's session; a lock wait that would hang the test fails it instead."""
    conn = psycopg.connect(conninfo())
    conn.execute("SET lock_timeout = '10s'")
    conn.commit()
    return conn


def enqueue_now(jobs: list[dict[str, Any]]) -> list[int]:
    with psycopg.connect(conninfo()) as conn:
        return enqueue(conn, jobs)


def run_threads(targets: list[Callable[[], None]]) -> list[threading.Thread]:
    threads = [threading.Thread(target=t, daemon=True) for t in targets]
    for t in threads:
        t.start()
    return threads


def join(threads: list[threading.Thread], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.1, deadline - time.monotonic()))
        assert not t.is_alive(), "a test thread did not finish"


def terminal(ids: Iterable[int]) -> dict[int, list[tuple[str, int]]]:
    with pg() as c:
        cur = c.execute(
            "SELECT job_id, state, attempt FROM awa.done_entries WHERE job_id = ANY(%s)",
            [list(ids)],
        )
        out: dict[int, list[tuple[str, int]]] = defaultdict(list)
        for job_id, state, attempt in cur:
            out[job_id].append((state, attempt))
        return out


def all_terminal(ids: set[int]) -> bool:
    return set(terminal(ids)) >= ids


def missing(ids: set[int]) -> str:
    """What the jobs not yet terminal look like (for a timeout's message)."""
    left = sorted(ids - set(terminal(ids)))
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


def produce_then_drain(
    ledger: Ledger,
    threads: list[threading.Thread],
    *,
    producers: int,
    jobs: int,
    timeout: float,
    interval: float,
    stop_producing: threading.Event,
    stop_all: threading.Event,
) -> None:
    """Let the first ``producers`` of ``threads`` commit ``jobs`` jobs, stop and join them (so
    every producer's last commit is in the ledger), then wait until every committed job ended
    and stop and join the rest."""
    try:
        wait_for(
            lambda: len(ledger.committed) >= jobs, timeout=timeout, message=f"{jobs} jobs enqueued"
        )
    finally:
        stop_producing.set()
        join(threads[:producers])
    try:
        wait_for(
            lambda: ledger.ended() >= ledger.committed,
            timeout=timeout,
            interval=interval,
            message=lambda: f"every job ended: {missing(ledger.committed - ledger.ended())}",
        )
    finally:
        stop_all.set()
        join(threads)


def run_until_terminal(
    targets: list[Callable[[], None]], ids: set[int], stop: threading.Event, *, timeout: float
) -> None:
    """Run ``targets`` in threads until every job of ``ids`` is terminal, then stop and join
    them (also when the wait times out)."""
    threads = run_threads(targets)
    try:
        wait_for(lambda: all_terminal(ids), timeout=timeout, interval=0.1, message="every job done")
    finally:
        stop.set()
        join(threads)


def check_attempts(ledger: Ledger) -> None:
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


def check_lane_order(ledger: Ledger) -> None:
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


def check_terminal(ledger: Ledger, ids: set[int]) -> dict[int, list[tuple[str, int]]]:
    done = terminal(ids)
    twice = {j: v for j, v in done.items() if len(v) != 1}
    assert not twice, f"jobs ended more than once: {dict(list(twice.items())[:5])}"
    assert set(done) == ids, f"committed jobs never ended: {sorted(ids - set(done))[:20]}"
    return done


def permit_sampler(
    queue: str, limit: int, stop: threading.Event, ledger: Ledger
) -> Callable[[], None]:
    def run() -> None:
        with connect() as conn:
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


def holding_claimers(
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
    pids: list[int] | None = None,
) -> list[Callable[[], None]]:
    """Claimers that hold what they claim for one or two further claims, then hand it back
    (permits and serial keys through ``p_release``/``p_serial_release`` of the next claim) and
    complete it. ``on_release`` runs before the claim that hands things back is sent, so a
    ledger built with it holds at most what the database holds."""

    def claimer(n: int) -> Callable[[], None]:
        def run() -> None:
            conn = connect()
            if pids is not None:
                with ledger.lock:
                    pids.append(conn.info.backend_pid)
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
                try:
                    rows = claim(
                        conn,
                        queue,
                        units[k % len(units)],
                        max_weight=max_weight,
                        held=held,
                        release=release,
                        serial_held=serial_held if serial else (),
                        serial_release=serial_release if serial else (),
                    )
                except psycopg.errors.QueryCanceled:
                    # docs/flow.md: permits a failed claim statement took stay with the
                    # session; release every one no running attempt holds, as the worker does.
                    rows = []
                    while True:
                        try:
                            conn.execute("SELECT awa.flow_reset_v1(%s)", [held])
                            break
                        except psycopg.errors.QueryCanceled:
                            continue
                if ending:
                    complete(conn, ending)
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


def parked() -> int:
    with pg() as c:
        row = c.execute("SELECT count(*) FROM awa.flow_waiting").fetchone()
        return int(row[0]) if row else 0
