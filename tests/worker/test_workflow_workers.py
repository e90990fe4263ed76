"""Workflows and batches run by real worker processes: a DAG drains through a worker and its
handle's wait wakes on the NOTIFY of the last step's finalize; a worker SIGKILLed in the middle
of a step loses nothing (the step is rescued, its dependents run once, after it); two workers
finishing a batch's last members at once call its callback once."""

from __future__ import annotations

import signal
from typing import Any

import pytest

from awa_django import batch, workflow
from tests.jobs import common as testjobs
from tests.jobs import worker_env
from tests.jobs import workflow_steps as steps
from tests.support.polling import wait_for
from tests.support.workers import Start
from tests.testapp.models import Ledger

pytestmark = [pytest.mark.usefixtures("clean_awa")]


def start(manage_py: Start, *queues: str, **settings: Any) -> Any:
    return manage_py(
        "awa_worker",
        *(q for name in queues for q in ("--queue", name)),
        extra_env=worker_env(steps, **settings),
    )


def test_a_dag_drains_through_a_worker_and_its_wait_wakes_at_the_end(manage_py: Start) -> None:
    wf = workflow("diamond")
    top = wf.add(steps.value.prepare(1), name="top")
    left = wf.add(steps.total.prepare(extra=1), after=top, name="left")
    right = wf.add(steps.total.prepare(extra=2), after=top, name="right")
    wf.add(steps.total.prepare(), after=[left, right], name="bottom")
    run = wf.enqueue()
    start(manage_py, "wf")
    assert run.result(timeout=30) == {"bottom": 5}
    status = run.status()
    assert (status.state, status.completed) == ("completed", 4)


def test_a_worker_killed_in_a_step_loses_nothing(manage_py: Start) -> None:
    wf = workflow("killed")
    first = wf.add(testjobs.slow_first.prepare(), name="first")
    wf.add(steps.seen.prepare(), after=first, name="then")
    run = wf.enqueue()
    one = start(manage_py, "stop", "wf", HEARTBEAT_STALENESS=1.0)
    wait_for(
        lambda: Ledger.objects.filter(job_id=run.jobs["first"].id).exists(),
        timeout=20,
        message="the first step to start",
    )
    one.send_signal(signal.SIGKILL)
    one.wait(10)
    start(manage_py, "stop", "wf", HEARTBEAT_STALENESS=1.0)
    assert run.result(timeout=30) == {
        "then": {"states": {"first": "completed"}, "results": {"first": "second"}}
    }
    assert Ledger.objects.filter(job_id=run.jobs["then"].id).count() == 0  # seen() records nothing
    assert Ledger.objects.filter(job_id=run.jobs["first"].id).count() == 2


def test_two_workers_call_a_batch_back_once(manage_py: Start) -> None:
    members = [steps.value.prepare(i) for i in range(2000)]
    run = batch(members, name="two workers", on_complete=steps.counts.prepare()).enqueue()
    start(manage_py, "wf")
    start(manage_py, "wf")
    status = run.wait(timeout=60)
    assert (status.state, status.completed) == ("completed", 2001)
    callback = run.jobs["on_complete"]
    outcome = callback.wait(timeout=5)
    assert outcome.result["counts"] == {  # type: ignore[index]
        "completed": 2000,
        "failed": 0,
        "cancelled": 0,
        "skipped": 0,
    }
    assert outcome.state == "completed"
