"""A worker whose claim came back empty because another session's claim held the lane (claims
skip locked lanes) claims again within milliseconds when its last claims found a backlog, not
after POLL_INTERVAL (awa_django/worker/slots.py, ``BacklogRetry``): its pauses, and a real
`manage.py awa_worker` subprocess against real Postgres."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

import awa_django
from awa_django.worker.slots import BACKLOG_RETRY, BacklogRetry
from tests.jobs import common as testjobs
from tests.jobs import worker_env
from tests.support.database import pg
from tests.support.polling import wait_for
from tests.support.processes import ManagedProcess

pytestmark = [pytest.mark.worker, pytest.mark.usefixtures("clean_awa")]

Start = Callable[..., ManagedProcess]


def states(ids: list[int]) -> list[str]:
    with pg() as conn:
        rows = dict(
            conn.execute("SELECT id, state FROM awa.jobs WHERE id = ANY(%s)", [ids]).fetchall()
        )
    return [rows.get(i, "missing") for i in ids]


def test_pauses_double_from_the_first_retry_up_to_the_poll_interval() -> None:
    retry = BacklogRetry(8)
    assert retry.pause(0.2) == 0.2  # no backlog seen yet: the poll interval
    retry.claimed(7)
    assert retry.pause(0.2) == 0.2  # fewer than a quarter of the slots: not a backlog
    retry.claimed(8)
    pauses = [retry.pause(0.2) for _ in range(10)]
    expected = [BACKLOG_RETRY * 2**i for i in range(8)]  # 1 ms ... 128 ms, then 0.2 s
    for pause, nominal in zip(pauses, expected, strict=False):
        assert nominal * 0.5 <= pause <= nominal * 1.5
    assert pauses[8:] == [0.2, 0.2]
    retry.claimed(3)
    assert retry.pause(0.2) == 0.2  # a small claim does not start the retries again
    retry.claimed(32)
    assert retry.pause(0.2) <= BACKLOG_RETRY * 1.5  # a full one does


def test_a_queue_of_one_or_two_slots_needs_two_jobs_for_a_backlog() -> None:
    retry = BacklogRetry(1)
    retry.claimed(1)
    assert retry.pause(0.2) == 0.2
    retry.claimed(2)
    assert retry.pause(0.2) <= BACKLOG_RETRY * 1.5
    assert BacklogRetry(0).mark == 2


def test_an_armed_retry_starts_as_after_a_backlog() -> None:
    retry = BacklogRetry(8, armed=True)
    pauses = [retry.pause(0.2) for _ in range(9)]
    assert all(
        BACKLOG_RETRY * 2**i * 0.5 <= pause <= BACKLOG_RETRY * 2**i * 1.5
        for i, pause in enumerate(pauses[:8])
    )
    assert pauses[8] == 0.2  # the sequence ran out: the poll interval again


def test_pauses_never_exceed_a_short_poll_interval() -> None:
    retry = BacklogRetry(2)
    retry.claimed(2)
    pauses = [retry.pause(0.001) for _ in range(3)]
    assert all(pause <= 0.001 for pause in pauses)
    assert pauses[1:] == [0.001, 0.001]  # the retries reached the poll interval at once


def test_an_empty_claim_on_a_held_lane_after_a_backlog_claim_is_retried_soon(
    manage_py: Start,
) -> None:
    # One transaction, so one lane: two 1-second jobs ahead of twenty quick ones.
    handles = awa_django.enqueue_many(
        [testjobs.slow_sync.prepare(1.0) for _ in range(2)]
        + [testjobs.overlap_sync.prepare(0) for _ in range(20)]
    )
    slow = [h.id for h in handles[:2]]
    quick = [h.id for h in handles[2:]]
    with pg() as conn:
        lanes = conn.execute(
            "SELECT DISTINCT lane_id FROM awa.ready_entries WHERE job_id = ANY(%s)",
            [slow + quick],
        ).fetchall()
    assert len(lanes) == 1
    # POLL_INTERVAL 10 s: without the quick retry the quick jobs would wait that long (nothing
    # enqueued afterwards, so no wake-up either).
    proc = manage_py(
        "awa_worker",
        "--queue",
        "slow=2",
        extra_env=worker_env(POLL_INTERVAL=10.0),
    )
    wait_for(
        lambda: states(slow) == ["running", "running"],
        timeout=20,
        message=lambda: f"the slow jobs to start (a full claim); output:\n{proc.output()}",
    )
    # Hold the lane as another worker's claim would, while the slow jobs end and the worker
    # claims again (and finds the lane locked).
    with pg(autocommit=False) as holder:
        holder.execute("SELECT 1 FROM awa.queue_lanes WHERE lane_id = %s FOR UPDATE", lanes[0])
        wait_for(
            lambda: states(slow) == ["completed", "completed"],
            timeout=20,
            message=lambda: f"the slow jobs to complete; output:\n{proc.output()}",
        )
        # The lock is the point here: held until a claim of the worker's, started after the
        # slow jobs ended, has come back (empty: it skipped the lane).
        ended = holder.execute("SELECT clock_timestamp()").fetchone()
        wait_for(
            lambda: claimed_since(ended[0] if ended else None),
            timeout=20,
            message=lambda: f"a claim skipping the held lane; output:\n{proc.output()}",
        )
        assert states(quick) == ["available"] * 20
        holder.commit()
    released = time.monotonic()
    wait_for(
        lambda: states(quick) == ["completed"] * 20,
        timeout=20,
        message=lambda: f"the quick jobs to complete; output:\n{proc.output()}",
    )
    assert time.monotonic() - released < 4.0  # well within POLL_INTERVAL (10 s)


def claimed_since(after: object) -> bool:
    """Whether some session has finished a claim_v3 call that started after ``after``
    (pg_stat_activity keeps an idle session's last statement and its start)."""
    with pg() as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND state = 'idle' AND query LIKE %s AND query_start > %s",
            ["%claim_v3%", after],
        ).fetchone()
    return bool(row and row[0])
