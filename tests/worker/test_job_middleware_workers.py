"""Job middleware in a real worker process: the chain runs around sync handlers (in the
handler threads) and async ones (on the event loop), and what it raises fails the job by its
policy while the worker goes on. The chain's rules: tests/django/test_job_middleware.py."""

from __future__ import annotations

import json

import pytest

from tests.jobs import common as testjobs
from tests.support.database import pg
from tests.support.workers import Start, exited, worker

pytestmark = [pytest.mark.worker, pytest.mark.usefixtures("clean_awa")]


def test_a_worker_runs_every_handler_inside_the_chain(manage_py: Start) -> None:
    sync_job = testjobs.renamed.enqueue(1).id
    async_job = testjobs.async_echo.enqueue(2).id
    refused = testjobs.async_echo.using(metadata={"gate": "refuse"}).enqueue(3).id
    proc = worker(
        manage_py,
        "--burst",
        overrides={"JOB_MIDDLEWARE": ["tests.jobs.middleware.outer", "tests.jobs.middleware.gate"]},
    )
    assert exited(proc, timeout=30) == 0, proc.output()
    with pg() as conn:
        rows = {
            job_id: (state, result, errors)
            for job_id, state, result, errors in conn.execute(
                "SELECT id, state, result, errors FROM awa.jobs WHERE id = ANY(%s)",
                [[sync_job, async_job, refused]],
            ).fetchall()
        }
    assert rows[sync_job][:2] == ("completed", {"outer": 1})
    assert rows[async_job][:2] == ("completed", {"outer": 2})
    state, _, errors = rows[refused]
    assert state == "failed" and "refused by the gate" in json.dumps(errors)
