"""A kind's flow limits (docs/flow.md, "Per kind") hold across real worker processes: several
processes and queues, weights, faults (SIGSTOP, terminated connections, a frozen leader), head
of line, rates with and without NOTIFY, serial keys, raw SQL producers and odd kind names.

Workers are real subprocesses (``manage_py``) with the job kinds of tests/jobs/kind_limits.py;
handlers record their runs in ``katk_runs`` / ``katk_gauge`` (tests/support/kind_limit_runs.py).
"""

from __future__ import annotations

import itertools
import json
import signal
import time
from typing import Any

import pytest

from tests.jobs.kind_limits import fails_once, free, lim1, lim2, odd_name, plain
from tests.support.database import pg
from tests.support.kind_limit_runs import (
    children,
    has_table,
    is_leader,
    kind_row,
    max_overlap,
    no_leak,
    one,
    peak,
    q,
    release,
    run_starts,
    runs_per_job,
    states,
    wait_completed,
    wait_kind_limit,
    window_violations,
    worker,
)
from tests.support.polling import wait_for

pytestmark = pytest.mark.usefixtures("clean_awa", "katk_tables")


def test_kind_limit_holds_across_four_workers_two_queues_mixed_kinds(manage_py: Any) -> None:
    procs = [worker(manage_py, "--concurrency", "6") for _ in range(4)]
    wait_kind_limit("katk.lim2", 2)
    ids = []
    for i in range(40):
        ids.append(lim2.using(queue="katk" if i % 2 else "katk-b").enqueue(seconds=0.06).id)
        ids.append(free.using(queue="katk" if i % 3 else "katk-b").enqueue().id)
        ids.append(free.enqueue().id)
    wait_completed(ids, procs)
    assert peak("katk.lim2") <= 2
    assert max_overlap("katk.lim2") <= 2
    assert peak("katk.lim2") == 2, "the kind never ran at its limit"
    assert set(runs_per_job("katk.lim2").values()) == {1}
    no_leak("katk.lim2")


def test_kind_limit_counts_weight(manage_py: Any) -> None:
    procs = [worker(manage_py, "--concurrency", "8") for _ in range(3)]
    wait_kind_limit("katk.lim2", 2)
    weights = {}
    ids = []
    for i in range(24):
        w = 2 if i % 3 == 0 else 1
        j = lim2.using(weight=w, queue="katk" if i % 2 else "katk-b").enqueue(seconds=0.05)
        weights[j.id] = w
        ids.append(j.id)
    wait_completed(ids, procs)
    assert max_overlap("katk.lim2", weights) <= 2
    no_leak("katk.lim2")


def test_weight_above_kind_limit_still_runs(manage_py: Any) -> None:
    procs = [worker(manage_py)]
    wait_kind_limit("katk.lim2", 2)
    ids = [lim2.using(weight=50).enqueue(seconds=0.02).id for _ in range(3)]
    ids += [lim2.enqueue(seconds=0.02).id for _ in range(3)]
    wait_completed(ids, procs, timeout=20)
    assert max_overlap("katk.lim2", {i: 2 for i in ids[:3]}) <= 2
    no_leak("katk.lim2")


def test_sigstop_non_leader_worker_is_reaped_and_kind_progresses(manage_py: Any) -> None:
    leader = worker(manage_py, "--concurrency", "4")
    frozen = worker(manage_py, "--concurrency", "4", "--no-maintenance")
    wait_kind_limit("katk.lim1", 1)
    wait_for(
        lambda: (
            one("SELECT count(*) FROM awa.runtime_instances") >= 2
            if has_table("runtime_instances")
            else True
        ),
        timeout=10,
    )
    # park a job on the frozen worker: enqueue until it runs one there
    first = None
    for _ in range(20):
        j = lim1.enqueue(block="hold").id
        wait_for(lambda j=j: one("SELECT pid FROM katk_runs WHERE job_id = %s", [j]), timeout=20)
        if one("SELECT pid FROM katk_runs WHERE job_id = %s", [j]) == frozen.pid:
            first = j
            break
        release("hold")
        wait_completed([j], [leader, frozen])
        q("DELETE FROM katk_flags")
    assert first is not None, "could not get a job onto the frozen worker"
    frozen.send_signal(signal.SIGSTOP)
    try:
        ids = [lim1.enqueue(seconds=0.02).id for _ in range(5)]
        # the leader reaps the frozen worker's permit; its attempt is rescued and retried
        release("hold")
        wait_completed(ids, [leader], timeout=40)
    finally:
        frozen.send_signal(signal.SIGCONT)
    wait_completed([first], [leader, frozen], timeout=40)
    no_leak("katk.lim1")


