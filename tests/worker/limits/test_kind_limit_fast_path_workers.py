"""The claim's fast path for limited kinds (docs/flow.md, "Per kind") with real worker processes:
one lane of mixed kinds, weights and keys on three workers, heavy parked jobs on small workers
and per-queue caps, limits across two queues, no busy polling while a kind binds, a cleared
limit unparking everything, key order, rates under contention and in crossed lane orders.

Handlers record their runs in ``fa3_runs`` (tests/support/fast_path_runs.py); overlaps are
computed with the database clock.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

import awa_django
from awa_django.operator import clear_kind_limits, set_kind_limits
from tests.jobs import kind_limit_fast_path, worker_env
from tests.support.database import pg
from tests.support.fast_path_runs import (
    RATES,
    assert_once,
    claim_calls,
    clean_logs,
    count_done,
    db_now,
    peak_overlap,
    rate_spans,
    recorded_runs,
    running_of,
    serial_order,
    set_limit,
    sound_window_violations,
    start_workers,
    stop_workers,
    tables,
    wait_done,
)
from tests.support.polling import wait_for
from tests.support.processes import ManagedProcess

pytestmark = pytest.mark.usefixtures("clean_awa")


def test_mixed_lane_kinds_weights_keys_on_three_workers(
    manage_py: Callable[..., ManagedProcess],
) -> None:
    """One queue, every lane a mix: jobs of kinds limited to 3 and 5 (weights 1 .. 9, some above
    the limit, some above the process's slots), jobs of no limit, jobs with serial keys of no
    kind limit and of a limited kind. Three workers of 4 slots. Every job runs once, as attempt
    1; a kind never runs more than its limit counted by min(weight, limit, slots); a key runs
    one at a time, in enqueue order."""
    tables()
    slots = 4
    plan: list[tuple[str, int, str | None]] = []
    for i in range(330):
        r = i % 9
        if r in (0, 4):
            plan.append(("fa3.k3", [1, 2, 3, 7][i % 4], None))
        elif r in (1, 6):
            plan.append(("fa3.k5", [1, 4, 9][i % 3], None))
        elif r == 2:
            plan.append(("fa3.free", [1, 3][i % 2], None))
        elif r == 3:
            plan.append(("fa3.free2", 1, f"s{i % 5}"))
        elif r == 5:
            plan.append(("fa3.k3", 1, f"s{i % 5}"))
        else:
            plan.append(("fa3.free", 1, None))
    ids: list[int] = []
    weight: dict[int, int] = {}
    keys: dict[int, str] = {}
    for kind, w, key in plan:
        job = awa_django.enqueue(kind, kwargs={"seconds": 0.02}, weight=w, serial_key=key)
        ids.append(job.id)
        weight[job.id] = w
        if key is not None:
            keys[job.id] = key
    # Rings rotating and pruned under the claims all the while.
    rings = {"CLAIM_ROTATE_INTERVAL": 0.2, "PRUNE_INTERVAL": 0.1, "HISTORY_RETENTION": 30.0}
    workers = start_workers(manage_py, 3, concurrency=slots, overrides=rings)
    wait_done(ids, workers)
    runs = recorded_runs()
    assert_once(runs, ids)
    for kind, limit in (("fa3.k3", 3), ("fa3.k5", 5)):
        peak, where = peak_overlap(
            (r for r in runs if r["kind"] == kind),
            lambda r, limit=limit: min(weight[r["job_id"]], limit, slots),  # type: ignore[misc]
        )
        assert peak <= limit, f"{kind}: {peak} units at once ({where})"
    assert serial_order(runs, keys) == []
    stop_workers(workers)
    clean_logs(workers)


def test_parked_heavy_job_not_stranded_on_small_workers(
    manage_py: Callable[..., ManagedProcess],
) -> None:
    """Kind limited to 3, workers of 2 slots, jobs of weight 3. docs/flow.md: a weight above
    what the claiming process can run counts as that bound ("a heavy job can never block its
    lane for ever"), and "a parked job is never stranded". A runs (2 of the kind's 3 permits);
    B, claimed by the other worker meanwhile, cannot have 2 and is parked; once A ended, B
    must run."""
    tables()
    workers = start_workers(manage_py, 2, concurrency=2)
    a = awa_django.enqueue("fa3.k3", kwargs={"seconds": 0.8}, weight=3).id
    wait_for(
        lambda: any(r["job_id"] == a for r in recorded_runs()), timeout=15, message="A running"
    )
    b = awa_django.enqueue("fa3.k3", kwargs={"seconds": 0.0}, weight=3).id
    with pg() as c:
        wait_for(
            lambda: (
                c.execute("SELECT 1 FROM awa.flow_waiting WHERE job_id = %s", [b]).fetchone()
                or count_done([b])
            ),
            timeout=10,
            message="B parked (or run)",
        )
    wait_done([a, b], workers, timeout=4)
    stop_workers(workers)


def test_cancel_of_a_job_parked_by_its_kind_ahead_of_its_key(
    manage_py: Callable[..., ManagedProcess],
) -> None:
    """A job of a kind limited to 1 (busy with a long job) is parked by its kind; younger jobs
    of its serial key (of no limited kind) park behind it. Cancelling the parked job: docs/flow.md
    says cancel removes a parked job and the leader's sweep hands on a key whose next job was
    cancelled before it ran, so the key's other jobs run (while the long job still runs: they
    need no permit of the kind); the cancelled job never runs; the kind's other parked job runs
    once the long one ended."""
    tables()
    workers = start_workers(manage_py, 2, concurrency=3)
    long = awa_django.enqueue("fa3.k1", kwargs={"seconds": 2.5}).id
    wait_for(lambda: running_of("fa3.k1"), timeout=15, message="the long job running")
    a = awa_django.enqueue("fa3.k1", serial_key="K").id
    b = awa_django.enqueue("fa3.free", serial_key="K").id
    c = awa_django.enqueue("fa3.free2", serial_key="K").id
    d = awa_django.enqueue("fa3.k1").id

    def parked() -> bool:
        with pg() as conn:
            flow = conn.execute(
                "SELECT count(*) FROM awa.flow_waiting WHERE job_id = ANY(%s)", [[a, d]]
            ).fetchone()
            serial = conn.execute(
                "SELECT count(*) FROM awa.serial_waiting WHERE job_id = ANY(%s)", [[b, c]]
            ).fetchone()
        return flow == (2,) and serial == (2,)

    wait_for(parked, timeout=10, message="a and d parked by the kind, b and c behind the key")
    assert awa_django.cancel(a) == "available"
    wait_done([b, c], workers, timeout=10)
    runs = {r["job_id"]: r for r in recorded_runs()}
    assert runs[long]["ended"] is None, "b and c waited for the kind's permit"
    wait_done([long, d], workers, timeout=15)
    assert a not in {r["job_id"] for r in recorded_runs()}
    stop_workers(workers)
    clean_logs(workers)


def test_kind_limits_across_two_queues(manage_py: Callable[..., ManagedProcess]) -> None:
    """Jobs of a kind limited to 2 and of a kind limited to 20/s (burst 4) in two queues at
    once, beside free jobs, on two workers serving both (one of them through a per-queue cap
    of 2). docs/flow.md: a kind's limits hold across every queue its jobs are in; permits freed
    in one queue reach the other's parked jobs within POLL_INTERVAL; every job runs once."""
    tables()
    ids, rated = [], []
    for i in range(70):
        queue = "fa3" if i % 2 else "fa3b"
        ids.append(awa_django.enqueue("fa3.k2", kwargs={"seconds": 0.02}, queue=queue).id)
        job = awa_django.enqueue("fa3.rated", queue=queue)
        rated.append(job.id)
        ids.append(job.id)
        ids.append(awa_django.enqueue("fa3.free", queue=queue).id)
    env = worker_env(kind_limit_fast_path)
    workers = [
        manage_py(
            "awa_worker", "--concurrency", "4", "--queue", "fa3", "--queue", "fa3b", extra_env=env
        ),
        manage_py(
            "awa_worker", "--concurrency", "4", "--queue", "fa3=2", "--queue", "fa3b", extra_env=env
        ),
    ]
    wait_done(ids, workers, timeout=40)
    runs = recorded_runs()
    assert_once(runs, ids)
    peak, where = peak_overlap((r for r in runs if r["kind"] == "fa3.k2"), lambda r: 1)
    assert peak <= 2, where
    spans = [(a, b) for _, a, b in rate_spans(rated)]
    assert sound_window_violations(spans, 20.0, 4) == []
    stop_workers(workers)
    clean_logs(workers)


def test_no_busy_polling_while_a_kind_binds(manage_py: Callable[..., ManagedProcess]) -> None:
    """A kind limited to 1 runs a long job; 40 more of it wait (parked) and nothing else is
    there. docs/flow.md: a claim that took nothing for want of permits leaves its queue idle
    until one of its own handlers ends or the sweep of idle queues sees a permit free (no busy
    polling), also for workers that start with a backlog. Two workers make at most a few
    claims over 3 s (they used to claim every POLL_INTERVAL, 0.05 s)."""
    tables()
    with pg() as c:
        c.execute("SELECT current_database()")
        name = c.execute("SELECT current_database()").fetchone()[0]  # type: ignore[index]
        c.execute(f"ALTER DATABASE \"{name}\" SET track_functions = 'pl'")
    try:
        awa_django.enqueue("fa3.k1", kwargs={"seconds": 4.5})
        for _ in range(40):
            awa_django.enqueue("fa3.k1")
        workers = start_workers(manage_py, 2, concurrency=4)
        wait_for(lambda: running_of("fa3.k1"), timeout=15, message="the long job running")
        with pg() as c:
            wait_for(
                lambda: (
                    c.execute("SELECT count(*) FROM awa.flow_waiting").fetchone()[0]  # type: ignore[index]
                    == 40
                ),
                timeout=10,
                message="40 jobs parked",
            )
        before = claim_calls()
        t0 = db_now()
        wait_for(
            lambda: (db_now() - t0).total_seconds() >= 3.0,
            timeout=10,
            interval=0.2,
            message="3 s to pass on the database clock",
        )
        calls = claim_calls() - before
        # Polling every 0.05 s made ~120 claims in 3 s (stats flush lag of 1 s either way);
        # busy polling makes thousands; now a parked job's queue is claimed once it can run.
        assert calls <= 20, f"{calls} claim_v3 calls in 3 s while the kind binds"
        for w in workers:
            w.kill()
    finally:
        with pg() as c:
            c.execute(f'ALTER DATABASE "{name}" RESET track_functions')


def test_cleared_kind_limit_unparks_everything(manage_py: Callable[..., ManagedProcess]) -> None:
    """A kind the operator limited to 1 runs a long job and 30 more wait, parked; some of them
    heavier than the workers' slots. The operator clears the limit (no limit in code or
    settings): docs/flow.md, jobs of kinds whose limits were cleared are un-parked by the next
    claim. They all run while the long job still runs, several at once."""
    tables()
    set_limit("fa3.plain", 1)
    long = awa_django.enqueue("fa3.plain", kwargs={"seconds": 5.0}).id
    workers = start_workers(manage_py, 2, concurrency=4)
    wait_for(lambda: running_of("fa3.plain"), timeout=15, message="the long job running")
    rest = [
        awa_django.enqueue("fa3.plain", kwargs={"seconds": 0.1}, weight=1 + 5 * (i % 4 == 0)).id
        for i in range(30)
    ]
    with pg() as c:
        wait_for(
            lambda: (
                c.execute("SELECT count(*) FROM awa.flow_waiting").fetchone()[0]  # type: ignore[index]
                == 30
            ),
            timeout=10,
            message="30 jobs parked",
        )
    clear_kind_limits("fa3.plain", actor="fa3")
    wait_done(rest, workers, timeout=4.5)
    runs = {r["job_id"]: r for r in recorded_runs()}
    assert runs[long]["ended"] is None, "the parked jobs waited for the long one"
    peak, _ = peak_overlap((r for r in runs.values() if r["job_id"] in rest), lambda r: 1)
    assert peak > 1
    clean_logs(workers)


def test_operator_kind_override_survives_worker_start(
    manage_py: Callable[..., ManagedProcess],
) -> None:
    """docs/flow.md: an operator's kind limit wins over settings, also across worker restarts,
    until cleared, which writes the project's settings back. A kind limited to 5 in code is set
    to 1 by the operator; workers starting (and writing the settings of their kinds) leave it
    at 1, and their drain holds it; cleared, it is 5 again."""
    from awa_django.operator import kind_limits

    tables()
    set_limit("fa3.k5", 1)
    ids = [awa_django.enqueue("fa3.k5", kwargs={"seconds": 0.02}).id for _ in range(25)]
    workers = start_workers(manage_py, 2, concurrency=4)
    wait_for(
        lambda: all(
            "flow limits from settings" in w.output() or "started" in w.output() for w in workers
        ),
        timeout=15,
        message="the workers started",
    )
    wait_done(ids, workers, timeout=20)
    (row,) = [k for k in kind_limits() if k.kind == "fa3.k5"]
    assert (row.global_concurrency, row.source) == (1, "operator")
    peak, where = peak_overlap((r for r in recorded_runs() if r["kind"] == "fa3.k5"), lambda r: 1)
    assert peak <= 1, where
    clear_kind_limits("fa3.k5", actor="fa3")
    (row,) = [k for k in kind_limits() if k.kind == "fa3.k5"]
    assert (row.global_concurrency, row.source) == (5, "settings")
    stop_workers(workers)


def test_key_order_while_its_oldest_job_waits_for_its_kind(
    manage_py: Callable[..., ManagedProcess],
) -> None:
    """The oldest job of each of three serial keys is of a kind limited to 1 that a long job
    holds; younger jobs of the keys are of no limited kind. docs/flow.md: they park behind it,
    and while it waits the leader's sweep (every RESCUE_INTERVAL, 0.2 s here) may hand a key on
    to a younger job, which parks again at once: one at a time and enqueue order within the key
    hold. None of the younger jobs starts before its key's oldest job ended."""
    tables()
    workers = start_workers(manage_py, 2, concurrency=4)
    long = awa_django.enqueue("fa3.k1", kwargs={"seconds": 2.5}).id
    wait_for(lambda: running_of("fa3.k1"), timeout=15, message="the long job running")
    keys: dict[int, str] = {}
    ids = [long]
    for key in ("x", "y", "w"):
        for kind in ("fa3.k1", "fa3.free", "fa3.free2", "fa3.free"):
            job = awa_django.enqueue(kind, kwargs={"seconds": 0.02}, serial_key=key)
            keys[job.id] = key
            ids.append(job.id)
    wait_done(ids, workers, timeout=25)
    runs = recorded_runs()
    assert_once(runs, ids)
    assert serial_order(runs, keys) == []
    stop_workers(workers)
    clean_logs(workers)


@pytest.mark.slow
def test_queue_rate_and_kind_rate_together(manage_py: Callable[..., ManagedProcess]) -> None:
    """A queue limited to 25 jobs/s (burst 3) holds jobs of a kind limited to 20/s (burst 4),
    of a kind limited to 2 at once and 30/s (burst 3), and free jobs, on two workers.
    docs/flow.md: queue limits and kind limits both apply to a job: over any window of t
    seconds at most 25 t + 3 jobs of the queue start, at most 20 t + 4 of the first kind,
    30 t + 3 of the second; every job runs once. (Also the case of a kind's rate from @job
    under a queue's rate set by the operator.)"""
    from awa_django.operator import set_queue_limits

    tables()
    set_queue_limits("fa3r", rate_limit=25.0, rate_burst=3, actor="fa3")
    ids = []
    for i in range(75):
        kind = ["fa3.rated", "fa3.free", "fa3.both"][i % 3]
        ids.append(awa_django.enqueue(kind, queue="fa3r").id)
    workers = start_workers(manage_py, 2, concurrency=4, queues=("fa3r",))
    wait_done(ids, workers, timeout=30)
    assert_once(recorded_runs(), ids)
    spans = rate_spans(ids)
    bad = sound_window_violations([(a, b) for _, a, b in spans], 25.0, 3)
    for kind, (rate, burst) in RATES.items():
        mine = [(a, b) for k, a, b in spans if k == kind]
        bad += [f"{kind}: {v}" for v in sound_window_violations(mine, rate, burst)]
    assert bad == [], bad[:5]
    stop_workers(workers)
    clean_logs(workers)


@pytest.mark.slow
def test_kind_rate_is_reached_under_contention(manage_py: Callable[..., ManagedProcess]) -> None:
    """docs/flow.md: parked by the rate, the kind runs at its rate while the queue's other jobs
    are picked up at once. Three workers of 8 slots contend for 44 jobs of a kind limited to
    20/s (burst 4) among 132 free jobs: the kind's starts span about (44 - 4) / 20 = 2 s,
    never under it (the rate holds) and not much over (tokens the claims ask for up front and
    give back do not starve it): within 1.6 times that plus half a second."""
    tables()
    rated, ids = [], []
    for i in range(176):
        job = awa_django.enqueue("fa3.rated" if i % 4 == 0 else "fa3.free")
        ids.append(job.id)
        if i % 4 == 0:
            rated.append(job.id)
    workers = start_workers(manage_py, 3, concurrency=8)
    wait_done(ids, workers, timeout=30)
    with pg() as c:
        row = c.execute(
            "SELECT extract(epoch FROM max(attempted_at) - min(attempted_at)) FROM awa.jobs"
            " WHERE id = ANY(%s)",
            [rated],
        ).fetchone()
    assert row is not None
    span = float(row[0])
    assert 2.0 - 0.1 <= span <= 2.0 * 1.6 + 0.5, f"44 jobs at 20/s (burst 4) took {span:.2f} s"
    stop_workers(workers)
    clean_logs(workers)


def test_several_rated_kinds_in_crossed_lane_orders(
    manage_py: Callable[..., ManagedProcess],
) -> None:
    """Four kinds limited by rate (one also to 2 at once) meet in lanes of four priorities,
    each lane leading with another kind, beside free jobs, on three workers. docs/flow.md: a
    claim waits only for the rate state of the first rate-limited kind it meets and passes over
    a later one another claim holds, "so two claims never wait for each other": no deadlock, no
    claim error in any worker's log, each kind within its rate over every window, every job
    once."""
    tables()
    kinds = ["fa3.rated", "fa3.r1", "fa3.r2", "fa3.r3"]
    rates = {"fa3.rated": (20.0, 4), "fa3.r1": (40.0, 4), "fa3.r2": (40.0, 4), "fa3.r3": (40.0, 4)}
    ids = []
    for i in range(40):
        for p in range(4):
            order = kinds[p:] + kinds[:p]
            kind = order[i % 4] if i % 5 else "fa3.free"
            ids.append(awa_django.enqueue(kind, priority=p * 5, kwargs={"seconds": 0.01}).id)
    workers = start_workers(manage_py, 3, concurrency=6)
    wait_done(ids, workers, timeout=40)
    runs = recorded_runs()
    assert_once(runs, ids)
    # A job's token was taken between its claim's transaction start (attempted_at) and its
    # handler's start: only a window that holds both ends of more jobs than the rate allows is
    # a violation whatever the claims' clocks were.
    spans = rate_spans(ids)
    bad = []
    for kind, (rate, burst) in rates.items():
        mine = [(a, b) for k, a, b in spans if k == kind]
        bad += [f"{kind}: {v}" for v in sound_window_violations(mine, rate, burst)]
    assert bad == [], bad[:5]
    peak, where = peak_overlap((r for r in runs if r["kind"] == "fa3.r3"), lambda r: 1)
    assert peak <= 2, where
    for w in workers:
        assert "deadlock" not in w.output(), w.output()[-3000:]
    stop_workers(workers)
    clean_logs(workers)


@pytest.mark.slow
def test_parked_job_not_stranded_by_per_queue_cap(manage_py: Callable[..., ManagedProcess]) -> None:
    """The stranding with a per-queue cap instead of small processes: three workers of 8 slots
    serving the queue with ``--queue fa3=1``, jobs of weight 2 of a kind limited to 2 (each
    counts 1: the cap). Two run (one permit each); the third worker's job is parked; it must
    run once they end."""
    tables()
    env = worker_env(kind_limit_fast_path)
    workers = [
        manage_py("awa_worker", "--concurrency", "8", "--queue", "fa3=1", extra_env=env)
        for _ in range(3)
    ]
    ids = [awa_django.enqueue("fa3.k2", kwargs={"seconds": 0.8}, weight=2).id for _ in range(2)]
    wait_for(lambda: len(recorded_runs()) == 2, timeout=15, message="two running")
    ids.append(awa_django.enqueue("fa3.k2", weight=2).id)
    with pg() as c:
        wait_for(
            lambda: c.execute("SELECT 1 FROM awa.flow_waiting").fetchone() or count_done(ids[2:]),
            timeout=10,
            message="the third parked (or run)",
        )
    wait_done(ids, workers, timeout=5)
    stop_workers(workers)


@pytest.mark.slow
def test_parked_heavy_job_not_stranded_by_burst_one_workers(
    manage_py: Callable[..., ManagedProcess],
) -> None:
    """The burst-1 stranding on real workers of 4 slots: a kind limited to 2 at once and
    10/s with a burst of 1, three jobs of weight 2. They must all run within a few seconds
    (0.1 s apart by the rate, one at a time by the permits)."""
    tables()
    set_kind_limits("fa3.both", global_concurrency=2, rate_limit=10.0, rate_burst=1, actor="fa3")
    workers = start_workers(manage_py, 2, concurrency=4)
    ids = [awa_django.enqueue("fa3.both", kwargs={"seconds": 0.3}, weight=2).id for _ in range(3)]
    wait_done(ids, workers, timeout=6)
    stop_workers(workers)
