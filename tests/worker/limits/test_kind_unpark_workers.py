"""Heavy jobs parked by their kind come back with real ``awa_worker`` processes (docs/flow.md,
"Weights" and "Per kind"): a claim batch below a job's weight, the worker holding the permits
SIGKILLed, a mixed fleet without busy polling or churn, the per-queue cap, a kind with burst 1
within its rate. Handlers of tests/jobs/kind_unpark.py record their runs in ``upk_runs``.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from tests.support.database import pg
from tests.support.polling import wait_for
from tests.support.unpark_sessions import (
    WQ,
    Claimer,
    ended,
    flag,
    kind_limit,
    kind_permits,
    observer_conns,
    started,
    wjob,
    worker,
    wparked,
)

pytestmark = pytest.mark.usefixtures("clean_awa", "observer")


@pytest.mark.usefixtures("upk_tables")
def test_worker_with_a_claim_batch_below_a_weight_runs_the_heavy_job(manage_py: Any) -> None:
    """docs/flow.md, "Weights": a weight above what the claiming process can run counts as
    that bound, so a heavy job never blocks its lane for ever. A worker of 4 slots with
    ``CLAIM_BATCH_SIZE`` 2 caps weights at 4 but asks for at most 2 units per claim: a job of
    weight 3 would never fit any of its claims."""
    h = wjob("upkw.heavy", weight=3)
    w = worker(manage_py, "--concurrency", "4", CLAIM_BATCH_SIZE=2)
    # The worker claims: a light job in another lane (another priority) runs.
    light = wjob("upkw.light", priority=-1)
    wait_for(lambda: ended([light]), timeout=15, message=lambda: f"the light job; {w.output()}")
    wait_for(lambda: ended([h]), timeout=5, message=lambda: f"the heavy job; {w.output()}")


@pytest.mark.usefixtures("upk_tables")
def test_sigkill_of_the_worker_holding_the_permits_a_heavy_parked_job_waits_for(
    manage_py: Any,
) -> None:
    import signal

    kind_limit("upkw.heavy", global_concurrency=3)
    blocker = wjob("upkw.heavy", weight=2, block="never")
    a = worker(manage_py, "--concurrency", "4")
    wait_for(lambda: started(blocker), timeout=15, message=lambda: f"blocker; {a.output()}")
    b = worker(manage_py, "--concurrency", "4")
    h = wjob("upkw.heavy", weight=5)  # counts 3: parked while the blocker holds 2
    wait_for(lambda: wparked() == [h], timeout=10, message="the heavy job parked")
    assert not started(h)
    a.send_signal(signal.SIGKILL)
    a.wait()
    wait_for(lambda: ended([h]), timeout=10, message=lambda: f"the heavy job; {b.output()}")
    # No permit leaks. ended() reads the handler's own record of its end; the worker releases
    # the job's permits when it writes the job's batch, just after: wait for that.
    wait_for(
        lambda: wparked() == [] and kind_permits("upkw.heavy") == 0,
        timeout=10,
        message=lambda: f"permits {kind_permits('upkw.heavy')} left; {b.output()}",
    )


@pytest.mark.usefixtures("upk_tables")
def test_mixed_fleet_runs_heavy_parked_jobs_without_busy_polling_or_churn(
    manage_py: Any,
) -> None:
    """A worker of 2 slots and one of 8 on one queue; a kind limited to 6; a blocker holds 4
    of its permits while three jobs of weight 6 wait parked. While they wait, the workers claim
    about once per POLL_INTERVAL (0.25 s), not in a loop, and the parked jobs are not moved
    back and parked again over and over; once the blocker ends all three run."""
    from django.db import connection

    db = connection.settings_dict["NAME"]
    with pg() as conn:
        conn.execute(f"ALTER DATABASE \"{db}\" SET track_functions = 'pl'")
    try:
        kind_limit("upkw.heavy", global_concurrency=6)
        blocker = wjob("upkw.heavy", weight=4, block="go")
        big = worker(manage_py, "--concurrency", "8", POLL_INTERVAL=0.25)
        wait_for(lambda: started(blocker), timeout=15, message=lambda: big.output())
        small = worker(manage_py, "--concurrency", "2", POLL_INTERVAL=0.25)
        heavy = [wjob("upkw.heavy", weight=6, block="go") for _ in range(3)]
        # The small worker counts each as 2 (its slots): 2 are free, so one may run there.
        wait_for(lambda: any(started(j) for j in heavy), timeout=10, message="a heavy job started")

        def calls() -> int:
            row = (
                observer_conns[0]
                .execute(
                    "SELECT pg_stat_force_next_flush(), coalesce(sum(calls), 0)"
                    " FROM pg_stat_user_functions WHERE funcname = 'claim_v3'"
                )
                .fetchone()
            )
            return int(row[1]) if row else 0

        def parks() -> int:
            row = (
                observer_conns[0]
                .execute(
                    "SELECT count(*) FROM awa.claim_closures WHERE outcome = 'parked'"
                    " AND job_id = ANY(%s)",
                    [heavy],
                )
                .fetchone()
            )
            return int(row[0]) if row else 0

        import time

        before_calls, before_parks, t0 = calls(), parks(), time.monotonic()
        # At least 12 claims while the jobs stay parked (about 1.5 s at one claim per 0.25 s
        # per worker): busy polling would show hundreds at the first stats flush.
        during_calls = wait_for(
            lambda: max(calls() - before_calls, 0) // 12 and calls() - before_calls,
            timeout=15,
            interval=0.1,
            message="the workers' claims",
        )
        window = time.monotonic() - t0
        during_parks = parks() - before_parks
        assert sum(started(j) for j in heavy) == 1  # 4 + 2 of 6: the others wait
        flag("go")
        wait_for(
            lambda: ended([blocker, *heavy]),
            timeout=20,
            message=lambda: f"the heavy jobs; {small.output()}\n{big.output()}",
        )
    finally:
        with pg() as conn:
            conn.execute(f'ALTER DATABASE "{db}" RESET track_functions')
    # 2 workers at one claim per 0.25 s: about 16 in 2 s (NOTIFY wake-ups add a few).
    assert during_calls <= 60, f"{during_calls} claims in {window:.1f}s: busy polling"
    assert during_parks <= 6, f"parked jobs re-parked {during_parks} times in {window:.1f}s"
    runs_per_job = (
        observer_conns[0]
        .execute(
            "SELECT job_id, count(*) FROM upk_runs WHERE job_id = ANY(%s) GROUP BY job_id",
            [heavy],
        )
        .fetchall()
    )
    assert dict(runs_per_job) == dict.fromkeys(heavy, 1)
    assert wparked() == [] and kind_permits("upkw.heavy") == 0


@pytest.mark.usefixtures("upk_tables")
def test_per_queue_cap_bounds_the_parked_weight(manage_py: Any) -> None:
    """``--queue upkw=2`` in a worker of 8: a parked job of weight 6 (kind limit 6) counts 2
    there, so it runs once 2 permits are free (not 6)."""
    kind_limit("upkw.heavy", global_concurrency=6)
    holder = Claimer(8)
    try:
        busy = [wjob("upkw.heavy") for _ in range(5)]
        assert sorted(holder.claim(8, queue=WQ)) == busy  # 5 of the kind's 6 permits
        h = wjob("upkw.heavy", weight=6)
        from tests.jobs import kind_unpark, worker_env

        env = worker_env(kind_unpark)
        w = manage_py("awa_worker", "--queue", f"{WQ}=2", "--concurrency", "8", extra_env=env)
        wait_for(lambda: wparked() == [h], timeout=15, message=lambda: w.output())
        holder.finish(busy[:1])
        holder.claim(0)  # 2 free now
        wait_for(lambda: ended([h]), timeout=10, message=lambda: f"the heavy job; {w.output()}")
    finally:
        holder.close()


@pytest.mark.usefixtures("upk_tables")
def test_real_workers_run_heavy_jobs_of_a_kind_with_burst_1_within_its_rate(
    manage_py: Any,
) -> None:
    """Kind limited to 3 at once and 4 per second with a burst of 1; four jobs of weight 3 on
    two workers of 4 slots: all run, one at a time, and never faster than the rate."""
    kind_limit("upkw.heavy", global_concurrency=3, rate_limit=4, rate_burst=1)
    heavy = [wjob("upkw.heavy", weight=3) for _ in range(4)]
    ws = [worker(manage_py, "--concurrency", "4") for _ in range(2)]
    wait_for(
        lambda: ended(heavy),
        timeout=20,
        message=lambda: f"the heavy jobs; parked {wparked()}; {ws[0].output()}",
    )
    rows = (
        observer_conns[0]
        .execute(
            "SELECT started, ended FROM upk_runs WHERE job_id = ANY(%s) ORDER BY started", [heavy]
        )
        .fetchall()
    )
    assert len(rows) == 4
    for (_, e1), (s2, _) in itertools.pairwise(rows):
        assert s2 >= e1, "two jobs of weight 3 ran at once under a kind limit of 3"
    span = (rows[-1][0] - rows[0][0]).total_seconds()
    assert span >= 3 / 4 - 0.1, f"4 starts in {span:.2f}s: past 4/s with a burst of 1"