def test_claim_connection_terminated_no_leak_all_complete(manage_py: Any) -> None:
    procs = [worker(manage_py, "--concurrency", "4") for _ in range(2)]
    wait_kind_limit("katk.lim2", 2)
    ids = [lim2.enqueue(seconds=0.15).id for _ in range(30)]
    ids += [free.enqueue().id for _ in range(30)]
    for _ in range(5):
        wait_for(
            lambda: (
                one(
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"
                    " AND classid = 4282182"
                )
                > 0
            ),
            timeout=20,
        )
        q(
            "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory'"
            " AND classid = 4282182 AND pid <> pg_backend_pid()"
        )
    wait_completed(ids, procs, timeout=90)
    no_leak("katk.lim2")
    assert all(p.proc.poll() is None for p in procs), "a worker died"


def test_parked_backlog_does_not_stall_other_kinds_in_same_queue(manage_py: Any) -> None:
    procs = [worker(manage_py, "--concurrency", "4")]
    wait_kind_limit("katk.lim1", 1)
    blocked = lim1.enqueue(block="hol").id
    backlog = [lim1.enqueue(seconds=0.01).id for _ in range(300)]
    wait_for(lambda: one("SELECT count(*) FROM katk_runs WHERE job_id = %s", [blocked]), timeout=20)
    others = [free.enqueue().id for _ in range(50)]
    t0 = time.monotonic()
    wait_completed(others, procs, timeout=15)
    assert time.monotonic() - t0 < 5
    release("hol")
    wait_completed([blocked, *backlog], procs, timeout=60)
    assert peak("katk.lim1") == 1
    no_leak("katk.lim1")


def test_limited_kind_progresses_behind_big_backlog_of_other_kinds(manage_py: Any) -> None:
    procs = [worker(manage_py, "--concurrency", "4")]
    wait_kind_limit("katk.lim2", 2)
    limited = [lim2.enqueue(seconds=0.05).id for _ in range(20)]
    from awa_django import enqueue_many

    reqs = [free.prepare(seconds=0.01) for _ in range(3000)]
    backlog = [j.id for j in enqueue_many(reqs)]
    t0 = time.monotonic()
    wait_completed(limited, procs, timeout=30)
    took = time.monotonic() - t0
    left = one(
        "SELECT count(*) FROM awa.jobs WHERE id = ANY(%s) AND state <> 'completed'", [backlog]
    )
    # 20 jobs at 2 at a time x 0.05 s is ~0.5 s; the backlog takes > 7 s on 2 free slots
    assert took < 6, f"limited kind took {took:.1f}s behind the backlog"
    assert left > 0


def test_rate_limited_backlog_does_not_delay_other_kinds_notify(manage_py: Any) -> None:
    """POLL_INTERVAL long: other kinds in the queue must be picked up by NOTIFY, not the poll."""
    procs = [worker(manage_py, "--concurrency", "8", overrides={"POLL_INTERVAL": 5.0})]
    wait_kind_limit("katk.rated")
    from awa_django import operator  # noqa: F401
    from awa_django.operator.actions import set_kind_limits
    from tests.jobs.kind_limits import rated

    set_kind_limits("katk.rated", rate_limit=1, rate_burst=1, actor="atk")
    ids = [rated.enqueue().id for _ in range(30)]
    wait_for(lambda: one("SELECT count(*) FROM katk_runs WHERE kind='katk.rated'") >= 1, timeout=10)
    lat = []
    for _ in range(5):
        j = free.using(queue="katk-rate").enqueue().id
        wait_completed([j], procs, timeout=10)
        lat.append(
            one(
                "SELECT extract(epoch FROM r.started - j.created_at) FROM katk_runs r"
                " JOIN awa.jobs j ON j.id = r.job_id WHERE r.job_id = %s",
                [j],
            )
        )
    assert max(lat) < 1.0, f"other kinds' start latencies behind a rate-parked kind: {lat}"
    del ids


