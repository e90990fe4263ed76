"""Workflows under concurrency, at the storage layer (real sessions): finalizers racing on a
step's last dependencies, a batch's last members ending at once, and what a rolled-back
enqueue leaves."""

from __future__ import annotations

import json
import threading
from typing import Any

import psycopg
import pytest
from django.db import transaction

from awa_django import workflow
from awa_django.db import storage
from awa_django.db.storage import Finalization
from tests.jobs import workflow_steps as steps
from tests.support.database import pg
from tests.support.factories import WORKER

pytestmark = [
    pytest.mark.storage,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("clean_awa"),
]


def enqueue_workflow(conn: psycopg.Connection[Any], spec: dict[str, Any]) -> dict[str, int]:
    rows = conn.execute(
        "SELECT step, job_id FROM awa.workflow_enqueue_v1(%s::jsonb)", [json.dumps(spec)]
    ).fetchall()
    return dict(rows)


def ready_rows(conn: psycopg.Connection[Any], job_id: int) -> int:
    row = conn.execute("SELECT count(*) FROM awa.ready_entries WHERE job_id = %s", [job_id])
    return int(row.fetchone()[0])  # type: ignore[index]


def race_last_two(
    a: psycopg.Connection[Any], b: psycopg.Connection[Any], spec: dict[str, Any], last: str
) -> dict[str, int]:
    """Claim the two members of ``spec``, finalize them in two transactions at once (the
    second waits for the first's lock on the workflow), and return the steps' job ids."""
    ids = enqueue_workflow(a, spec)
    claimed = storage.claim(a, "wf", 2, WORKER)
    assert len(claimed) == 2
    done = threading.Event()

    def finalize(conn: psycopg.Connection[Any], c: storage.ClaimedJob) -> None:
        storage.finalize(
            conn, [Finalization(c.job_id, c.run_lease, c.claim_slot, "completed", result_json="1")]
        )

    def finish_second() -> None:
        with b.transaction():
            finalize(b, claimed[1])
        done.set()

    with a.transaction():
        finalize(a, claimed[0])
        thread = threading.Thread(target=finish_second)
        thread.start()
        assert not done.wait(0.3)  # held by the first finalizer's lock on the workflow
        assert ready_rows(a, ids[last]) == 0
    thread.join(10)
    assert done.is_set()
    return ids


def test_racing_finalizers_of_the_last_dependencies_release_the_step_once() -> None:
    spec = {
        "name": "race",
        "steps": [
            {"step": "a", "job": {"kind": "k", "queue": "wf"}},
            {"step": "b", "job": {"kind": "k", "queue": "wf"}},
            {"step": "c", "job": {"kind": "k", "queue": "wf"}, "after": ["a", "b"]},
        ],
    }
    with pg() as conn, pg() as other:
        ids = race_last_two(conn, other, spec, "c")
        assert ready_rows(conn, ids["c"]) == 1
        row = conn.execute(
            "SELECT state FROM awa.workflow_v1(%s)",
            [conn.execute("SELECT max(workflow_id) FROM awa.workflows").fetchone()[0]],
        )
        assert row.fetchone()[0] == "running"  # type: ignore[index]


def test_a_batch_callback_is_enqueued_once_when_its_last_members_end_together() -> None:
    spec = {
        "name": "batch",
        "kind": "batch",
        "steps": [
            {"job": {"kind": "k", "queue": "wf"}},
            {"job": {"kind": "k", "queue": "wf"}},
            {
                "step": "on_complete",
                "job": {"kind": "cb", "queue": "wf"},
                "after": "*",
                "on_failure": "run",
            },
        ],
    }
    with pg() as conn, pg() as other:
        ids = race_last_two(conn, other, spec, "on_complete")
        assert ready_rows(conn, ids["on_complete"]) == 1
        metadata = conn.execute(
            "SELECT metadata FROM awa.ready_entries WHERE job_id = %s", [ids["on_complete"]]
        ).fetchone()[0]  # type: ignore[index]
        assert metadata["awa:workflow"]["deps"] == {
            "completed": 2,
            "failed": 0,
            "cancelled": 0,
            "skipped": 0,
        }


def test_a_rolled_back_enqueue_leaves_nothing() -> None:
    wf = workflow("rolled back")
    a = wf.add(steps.value.prepare(1))
    wf.add(steps.value.prepare(2), after=a)
    with pytest.raises(RuntimeError), transaction.atomic():
        wf.enqueue()
        raise RuntimeError("the view failed")
    with pg() as conn:
        counts = conn.execute(
            "SELECT (SELECT count(*) FROM awa.workflows),"
            " (SELECT count(*) FROM awa.workflow_steps),"
            " (SELECT count(*) FROM awa.workflow_waiting), (SELECT count(*) FROM awa.jobs)"
        ).fetchone()
    assert counts == (0, 0, 0, 0)


