"""The claim's fast path for limited kinds (docs/flow.md, "Per kind") with real worker processes
under faults and changes mid-drain: the holder of a kind's permits SIGKILLed or SIGSTOPped, the
whole fleet killed with jobs parked, claims cancelled mid-statement, claim connections
terminated, a kind's limit or rate changed while a backlog drains.

Handlers record their runs in ``fa3_runs`` (tests/support/fast_path_runs.py); overlaps are
computed with the database clock.
"""

from __future__ import annotations

import signal
import threading
from collections import defaultdict
from collections.abc import Callable
from datetime import datetime, timedelta

import pytest

import awa_django
from awa_django.operator import set_kind_limits
from tests.support.database import pg
from tests.support.fast_path_runs import (
    EPOCH,
    GRACE,
    assert_once,
    clean_logs,
    db_now,
    held_flow_locks,
    interrupter,
    peak_overlap,
    rate_spans,
    recorded_runs,
    running_of,
    serial_order,
    set_limit,
    signal_holder,
    sound_window_violations,
    start_workers,
    started_since,
    stop_workers,
    tables,
    wait_done,
)
from tests.support.polling import wait_for
from tests.support.processes import ManagedProcess, kill_together

pytestmark = pytest.mark.usefixtures("clean_awa")


def test_kind_limit_changed_mid_drain(manage_py: Callable[..., ManagedProcess]) -> None:
    """A kind without limits drains on two workers of 6 slots beside unlimited jobs in the same
    lanes while the operator sets its limit to 1, raises it to 4, lowers it to 2, clears it,
    and sets 1 again (0 is refused, nothing written). docs/flow.md: a change takes effect with
    the next claim (within POLL_INTERVAL); a lowered limit holds at once. From 0.3 s after each
    change on, no job of the kind starts while the limit's worth of its jobs run; every job
    runs once."""
    tables()
    ids = []
    for i in range(450):
        kind = "fa3.plain" if i % 3 else "fa3.free"
        ids.append(awa_django.enqueue(kind, kwargs={"seconds": 0.03}).id)
    workers = start_workers(manage_py, 2, concurrency=6)
    wait_for(lambda: started_since("fa3.plain", EPOCH) >= 20, timeout=15, message="a start")
    phases: list[tuple[datetime, int | None]] = []
    befores: list[datetime] = []  # the clock before each change: the previous phase's end
    for limit in (1, 4, 2, None, 1):
        befores.append(db_now())
        set_limit("fa3.plain", limit)
        at = db_now()
        phases.append((at, limit))
        if limit == 1 and len(phases) == 1:
            with pytest.raises(awa_django.AwaError):
                set_kind_limits("fa3.plain", global_concurrency=0, actor="fa3")
            with pg() as c:
                row = c.execute(
                    "SELECT max_running FROM awa.flow_kind_limits WHERE kind = 'fa3.plain'"
                ).fetchone()
            assert row == (1,)
        wait_for(
            lambda at=at: started_since("fa3.plain", at) >= 15,  # type: ignore[misc]
            timeout=20,
            message=f"15 starts under limit {limit}",
        )
    befores.append(db_now())
    set_limit("fa3.plain", None)  # the rest drains unlimited (not checked)
    wait_done(ids, workers, timeout=60)
    runs = [r for r in recorded_runs() if r["kind"] == "fa3.plain"]
    assert_once(recorded_runs(), ids)
    bounds = befores[1:]
    bad = []
    for (at, limit), until in zip(phases, bounds, strict=True):
        if limit is None:
            continue
        for r in runs:
            if r["started"] <= at + GRACE or r["started"] > until:
                continue
            running = [o for o in runs if o["started"] <= r["started"] < o["ended"]]
            if len(running) > limit:
                bad.append(
                    f"limit {limit} (set at {at.time()}): job {r['job_id']} started beside "
                    + ", ".join(
                        f"job {o['job_id']} (pid {o['pid']}, {o['started'].time()} -"
                        f" {o['ended'].time()})"
                        for o in running
                    )
                )
    assert bad == [], f"phases {[(a.time().isoformat(), lim) for a, lim in phases]}: " + "\n".join(
        bad[:6]
    )
    stop_workers(workers)
    clean_logs(workers)