def test_kind_and_serial_key_order_and_one_at_a_time(manage_py: Any) -> None:
    # A production-like HEARTBEAT_STALENESS: with the tests' 2 s, a loaded machine (the full
    # parallel suite) can take that long from claim to finalize, and rescue then retries the
    # attempt, which releases its key (docs/flow.md: retries may run out of order).
    steady = {"HEARTBEAT_STALENESS": 60.0}
    procs = [worker(manage_py, "--concurrency", "8", overrides=steady) for _ in range(3)]
    wait_kind_limit("katk.lim2", 2)
    by_key: dict[str, list[int]] = {}
    ids = []
    for i in range(36):
        key = f"k{i % 4}"
        j = lim2.using(serial_key=key, queue="katk" if i % 2 else "katk-b").enqueue(seconds=0.03)
        by_key.setdefault(key, []).append(j.id)
        ids.append(j.id)
        if i % 5 == 0:
            ids.append(free.using(serial_key=key).enqueue().id)
    wait_completed(ids, procs, timeout=60)
    # Each job ran once, as its first attempt: nothing failed and nothing was rescued, so a
    # second run would be a second delivery (or a retry whose reason the message shows).
    again = q(
        "SELECT r.job_id, r.attempt, r.pid, j.errors FROM katk_runs r"
        " JOIN awa.jobs j ON j.id = r.job_id"
        " WHERE r.job_id IN (SELECT job_id FROM katk_runs GROUP BY 1 HAVING count(*) > 1)"
        " OR r.attempt > 1 ORDER BY 1, 2"
    )
    logged = [
        line
        for p in procs
        for line in p.output().splitlines()
        if " WARNING " in line or " ERROR " in line
    ]
    assert again == [], (again, logged)
    assert max_overlap("katk.lim2") <= 2
    # Serial keys are per queue: order and overlap are checked per (key, queue).
    for key, kids in by_key.items():
        for queue in ("katk", "katk-b"):
            rows = q(
                "SELECT job_id, started, ended, attempt, pid FROM katk_runs"
                " WHERE job_id = ANY(%s) AND queue = %s ORDER BY started",
                [kids, queue],
            )
            assert [r[0] for r in rows] == sorted(r[0] for r in rows), (key, queue, rows)
            for a, b in itertools.pairwise(rows):
                assert b[1] >= a[2], f"key {key} in {queue}: {a[0]} and {b[0]} overlapped"
    no_leak("katk.lim2")
    assert one("SELECT count(*) FROM awa.serial_waiting") == 0


def test_raw_sql_producer_jobs_are_limited(manage_py: Any) -> None:
    procs = [worker(manage_py, "--concurrency", "8") for _ in range(2)]
    wait_kind_limit("katk.lim2", 2)
    ids = []
    with pg() as c:
        for _i in range(10):
            ids.append(
                c.execute(
                    "SELECT job_id FROM awa.enqueue_one_v2('katk.lim2', 'katk', 0, %s, 5)",
                    [json.dumps({"args": [], "kwargs": {"seconds": 0.05}})],
                ).fetchone()[0]
            )
        rows = c.execute(
            "SELECT job_id FROM awa.enqueue_v1(%s)",
            [
                json.dumps(
                    [
                        {
                            "kind": "katk.lim2",
                            "queue": "katk-b",
                            "args": {"args": [0.05], "kwargs": {}},
                        }
                        for _ in range(10)
                    ]
                )
            ],
        ).fetchall()
        ids += [r[0] for r in rows]
    wait_completed(ids, procs)
    assert max_overlap("katk.lim2") <= 2
    no_leak("katk.lim2")


def test_raw_sql_weight_junk_with_limited_kind(manage_py: Any) -> None:
    procs = [worker(manage_py, "--concurrency", "8")]
    wait_kind_limit("katk.lim2", 2)
    ids = []
    with pg() as c:
        for w in ["0", "-5", '"3"', "1e9", "null", "{}", "2.5", "99999999999"]:
            ids.append(
                c.execute(
                    "SELECT job_id FROM awa.enqueue_one_v2('katk.lim2', 'katk', 0, %s, 5,"
                    " p_metadata => %s::jsonb)",
                    [json.dumps({"args": [0.03], "kwargs": {}}), '{"awa:weight": ' + w + "}"],
                ).fetchone()[0]
            )
    wait_completed(ids, procs, timeout=30)
    assert max_overlap("katk.lim2") <= 2
    no_leak("katk.lim2")


