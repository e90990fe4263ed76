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
