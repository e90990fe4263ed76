"""Concurrent claimer sessions against ``awa.claim_v3`` under flow control: a queue's global
concurrency with weights above what a claim may take, a kind's concurrency (parking and
un-parking, also when its limit is set and cleared mid-run), queue and kind rate limits, serial
keys; one-job claims alternating with batches in concurrent claimer sessions. The harness is
tests/support/claimer_sessions.py; the contract checked is docs/flow.md's.
"""

from __future__ import annotations

import random
import threading
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from tests.support.claimer_sessions import (
    BATCHES,
    Ledger,
    all_terminal,
    check_attempts,
    check_terminal,
    claim,
    complete,
    connect,
    enqueue_now,
    holding_claimers,
    join,
    missing,
    parked,
    permit_sampler,
    run_threads,
    run_until_terminal,
)
from tests.support.database import conninfo, pg
from tests.support.polling import wait_for

pytestmark = pytest.mark.usefixtures("clean_awa")


# --------------------------------------------------------------------------------------------
# Scenario 3: a queue's global concurrency with weights, concurrent claimers.


def test_queue_global_concurrency_and_heavy_weights_hold_under_concurrent_claims() -> None:
    from awa_django.operator import set_queue_limits

    queue, limit = "l17g", 4
    set_queue_limits(queue, global_concurrency=limit, actor="attack17")
    r = random.Random(5)
    weights = [r.choice((1, 1, 1, 2, 3, 4, 6)) for _ in range(500)]
    ids = enqueue_now(
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
    pids: list[int] = []
    stop = threading.Event()

    def on_claim(n: int, rows: list[dict[str, Any]]) -> None:
        with ledger.lock:
            for row in rows:
                want = min(weight_of[row["job_id"]], limit, 5)
                # A job heavier than the limit also takes the permits above it it can, up to
                # its weight as this claimer caps it (5), so that a raised limit counts it.
                most = min(weight_of[row["job_id"]], 5)
                permits = row["permits"] or []
                if row["weight"] != want or not want <= len(permits) <= most:
                    ledger.errors.append(
                        f"job {row['job_id']}: weight {row['weight']}, permits {permits},"
                        f" want {want} to {most}"
                    )
                below = set(permits) & keys
                if len(below) != want or len(set(permits)) != len(permits):
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

    # Permits held at once: at most the limit, or a heavy job's own (up to max_weight 5, the
    # permits above the limit included) while it runs alone.
    claimers = holding_claimers(
        queue,
        ledger,
        stop,
        n_threads=4,
        units=(1, 5, 1, 2),
        max_weight=5,
        on_claim=on_claim,
        on_release=on_release,
        pids=pids,
    )

    def canceller() -> None:
        # pg_cancel_backend of claimers mid-claim: permits taken by a cancelled statement
        # must never let the queue pass its limit.
        r = random.Random(1)
        with connect() as conn:
            while not stop.is_set():
                with ledger.lock:
                    pid = r.choice(pids) if pids else None
                if pid:
                    conn.execute("SELECT pg_cancel_backend(%s)", [pid])
                stop.wait(0.02)

    run_until_terminal(
        [*claimers, permit_sampler(queue, 5, stop, ledger), canceller],
        set(ids),
        stop,
        timeout=30,
    )
    assert not ledger.errors, ledger.errors[:5]
    check_attempts(ledger)
    done = check_terminal(ledger, set(ids))
    assert {s for v in done.values() for s, _ in v} == {"completed"}


# --------------------------------------------------------------------------------------------
# Scenario 4: a kind's global concurrency (parked jobs) and a queue rate limit.


def test_kind_limit_parks_and_unparks_without_exceeding_or_stranding() -> None:
    from awa_django.operator import set_kind_limits

    queue, limit = "l17k", 2
    set_kind_limits("l17.k2", global_concurrency=limit, actor="attack17")
    r = random.Random(9)
    kinds = [r.choice(("l17.k2", "l17.k2", "l17.free")) for _ in range(400)]
    ids = enqueue_now([{"kind": k, "queue": queue} for k in kinds])
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

    run_until_terminal(
        holding_claimers(
            queue,
            ledger,
            stop,
            n_threads=3,
            units=(1, 4, 1, 8),
            max_weight=None,
            on_claim=on_claim,
            on_release=on_release,
        ),
        set(ids),
        stop,
        timeout=30,
    )
    assert not ledger.errors, ledger.errors[:5]
    check_attempts(ledger)
    check_terminal(ledger, set(ids))
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
    ids = enqueue_now([{"kind": k, "queue": queue} for k in kinds])
    limited = {"l17.r", "l17.kr"}
    # Per claim: (its transaction's now(), the clock after it returned, limited jobs taken).
    # Its tokens were spent in between (on the clock once it held the rate state, which a lock
    # wait can put well after now()).
    spent: list[tuple[float, float, int]] = []
    lock = threading.Lock()
    attempts: list[tuple[int, int]] = []
    stop = threading.Event()

    def claimer(n: int) -> Callable[[], None]:
        def run() -> None:
            with psycopg.connect(conninfo()) as conn:
                k = n
                while not stop.is_set():
                    k += 1
                    rows = claim(conn, queue, BATCHES[k % len(BATCHES)])
                    clocks = conn.execute(
                        "SELECT extract(epoch FROM now())::float8,"
                        " extract(epoch FROM clock_timestamp())::float8"
                    ).fetchone()
                    conn.commit()
                    if rows:
                        assert clocks is not None
                        with lock:
                            taken = sum(r["kind"] in limited for r in rows)
                            spent.append((clocks[0], clocks[1], taken))
                            attempts.extend((row["job_id"], row["run_lease"]) for row in rows)
                        complete(conn, rows)
                        conn.commit()
                    else:
                        stop.wait(0.005)

        return run

    run_until_terminal([claimer(n) for n in range(3)], set(ids), stop, timeout=20)
    assert len(set(attempts)) == len(attempts) == len(ids)
    # Any set of claims spent its tokens within [its earliest start, its latest end], so it
    # took at most rate x that span + burst: checked for every set of the claims that lie in
    # [a claim's start, another's end] (no claim can be placed more tightly from outside).
    spent.sort()
    for i, (t0, _, _) in enumerate(spent):
        total = 0
        for t1, _, n in sorted((e, s, n) for s, e, n in spent[i:] if s >= t0):
            total += n
            assert total <= rate * (t1 - t0) + burst + 1e-6, (
                f"{total} jobs started in {t1 - t0:.3f} s at most (rate {rate}, burst {burst})"
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
        ids += enqueue_now(
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

    run_until_terminal(
        holding_claimers(
            queue,
            ledger,
            stop,
            n_threads=3,
            units=(1, 6, 1, 3),
            max_weight=None,
            on_claim=on_claim,
            on_release=on_release,
            serial=True,
        ),
        set(ids),
        stop,
        timeout=30,
    )
    assert not ledger.errors, ledger.errors[:5]
    check_attempts(ledger)
    check_terminal(ledger, set(ids))
    for key, order in started.items():
        assert order == sorted(order), f"key {key} started out of enqueue order: {order}"


# --------------------------------------------------------------------------------------------
# Scenario 9: a kind's limit set, cleared and set again while claimers run (the claim's first
# statement reads the limited kinds): the limit holds, and jobs parked under it are un-parked
# once it is cleared, also when nothing else is left in the queue.


def test_kind_limit_set_cleared_and_set_again_mid_run_strands_nothing() -> None:
    from awa_django.operator import clear_kind_limits, set_kind_limits

    queue, kind = "l17c", "l17.c"
    r = random.Random(12)
    ids = enqueue_now(
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

    claimers = holding_claimers(
        queue,
        ledger,
        stop,
        n_threads=3,
        units=(1, 4, 1, 2),
        max_weight=None,
        on_claim=on_claim,
        on_release=on_release,
    )
    threads = run_threads(claimers)

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
        wait_for(lambda: parked() > 0 or all_terminal(set(ids)), timeout=20, message="parked jobs")
        clear_kind_limits(kind, actor="attack17")
        with ledger.lock:
            bound[0] = 10_000
        wait_for(
            lambda: all_terminal(set(ids)),
            timeout=30,
            interval=0.1,
            message=lambda: f"every job done: {missing(set(ids))}; parked {parked()}",
        )
    finally:
        stop.set()
        join(threads)
    assert not ledger.errors, ledger.errors[:5]
    check_attempts(ledger)
    check_terminal(ledger, set(ids))
    assert parked() == 0