def test_odd_kind_name_is_limited(manage_py: Any) -> None:
    procs = [worker(manage_py, "--concurrency", "8") for _ in range(2)]
    wait_kind_limit("katk:ünï/código", 1)
    ids = [odd_name.enqueue(seconds=0.03).id for _ in range(10)]
    wait_completed(ids, procs)
    assert peak("katk:ünï/código") == 1
    no_leak("katk:ünï/código")


def test_limit_on_kind_without_job_does_not_strand_or_leak(manage_py: Any) -> None:
    from awa_django.operator.actions import set_kind_limits

    set_kind_limits("ghost.kind", global_concurrency=1, actor="atk")
    procs = [worker(manage_py, "--concurrency", "8")]
    ghosts = []
    with pg() as c:
        for _ in range(5):
            ghosts.append(
                c.execute(
                    "SELECT job_id FROM awa.enqueue_one_v2('ghost.kind', 'katk', 0, %s, 1)",
                    [json.dumps({"args": [], "kwargs": {}})],
                ).fetchone()[0]
            )
    others = [free.enqueue().id for _ in range(10)]
    wait_completed(others, procs, timeout=20)
    wait_for(
        lambda: (
            all(v in ("failed", "cancelled") or v == "completed" for v in states(ghosts).values())
            and len(states(ghosts)) == 5
        ),
        timeout=30,
        message=lambda: f"ghost jobs end: {states(ghosts)} {kind_row('ghost.kind')}",
    )
    row = kind_row("ghost.kind")
    assert row is not None and not row.in_use and row.waiting == 0


def test_retries_of_limited_kind_respect_limit(manage_py: Any) -> None:
    procs = [worker(manage_py, "--concurrency", "8") for _ in range(2)]
    wait_kind_limit("katk.fails_once", 1)
    ids = [fails_once.enqueue(seconds=0.03).id for _ in range(8)]
    wait_completed(ids, procs, timeout=60)
    assert peak("katk.fails_once") == 1
    assert one("SELECT count(*) FROM katk_runs WHERE kind = 'katk.fails_once'") == 16
    no_leak("katk.fails_once")


def test_kind_limit_and_queue_limit_together(manage_py: Any) -> None:
    from awa_django.operator.actions import set_kind_limits, set_queue_limits

    set_queue_limits("katk", global_concurrency=3, actor="atk")
    set_kind_limits("katk.plain", global_concurrency=2, actor="atk")
    procs = [worker(manage_py, "--concurrency", "8") for _ in range(3)]
    ids = [plain.enqueue(seconds=0.05).id for _ in range(20)]
    ids += [free.enqueue(seconds=0.05).id for _ in range(20)]
    wait_completed(ids, procs, timeout=60)
    assert peak("katk.plain") <= 2
    rows = q("SELECT started, ended FROM katk_runs WHERE queue = 'katk'")
    ev = sorted([(s, 1) for s, _ in rows] + [(e, 0) for _, e in rows], key=lambda x: (x[0], x[1]))
    cur = best = 0
    for _, k in ev:
        cur += 1 if k else -1
        best = max(best, cur)
    assert best <= 3
    no_leak("katk.plain")


def test_lim_name_kind_prefix_does_not_collide_with_queue(manage_py: Any) -> None:
    """A kind named like a queue's permit input must not share the queue's permits in a way that
    lets either pass its limit (docs: collisions only make limits stricter)."""
    from awa_django.operator.actions import set_kind_limits, set_queue_limits

    set_queue_limits("katk", global_concurrency=1, actor="atk")
    set_kind_limits("katk.plain", global_concurrency=1, actor="atk")
    procs = [worker(manage_py, "--concurrency", "8")]
    ids = [plain.enqueue(seconds=0.02).id for _ in range(5)]
    wait_completed(ids, procs, timeout=30)
    assert peak("katk.plain") == 1
    no_leak("katk.plain")


def test_kind_with_both_rate_and_concurrency(manage_py: Any) -> None:
    from tests.jobs.kind_limits import both

    procs = [worker(manage_py, "--concurrency", "8") for _ in range(2)]
    wait_kind_limit("katk.both", 2)
    ids = [
        both.using(queue="katk" if i % 2 else "katk-b").enqueue(seconds=0.3).id for i in range(20)
    ]
    wait_completed(ids, procs, timeout=60)
    assert max_overlap("katk.both") <= 2
    assert not window_violations(run_starts("katk.both"), 10, 2)[:5]
    no_leak("katk.both")