def test_sigkill_of_kind_permit_holder_mid_drain(
    manage_py: Callable[..., ManagedProcess],
) -> None:
    """Jobs of a kind limited to 1, serial-keyed jobs of a kind limited to 2 and free jobs on
    three workers; the worker running the limited kind's job is SIGKILLed. docs/flow.md: its
    session ends and frees the permits at once, the limit holds throughout (the killed handler
    counts as running until the kill), the killed attempt is rescued and retried, the key's
    jobs go on, and every job completes."""
    tables()
    ids, keys = [], {}
    for i in range(90):
        if i % 3 == 0:
            ids.append(awa_django.enqueue("fa3.k1", kwargs={"seconds": 0.1}).id)
        elif i % 3 == 1:
            job = awa_django.enqueue("fa3.k2", kwargs={"seconds": 0.05}, serial_key=f"c{i % 2}")
            ids.append(job.id)
            keys[job.id] = f"c{i % 2}"
        else:
            ids.append(awa_django.enqueue("fa3.free", kwargs={"seconds": 0.02}).id)
    workers = start_workers(
        manage_py, 3, concurrency=3, overrides={"HEARTBEAT_STALENESS": 2.0, "RESCUE_INTERVAL": 0.2}
    )
    wait_for(lambda: started_since("fa3.k1", EPOCH) >= 5, timeout=15, message="k1 starts")
    victim = wait_for(lambda: running_of("fa3.k1"), timeout=10, message="a k1 job running")
    assert victim is not None
    # The clock just before the kill: read after it, a permit the kill freed and another
    # worker took meanwhile would show an overlap that never was.
    killed_at = db_now()
    signal_holder(workers, victim["pid"], signal.SIGKILL)
    alive = [w for w in workers if w.pid != victim["pid"]]
    wait_done(ids, alive, timeout=40)
    runs = recorded_runs()
    for r in runs:
        if r["ended"] is None:
            assert r["pid"] == victim["pid"], r
    for kind, limit in (("fa3.k1", 1), ("fa3.k2", 2)):
        peak, where = peak_overlap(
            (r for r in runs if r["kind"] == kind), lambda r: 1, end_default=killed_at
        )
        assert peak <= limit, f"{kind}: {peak} at once ({where})"
    first = [r for r in runs if r["attempt"] == 1 and r["pid"] != victim["pid"]]
    assert serial_order(first, keys) == []
    stop_workers(alive)
    clean_logs(alive)


