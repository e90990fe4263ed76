"""A worker whose claim came back empty because another session's claim held the lane (claims
skip locked lanes) claims again within milliseconds when its last claims found a backlog, not
after POLL_INTERVAL (awa_django/worker/runtime.py, ``WorkerRuntime._dispatch``), as a real
`manage.py awa_worker` subprocess against real Postgres."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import pytest

import awa_django
from tests import testjobs
from tests.helpers import ManagedProcess, pg, wait_for

pytestmark = [pytest.mark.worker, pytest.mark.usefixtures("clean_awa")]

Start = Callable[..., ManagedProcess]


def states(ids: list[int]) -> list[str]:
    with pg() as conn:
        rows = dict(
            conn.execute("SELECT id, state FROM awa.jobs WHERE id = ANY(%s)", [ids]).fetchall()
        )
    return [rows.get(i, "missing") for i in ids]


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
        extra_env={"AWA_TEST_OVERRIDES": json.dumps({"POLL_INTERVAL": 10.0})},
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
        time.sleep(0.3)  # the lock is the point here: held while the worker's claims skip it
        assert states(quick) == ["available"] * 20
        holder.commit()
    released = time.monotonic()
    wait_for(
        lambda: states(quick) == ["completed"] * 20,
        timeout=20,
        message=lambda: f"the quick jobs to complete; output:\n{proc.output()}",
    )
    assert time.monotonic() - released < 4.0  # well within POLL_INTERVAL (10 s)