def test_many_limited_kinds_in_one_queue(manage_py: Any) -> None:
    import awa_django

    procs = [worker(manage_py, "--concurrency", "8") for _ in range(3)]
    wait_kind_limit("katk.r3")
    wait_kind_limit("katk.c3", 1)
    ids = []
    for i in range(120):
        kind = f"katk.r{i % 4}" if i % 2 else f"katk.c{i % 4}"
        ids.append(awa_django.enqueue(kind, kwargs={"seconds": 0.02 if "c" in kind else 0}).id)
        if i % 3 == 0:
            ids.append(free.using(queue="katk-multi").enqueue().id)
    wait_completed(ids, procs, timeout=60)
    for i in range(4):
        assert max_overlap(f"katk.c{i}") <= 1
        assert not window_violations(run_starts(f"katk.r{i}"), 10, 2)[:5], i
    assert one("SELECT count(*) FROM awa.flow_waiting") == 0


def test_frozen_leader_holding_kind_permit_is_replaced_and_kind_progresses(
    manage_py: Any,
) -> None:
    first_w = worker(manage_py, "--concurrency", "4")
    wait_kind_limit("katk.lim1", 1)
    from awa_django.operator.reads import workers

    wait_for(
        lambda: any(getattr(w, "is_leader", False) for w in workers()),
        timeout=20,
        message=lambda: f"a leader: {workers()}",
    )
    second = worker(manage_py, "--concurrency", "4")
    wait_for(lambda: len(workers()) >= 2, timeout=20)
    leader_proc = first_w if is_leader(first_w) else second
    other = second if leader_proc is first_w else first_w
    held = None
    for _ in range(30):
        j = lim1.enqueue(block="fl").id
        wait_for(lambda j=j: one("SELECT pid FROM katk_runs WHERE job_id = %s", [j]), timeout=20)
        pid = one("SELECT pid FROM katk_runs WHERE job_id = %s", [j])
        if pid in {leader_proc.pid, *children(leader_proc.pid)}:
            held = j
            break
        release("fl")
        wait_completed([j], [first_w, second])
        q("DELETE FROM katk_flags")
    assert held is not None
    leader_proc.send_signal(signal.SIGSTOP)
    try:
        ids = [lim1.enqueue(seconds=0.02).id for _ in range(5)]
        release("fl")
        wait_completed(ids, [other], timeout=60)
    finally:
        leader_proc.send_signal(signal.SIGCONT)
    wait_completed([held], [first_w, second], timeout=60)
    no_leak("katk.lim1")


def test_huge_concurrency_and_weight_within_bounds_runs(manage_py: Any) -> None:
    """gc 10,000 and weight 10,000 are both documented as valid: the job must run, and the
    worker must not break (10,000 advisory locks per job would overflow the lock table)."""
    from awa_django.operator.actions import set_kind_limits

    set_kind_limits("katk.plain", global_concurrency=10_000, actor="atk")
    procs = [worker(manage_py, "--concurrency", "8")]
    ids = [plain.using(weight=10_000).enqueue().id for _ in range(2)]
    ids += [free.enqueue().id for _ in range(5)]
    wait_completed(ids, procs, timeout=60)
    no_leak("katk.plain")
    assert procs[0].proc.poll() is None


def test_parked_job_deadline_counts_from_its_run(manage_py: Any) -> None:
    """A job parked for longer than its deadline must not be rescued for it: the deadline is
    the attempt's, and parking counts no attempt."""
    proc = worker(manage_py, "--concurrency", "8")
    wait_kind_limit("katk.lim1", 1)
    first = lim1.enqueue(block="dl").id
    wait_for(lambda: one("SELECT count(*) FROM katk_runs WHERE job_id = %s", [first]), timeout=20)
    parked = [lim1.using(deadline=1.0, max_attempts=1).enqueue(seconds=0.3).id for _ in range(2)]
    wait_for(lambda: (kind_row("katk.lim1").waiting or 0) == 2, timeout=10)
    t_end = time.monotonic() + 2.5
    wait_for(lambda: time.monotonic() > t_end, timeout=3)  # parked longer than their deadline
    release("dl")
    wait_completed([first, *parked], [proc], timeout=20)