def test_sigstop_of_kind_permit_holder(manage_py: Callable[..., ManagedProcess]) -> None:
    """The worker running a job of a kind limited to 1 is frozen (SIGSTOP). docs/flow.md: while
    it is frozen its permit stays taken, "fewer than the limit run, never more"; the leader
    rescues its attempt and terminates its backend (awa.flow_reap_v1), after which the other
    workers run the kind again. The frozen job also holds a serial key: once its session is
    gone, the leader's sweep hands the key on and the key's other jobs run while it is still
    frozen. After SIGCONT everything completes."""
    tables()
    held = awa_django.enqueue("fa3.k1", kwargs={"seconds": 2.0}, serial_key="S").id
    ids = [held]
    ids += [awa_django.enqueue("fa3.k1", kwargs={"seconds": 0.02}).id for _ in range(20)]
    ids += [
        awa_django.enqueue("fa3.free", kwargs={"seconds": 0.01}, serial_key="S").id
        for _ in range(8)
    ]
    overrides = {
        "HEARTBEAT_STALENESS": 1.0,
        "RUNTIME_REFRESH_INTERVAL": 0.2,
        "HEARTBEAT_INTERVAL": 0.1,
        "RESCUE_INTERVAL": 0.2,
    }
    workers = start_workers(manage_py, 2, concurrency=2, overrides=overrides)
    victim = wait_for(
        lambda: next((r for r in recorded_runs() if r["job_id"] == held), None),
        timeout=15,
        message="the key's first job running",
    )
    assert victim is not None
    frozen = signal_holder(workers, victim["pid"], signal.SIGSTOP)
    stopped_at = db_now()
    try:
        others = [w for w in workers if w is not frozen]
        with pg() as c:
            wait_for(
                lambda: c.execute(
                    "SELECT count(*) FILTER (WHERE kind = 'fa3.k1') >= 5"
                    " AND count(*) FILTER (WHERE kind = 'fa3.free') >= 3"
                    " FROM fa3_runs WHERE pid <> %s AND started > %s",
                    [victim["pid"], stopped_at],
                ).fetchone()[0],  # type: ignore[index]
                timeout=20,
                message=lambda: (
                    "the kind and the key to run again while their holder is frozen; logs:\n"
                    + "\n".join(w.output()[-3000:] for w in others)
                ),
            )
    finally:
        frozen.send_signal(signal.SIGCONT)
    wait_done(ids, workers, timeout=30)
    runs = [r for r in recorded_runs() if r["kind"] == "fa3.k1" and r["pid"] != victim["pid"]]
    peak, where = peak_overlap(runs, lambda r: 1)
    assert peak <= 1, where
    stop_workers(workers)


def test_kind_rate_changed_mid_drain_beside_free_jobs(
    manage_py: Callable[..., ManagedProcess],
) -> None:
    """Jobs of a kind limited to 20/s (burst 4) interleaved with free jobs in the same lanes,
    on two workers; mid-drain the operator lowers the rate to 8/s (burst 2), then raises it to
    40/s (burst 5). docs/flow.md: over any window of t seconds at most rate x t + burst start
    (by the claim's database clock), a change takes effect with the next claim, and the other
    jobs of the queue are not held behind the rate (no head-of-line blocking)."""
    tables()
    rated, free = [], []
    for _ in range(110):
        rated.append(awa_django.enqueue("fa3.rated").id)
        free.append(awa_django.enqueue("fa3.free").id)
    workers = start_workers(manage_py, 2, concurrency=4)
    phases: list[tuple[datetime, datetime, float, int]] = []
    start = db_now()
    wait_for(lambda: started_since("fa3.rated", EPOCH) >= 30, timeout=15, message="30 starts")
    for rate, burst, n in ((8.0, 2, 15), (40.0, 5, 0)):
        before = db_now()
        set_kind_limits("fa3.rated", rate_limit=rate, rate_burst=burst, actor="fa3")
        after = db_now()
        phases.append((before, after, rate, burst))
        if n:
            wait_for(
                lambda after=after, n=n: started_since("fa3.rated", after) >= n,  # type: ignore[misc]
                timeout=15,
                message=f"{n} starts at {rate}/s",
            )
    wait_done(rated + free, workers, timeout=30)
    with pg() as c:
        claims = [
            t
            for (t,) in c.execute(
                "SELECT attempted_at FROM awa.jobs WHERE id = ANY(%s) ORDER BY 1", [rated]
            ).fetchall()
        ]
        free_done = c.execute(
            "SELECT max(finalized_at) FROM awa.jobs WHERE id = ANY(%s)", [free]
        ).fetchone()
    bad: list[str] = []
    windows = [(start, phases[0][0], 20.0, 4)]
    windows.append((phases[0][1] + GRACE, phases[1][0], 8.0, 2))
    windows.append((phases[1][1] + GRACE, claims[-1] + GRACE, 40.0, 5))
    spans = rate_spans(rated)
    for lo, hi, rate, burst in windows:
        mine = [(a, b) for _, a, b in spans if lo.timestamp() <= a <= hi.timestamp()]
        bad += sound_window_violations(mine, rate, burst)
    assert bad == [], bad[:5]
    assert_once(recorded_runs(), rated + free)
    # The free jobs do not wait behind the rated ones: all done before the rated drain's end
    # (it takes over 5 s; free jobs alone take well under 1).
    assert free_done is not None and free_done[0] < claims[-1] - timedelta(seconds=2), (
        free_done,
        claims[-1],
    )
    stop_workers(workers)
    clean_logs(workers)


