"""Workflows run in-process (awa_django.testing.drain, inside the test's transaction): steps
wait for their dependencies, results flow downstream, failures follow each step's policy."""

from __future__ import annotations

import pytest
from django.db import connection

from awa_django import batch, chain, chord, group, workflow
from awa_django.testing import drain
from tests.jobs import workflow_steps as steps

pytestmark = pytest.mark.django_db


def states(run) -> dict[str, str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT step, state FROM awa.workflow_steps_v1(%s)", [run.id])
        return dict(cursor.fetchall())


def test_a_step_waits_for_its_dependencies_and_reads_their_results() -> None:
    wf = workflow("checkout")
    a = wf.add(steps.value.prepare(2), name="a")
    b = wf.add(steps.value.prepare(3), name="b")
    wf.add(steps.total.prepare(extra=10), after=[a, b], name="sum")
    run = wf.enqueue()
    assert {n: j.state for n, j in run.jobs.items()} == {
        "a": "available",
        "b": "available",
        "sum": "scheduled",
    }
    assert states(run)["sum"] == "waiting"
    ran = [r.kind.rsplit(".", 1)[-1] for r in drain()]
    assert ran == ["value", "value", "total"]
    status = run.status()
    assert (status.state, status.completed, status.finished) == ("completed", 3, True)
    assert run.results() == {"sum": 15}


def test_chain_group_and_chord() -> None:
    c = chain(steps.value.prepare(1), steps.total.prepare(extra=1), steps.total.prepare())
    g = group(steps.value.prepare(1), steps.value.prepare(2))
    d = chord([steps.value.prepare(4), steps.value.prepare(5)], steps.total.prepare())
    runs = [c.enqueue(), g.enqueue(), d.enqueue()]
    drain()
    assert runs[0].results() == {"total-2": 2}
    assert runs[1].results() == {"value": 1, "value-2": 2}
    assert runs[2].results() == {"total": 9}


def test_a_failed_dependency_cancels_skips_or_runs_its_dependents() -> None:
    wf = workflow("policies")
    bad = wf.add(steps.boom.prepare(), name="bad")
    ok = wf.add(steps.value.prepare(7), name="ok")
    cancelled = wf.add(steps.value.prepare(1), after=bad, name="cancelled")
    wf.add(steps.value.prepare(1), after=cancelled, name="after-cancelled")
    skipped = wf.add(steps.value.prepare(1), after=bad, name="skipped", on_failure="skip")
    wf.add(steps.total.prepare(), after=[skipped, ok], name="after-skipped")
    wf.add(steps.seen.prepare(), after=[bad, ok], name="anyway", on_failure="run")
    with connection.cursor() as cursor:
        cursor.execute("SELECT awa.queue_dlq_v1('wf', false)")
    run = wf.enqueue()
    drain()
    assert states(run) == {
        "bad": "failed",
        "ok": "completed",
        "cancelled": "cancelled",
        "after-cancelled": "cancelled",
        "skipped": "skipped",
        "after-skipped": "completed",
        "anyway": "completed",
    }
    assert run.results(["after-skipped", "anyway"]) == {
        "after-skipped": 7,
        "anyway": {"states": {"bad": "failed", "ok": "completed"}, "results": {"ok": 7}},
    }
    status = run.status()
    assert (status.state, status.failed, status.cancelled, status.skipped) == ("failed", 1, 2, 1)


def test_a_dead_lettered_step_holds_its_workflow_until_retried() -> None:
    wf = workflow("held")
    a = wf.add(steps.boom.prepare(), name="a")
    wf.add(steps.value.prepare(1), after=a, name="b")
    run = wf.enqueue()
    drain()
    assert states(run) == {"a": "dead_lettered", "b": "waiting"}
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM awa.workflow_retry_v1(%s)", [run.id])
        assert cursor.fetchone()[0] == 1
    drain()  # fails again: dead-lettered again
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM awa.dlq_purge_v1(ARRAY[%s]::bigint[])", [run.jobs["a"].id]
        )
    assert states(run) == {"a": "gone", "b": "cancelled"}
    assert run.status().state == "failed"


def test_a_batch_calls_back_once_with_its_counts() -> None:
    members = [steps.value.prepare(i) for i in range(5)] + [steps.boom.prepare()]
    with connection.cursor() as cursor:
        cursor.execute("SELECT awa.queue_dlq_v1('wf', false)")
    run = batch(
        members,
        on_complete=steps.counts.prepare(),
        on_success=steps.counts.prepare(),
        on_failure=steps.counts.prepare(),
    ).enqueue()
    drain()
    result = run.results(["on_complete", "on_failure"])
    expected = {"completed": 5, "failed": 1, "cancelled": 0, "skipped": 0}
    assert result["on_complete"]["counts"] == expected
    assert result["on_failure"]["step"] == "on_failure"
    assert states(run)["on_success"] == "skipped"
    assert run.status().state == "failed"


def test_awa_job_show_names_the_workflow_and_the_operator_reads_it() -> None:
    import io
    import json

    from django.core.management import call_command

    from awa_django import operator

    run = chain(steps.value.prepare(1), steps.value.prepare(2), name="shown").enqueue()
    out = io.StringIO()
    call_command("awa_job", "show", str(run.jobs["value-2"].id), stdout=out)
    shown = json.loads(out.getvalue())
    assert shown["state"] == "scheduled"
    assert shown["workflow"] == {
        "workflow_id": run.id,
        "name": "shown",
        "kind": "workflow",
        "step": "value-2",
    }
    assert [(s.step, s.state) for s in operator.workflow_steps(run.id)] == [
        ("value", "available"),
        ("value-2", "waiting"),
    ]
    assert operator.workflow_counts()[("workflow", "running")] >= 1
    assert operator.workflows("running")[0].id == run.id


def test_results_over_the_bound_are_refused_and_read_one_at_a_time(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from awa_django import context

    monkeypatch.setattr(context, "_UPSTREAM_MAX_BYTES", 40)
    wf = workflow("large results")
    parts = [wf.add(steps.value.prepare("x" * 30), name=f"p{i}") for i in range(3)]
    wf.add(steps.total.prepare(), after=parts, name="all at once")
    wf.add(steps.one_by_one.prepare(), after=parts, name="one by one")
    run = wf.enqueue()
    runs = {r.id: r for r in drain()}
    refused = runs[run.jobs["all at once"].id]
    assert refused.outcome != "completed"
    assert "upstream: the results of 3 dependencies take" in str(refused.error)
    assert run.results(["one by one"]) == {"one by one": ["x" * 30] * 3}


def test_default_names_skip_names_taken_explicitly() -> None:
    wf = workflow("names")
    wf.add(steps.value.prepare(1), name="value-2")
    names = [wf.add(steps.value.prepare(i)).name for i in range(3)]
    assert names == ["value", "value-3", "value-4"]
    a = wf.steps[0]
    assert wf.add(steps.total.prepare(), after=[a, a, a]).name == "total"