def test_queue_concurrency_one_with_parked_kind(manage_py: Any) -> None:
    """A process that may run one job of the queue at a time: parked jobs of the kind and the
    queue's other jobs all run (un-parking never needs more room than the claim has)."""
    procs = [worker(manage_py, "--queue", "katk=1", "--concurrency", "1") for _ in range(2)]
    wait_kind_limit("katk.lim1", 1)
    ids = []
    for _ in range(15):
        ids.append(lim1.enqueue(seconds=0.02).id)
        ids.append(free.enqueue().id)
    wait_completed(ids, procs, timeout=60)
    assert peak("katk.lim1") == 1
    no_leak("katk.lim1")


def test_key_order_holds_when_oldest_of_key_waits_for_kind(manage_py: Any) -> None:
    """The oldest job of a key is parked by its kind while the key is otherwise free; younger
    jobs of the key, of an unlimited kind, must not overtake it however often the leader's
    sweep hands the key on (RESCUE_INTERVAL 0.2 s here)."""
    procs = [worker(manage_py, "--concurrency", "8") for _ in range(2)]
    wait_kind_limit("katk.lim1", 1)
    a = lim1.enqueue(block="ka").id
    wait_for(lambda: one("SELECT count(*) FROM katk_runs WHERE job_id = %s", [a]), timeout=20)
    k1 = lim1.using(serial_key="s").enqueue(seconds=0.05).id
    wait_for(lambda: (kind_row("katk.lim1").waiting or 0) == 1, timeout=10)
    younger = [free.using(serial_key="s").enqueue(seconds=0.02).id for _ in range(3)]
    t_end = time.monotonic() + 2.0  # ten sweeps
    wait_for(lambda: time.monotonic() > t_end, timeout=3)
    ran = one("SELECT count(*) FROM katk_runs WHERE job_id = ANY(%s)", [younger])
    assert ran == 0, f"{ran} younger job(s) of key s ran before its oldest (parked by its kind)"
    release("ka")
    wait_completed([a, k1, *younger], procs, timeout=20)
    rows = q(
        "SELECT job_id, started, ended FROM katk_runs WHERE job_id = ANY(%s) ORDER BY started",
        [[k1, *younger]],
    )
    assert [r[0] for r in rows] == [k1, *younger]
    for x, y in itertools.pairwise(rows):
        assert y[1] >= x[2]
    no_leak("katk.lim1")
    assert one("SELECT count(*) FROM awa.serial_waiting") == 0


def test_parked_kind_holds_no_queue_permit(manage_py: Any) -> None:
    from awa_django.operator.actions import set_queue_limits
    from awa_django.operator.reads import queue_limits

    set_queue_limits("katk", global_concurrency=2, actor="atk")
    procs = [worker(manage_py, "--concurrency", "8") for _ in range(2)]
    wait_kind_limit("katk.lim1", 1)
    a = lim1.enqueue(block="qp").id
    wait_for(lambda: one("SELECT count(*) FROM katk_runs WHERE job_id = %s", [a]), timeout=20)
    parked = [lim1.enqueue(seconds=0.01).id for _ in range(6)]
    wait_for(lambda: (kind_row("katk.lim1").waiting or 0) == 6, timeout=10)
    others = [free.enqueue(seconds=0.02).id for _ in range(20)]
    wait_completed(others, procs, timeout=20)

    def queue_in_use() -> int:
        return next((r.in_use or 0) for r in queue_limits() if r.queue == "katk")

    wait_for(
        lambda: queue_in_use() == 1,
        timeout=5,
        message=lambda: f"queue permits in use 1 (the blocked job): {queue_in_use()}",
    )
    release("qp")
    wait_completed([a, *parked], procs, timeout=20)
    wait_for(lambda: queue_in_use() == 0, timeout=5)
    no_leak("katk.lim1")