def test_claims_cancelled_mid_statement(manage_py: Callable[..., ManagedProcess]) -> None:
    """A hostile environment cancels (pg_cancel_backend) every claim statement it catches
    running, while two workers drain a queue where kinds limited to 1 and 2 (weights 1-2),
    serial keys and free jobs mix. docs/flow.md: a claim that fails part-way leaves no permit or
    key behind (awa.flow_reset_v1, awa.serial_reset_v1); a cancel does not end the session, so
    the limits hold throughout. Every job completes, no kind runs over its limit, and once the
    workers are idle no permit or run lock is held."""
    tables()
    ids, keys, weight = [], {}, {}
    for i in range(240):
        kind = ["fa3.k1", "fa3.k2", "fa3.free", "fa3.k2"][i % 4]
        key = f"z{i % 3}" if i % 5 == 0 else None
        heavy = 1 + (i % 7 == 0)
        job = awa_django.enqueue(kind, kwargs={"seconds": 0.01}, weight=heavy, serial_key=key)
        ids.append(job.id)
        weight[job.id] = heavy
        if key:
            keys[job.id] = key
    stop = threading.Event()
    hits: list[int] = []
    t = threading.Thread(target=interrupter, args=("pg_cancel_backend", stop, hits, 0.15))
    workers = start_workers(manage_py, 2, concurrency=4)
    t.start()
    try:
        wait_done(ids, workers, timeout=60)
    finally:
        stop.set()
        t.join()
    assert sum(hits) > 0, "no claim was caught running"
    wait_for(
        lambda: held_flow_locks() == 0,
        timeout=10,
        message=lambda: f"{held_flow_locks()} permits or run locks still held by idle workers",
    )
    runs = recorded_runs()
    for kind, limit in (("fa3.k1", 1), ("fa3.k2", 2)):
        peak, where = peak_overlap(
            (r for r in runs if r["kind"] == kind),
            lambda r, limit=limit: min(weight[r["job_id"]], limit),  # type: ignore[misc]
        )
        assert peak <= limit, f"{kind}: {peak} at once ({where}); {sum(hits)} cancels"
    assert serial_order([r for r in runs if r["attempt"] == 1], keys) == []
    for w in workers:
        assert w.proc.poll() is None, w.output()[-3000:]
    stop_workers(workers)


def test_claim_connections_terminated(manage_py: Callable[..., ManagedProcess]) -> None:
    """A hostile environment terminates (pg_terminate_backend) the backend of claims it catches
    running, now and then, while two workers drain limited kinds, serial keys and free jobs.
    docs/flow.md allows an overrun of one attempt per lost permit or key while a handler that
    lost its session runs (logged); it promises that the worker reconnects and takes its running
    handlers' permits back, that nothing is lost: every job completes, no attempt is delivered
    twice, and once the workers are idle no permit or run lock is held."""
    tables()
    ids = []
    for i in range(200):
        kind = ["fa3.k1", "fa3.k2", "fa3.free", "fa3.k3"][i % 4]
        key = f"t{i % 3}" if i % 5 == 0 else None
        ids.append(awa_django.enqueue(kind, kwargs={"seconds": 0.01}, serial_key=key).id)
    stop = threading.Event()
    hits: list[int] = []
    t = threading.Thread(target=interrupter, args=("pg_terminate_backend", stop, hits, 1.0))
    workers = start_workers(manage_py, 2, concurrency=4)
    t.start()
    try:
        wait_done(ids, workers, timeout=60)
    finally:
        stop.set()
        t.join()
    assert sum(hits) > 0, "no claim was caught running"
    wait_for(
        lambda: held_flow_locks() == 0,
        timeout=10,
        message=lambda: f"{held_flow_locks()} permits or run locks still held by idle workers",
    )
    seen: dict[tuple[int, int], int] = defaultdict(int)
    for r in recorded_runs():
        seen[(r["job_id"], r["attempt"])] += 1
    assert [k for k, n in seen.items() if n > 1] == []
    for w in workers:
        assert w.proc.poll() is None, w.output()[-3000:]
    stop_workers(workers)