def test_a_step_that_cannot_be_released_fails_alone_and_the_finalize_commits() -> None:
    spec = {
        "name": "poison",
        "steps": [
            {"step": "a", "job": {"kind": "k", "queue": "wf"}},
            {"step": "b", "job": {"kind": "k", "queue": "wf"}, "after": ["a"]},
            {"step": "c", "job": {"kind": "k", "queue": "wf"}, "after": ["b"]},
        ],
    }
    with pg() as conn:
        ids = enqueue_workflow(conn, spec)
        # A body no check of the table refuses but the ready ring cannot take (a forged row).
        conn.execute(
            "UPDATE awa.workflow_waiting SET queue = 'NOT A QUEUE' WHERE job_id = %s", [ids["b"]]
        )
        [c] = storage.claim(conn, "wf", 1, WORKER)
        done = Finalization(c.job_id, c.run_lease, c.claim_slot, "completed")
        assert storage.finalize(conn, [done]) == []
        workflow_id = conn.execute("SELECT max(workflow_id) FROM awa.workflows").fetchone()
        steps = conn.execute("SELECT step, state FROM awa.workflow_steps_v1(%s)", workflow_id)
        assert dict(steps.fetchall()) == {"a": "completed", "b": "failed", "c": "cancelled"}
        error = conn.execute(
            "SELECT errors -> -1 ->> 'message' FROM awa.done_entries WHERE job_id = %s",
            [ids["b"]],
        ).fetchone()
        assert error is not None and error[0].startswith("release failed: queue:")


def test_a_step_is_decided_only_when_its_last_dependency_ends() -> None:
    """B (cancel) waits for A and X; X fails while A runs: B is cancelled only when A ends, so
    the cleanup after B (run) never starts while A, its ancestor, still runs."""
    spec = {
        "name": "transitive",
        "steps": [
            {"step": "a", "job": {"kind": "k", "queue": "wf"}},
            {"step": "x", "job": {"kind": "k", "queue": "wf"}},
            {"step": "b", "job": {"kind": "k", "queue": "wf"}, "after": ["a", "x"]},
            {
                "step": "cleanup",
                "job": {"kind": "k", "queue": "wf"},
                "after": ["b"],
                "on_failure": "run",
            },
        ],
    }
    with pg() as conn:
        conn.execute("SELECT awa.queue_dlq_v1('wf', false)")
        ids = enqueue_workflow(conn, spec)
        claimed = {c.job_id: c for c in storage.claim(conn, "wf", 2, WORKER)}
        a, x = claimed[ids["a"]], claimed[ids["x"]]
        failed = Finalization(
            x.job_id, x.run_lease, x.claim_slot, "fail", error={"message": "boom"}
        )
        assert storage.finalize(conn, [failed]) == []
        workflow_id = conn.execute("SELECT max(workflow_id) FROM awa.workflows").fetchone()

        def states() -> dict[str, str]:
            rows = conn.execute("SELECT step, state FROM awa.workflow_steps_v1(%s)", workflow_id)
            return dict(rows.fetchall())

        assert states() == {"a": "running", "x": "failed", "b": "waiting", "cleanup": "waiting"}
        done = Finalization(a.job_id, a.run_lease, a.claim_slot, "completed")
        assert storage.finalize(conn, [done]) == []
        assert states() == {
            "a": "completed",
            "x": "failed",
            "b": "cancelled",
            "cleanup": "available",
        }


def test_cancel_workflow_ends_live_waiting_and_dead_lettered_steps_in_sets() -> None:
    members = [{"job": {"kind": "k", "queue": "wf"}} for _ in range(300)]
    callback = {
        "step": "on_complete",
        "job": {"kind": "cb", "queue": "wf"},
        "after": "*",
        "on_failure": "run",
    }
    with pg() as conn:
        ids = enqueue_workflow(
            conn, {"name": "big", "kind": "batch", "steps": [*members, callback]}
        )
        running = storage.claim(conn, "wf", 10, WORKER)
        workflow_id = conn.execute("SELECT max(workflow_id) FROM awa.workflows").fetchone()
        cancelled = conn.execute("SELECT awa.workflow_cancel_v1(%s)", workflow_id).fetchone()
        assert cancelled == (301,)
        state = conn.execute(
            "SELECT state, cancelled, finished_at IS NOT NULL FROM awa.workflow_v1(%s)",
            workflow_id,
        ).fetchone()
        assert state == ("failed", 301, True)
        stale = storage.finalize(
            conn, [Finalization(c.job_id, c.run_lease, c.claim_slot, "completed") for c in running]
        )
        assert len(stale) == 10  # the running members were told to stop; their ends lose
        assert ready_rows(conn, ids["on_complete"]) == 0


def test_a_long_async_wait_does_not_hold_up_other_sync_work() -> None:
    import asyncio

    from asgiref.sync import sync_to_async

    wf = workflow("never runs")
    wf.add(steps.value.prepare(1))
    run = wf.enqueue()  # nothing drains it: the wait can only time out

    def read() -> int:
        from django.db import connection

        try:
            with connection.cursor() as cursor:
                cursor.execute("SELECT 1")
                row = cursor.fetchone()
            return int(row[0])
        finally:
            connection.close()  # this executor thread's own connection

    async def scenario() -> tuple[bool, int]:
        slow = asyncio.ensure_future(run.aresult(timeout=3))
        await asyncio.sleep(0.1)
        value = await sync_to_async(read, thread_sensitive=True)()
        still_waiting = not slow.done()
        with pytest.raises(TimeoutError):
            await slow
        return still_waiting, value

    assert asyncio.run(scenario()) == (True, 1)