def test_rated_kind_with_one_serial_key(manage_py: Any) -> None:
    from tests.jobs.kind_limits import rated

    procs = [worker(manage_py, "--concurrency", "8") for _ in range(2)]
    wait_kind_limit("katk.rated")
    ids = [rated.using(serial_key="one").enqueue(seconds=0.02).id for _ in range(20)]
    t0 = time.monotonic()
    wait_completed(ids, procs, timeout=30)
    took = time.monotonic() - t0
    rows = q("SELECT job_id, started, ended FROM katk_runs ORDER BY started")
    assert [r[0] for r in rows] == ids
    for x, y in itertools.pairwise(rows):
        assert y[1] >= x[2]
    assert not window_violations(run_starts("katk.rated"), 20, 5)[:5]
    # 20 jobs at 20/s (burst 5), one at a time for 20 ms each: about 1 s; allow 5
    assert took < 5, f"20 jobs of one key at 20/s took {took:.1f}s"


def test_kind_rate_runs_at_rate_without_notify(manage_py: Any) -> None:
    from tests.jobs.kind_limits import rated

    procs = [
        worker(manage_py, "--concurrency", "8", overrides={"NOTIFY": False, "POLL_INTERVAL": 1.0})
        for _ in range(2)
    ]
    wait_kind_limit("katk.rated")
    ids = [rated.enqueue().id for _ in range(60)]
    t0 = time.monotonic()
    wait_completed(ids, procs, timeout=60)
    took = time.monotonic() - t0
    assert not window_violations(run_starts("katk.rated"), 20, 5)[:5]
    assert took < 6, f"60 jobs at 20/s burst 5 took {took:.1f}s without NOTIFY (POLL_INTERVAL 1)"


def test_kind_concurrency_handoff_without_notify(manage_py: Any) -> None:
    procs = [
        worker(manage_py, "--concurrency", "8", overrides={"NOTIFY": False, "POLL_INTERVAL": 1.0})
        for _ in range(2)
    ]
    wait_kind_limit("katk.lim1", 1)
    ids = [
        lim1.using(queue="katk" if i % 2 else "katk-b").enqueue(seconds=0.05).id for i in range(20)
    ]
    t0 = time.monotonic()
    wait_completed(ids, procs, timeout=60)
    took = time.monotonic() - t0
    assert peak("katk.lim1") == 1
    # 20 x 50 ms = 1 s of work; a freed permit seen only at the next poll (1 s) would take 20 s
    assert took < 12, f"20 jobs of a kind limited to 1 took {took:.1f}s without NOTIFY"


@pytest.mark.parametrize("workers", [1, 2])
def test_colliding_kind_permit_keys_never_pass_either_limit(manage_py: Any, workers: int) -> None:
    """docs: two kinds' permit keys colliding "only make the limits stricter". Session advisory
    locks are re-entrant: a worker holding the shared key for one kind must not take it again
    for the other kind, nor for a second job of the first."""
    import awa_django

    h1, h2 = "katk.h111070", "katk.h250426"
    assert one("SELECT hashtext('kind:' || %s || '/0') = hashtext('kind:' || %s || '/0')", [h1, h2])
    assert one("SELECT awa._flow_kind_key_v1(%s, 0) = awa._flow_kind_key_v1(%s, 0)", [h1, h2])
    procs = [worker(manage_py, "--concurrency", "8") for _ in range(workers)]
    wait_kind_limit(h1, 1)
    wait_kind_limit(h2, 1)
    x = awa_django.enqueue(h1, kwargs={"block": "x"}).id
    wait_for(lambda: one("SELECT count(*) FROM katk_runs WHERE job_id = %s", [x]), timeout=20)
    z = awa_django.enqueue(h2, kwargs={"block": "z"}).id
    ys = [awa_django.enqueue(h1, kwargs={"seconds": 0.05}).id for _ in range(3)]
    zs = [awa_django.enqueue(h2, kwargs={"seconds": 0.05}).id for _ in range(3)]
    t_end = time.monotonic() + 1.0
    wait_for(lambda: time.monotonic() > t_end, timeout=2)
    release("z")
    t_end = time.monotonic() + 1.0
    wait_for(lambda: time.monotonic() > t_end, timeout=2)
    release("x")
    wait_completed([x, z, *ys, *zs], procs, timeout=30)
    assert max_overlap(h1) <= 1, q(
        "SELECT job_id, kind, pid, started, ended FROM katk_runs ORDER BY started"
    )
    assert max_overlap(h2) <= 1, q(
        "SELECT job_id, kind, pid, started, ended FROM katk_runs ORDER BY started"
    )
    no_leak(h1)
    no_leak(h2)