@pytest.mark.slow
def test_whole_fleet_killed_with_jobs_parked(manage_py: Callable[..., ManagedProcess]) -> None:
    """Every worker is SIGKILLed while one job of a kind limited to 1 runs and 20 more wait
    parked (with serial keys among them). docs/flow.md: parked jobs are rows, tied to no
    session, never stranded. A worker started afterwards runs every job, the kind one at a
    time, each key in enqueue order (the killed job is cancelled: its retry would hold the
    kind for another 30 s)."""
    tables()
    overrides = {"HEARTBEAT_STALENESS": 2.0, "RESCUE_INTERVAL": 0.2}
    first = start_workers(manage_py, 2, concurrency=3, overrides=overrides)
    long = awa_django.enqueue("fa3.k1", kwargs={"seconds": 30.0}).id
    wait_for(lambda: running_of("fa3.k1"), timeout=15, message="the long job running")
    ids, keys = [long], {}
    for i in range(20):
        key = f"f{i % 2}" if i % 3 == 0 else None
        job = awa_django.enqueue("fa3.k1", kwargs={"seconds": 0.01}, serial_key=key)
        ids.append(job.id)
        if key:
            keys[job.id] = key
    with pg() as c:
        wait_for(
            lambda: (
                c.execute("SELECT count(*) FROM awa.flow_waiting").fetchone()[0]  # type: ignore[index]
                >= 10
            ),
            timeout=10,
            message="jobs parked",
        )
    # Frozen first, then killed once none of their statements is still running: a claim a
    # dying worker's backend was still executing could otherwise take the permit the killed
    # long job's session let go and start a parked job no one is left to run (until rescue).
    for process in first:
        process.send_signal(signal.SIGSTOP)
    with pg() as c:
        wait_for(
            lambda: c.execute(
                "SELECT count(*) = 0 FROM pg_stat_activity "
                "WHERE application_name LIKE 'awa:%' AND state = 'active'"
            ).fetchone()[0],  # type: ignore[index]
            timeout=10,
            message="the frozen workers' statements to end",
        )
    kill_together(first)  # one by one, a survivor could claim a job between the kills
    # The long job's attempt died with its worker; cancelled, so that no retry of it holds
    # the kind's permit for another 30 s.
    assert awa_django.cancel(long) == "running"
    with pg() as c:
        c.execute("UPDATE fa3_runs SET ended = clock_timestamp() WHERE ended IS NULL")
    # The killed attempt is cancelled, and its permit went with its session: the later worker
    # needs no quick rescue, and a production-like staleness keeps a loaded machine's slow
    # heartbeat from retrying a live attempt (which failed "ran once" in one full run).
    later = start_workers(
        manage_py, 1, concurrency=3, overrides={**overrides, "HEARTBEAT_STALENESS": 60.0}
    )
    wait_done(ids[1:], later, timeout=30)
    runs = [r for r in recorded_runs() if r["job_id"] != long]
    assert_once(runs, ids[1:])
    peak, where = peak_overlap((r for r in runs if r["kind"] == "fa3.k1"), lambda r: 1)
    assert peak <= 1, where
    assert serial_order(runs, keys) == []
    later[0].kill()
