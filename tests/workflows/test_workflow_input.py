"""Bad workflows are refused with a clear error and nothing written: in Python before any
statement, and in SQL (awa.workflow_enqueue_v1) for raw producers."""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest

from awa_django import Workflow, batch, chain, workflow
from awa_django.exceptions import InvalidOptionError
from awa_django.workflows import MAX_BATCH_MEMBERS, MAX_WORKFLOW_STEPS
from tests.jobs import common as testjobs
from tests.jobs import workflow_steps as steps
from tests.support.database import pg

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("clean_awa")]


def nothing_written() -> bool:
    with pg() as conn:
        row = conn.execute(
            "SELECT (SELECT count(*) FROM awa.workflows) + (SELECT count(*) FROM awa.jobs)"
        ).fetchone()
    return row == (0,)


def test_python_refuses_bad_steps_before_writing() -> None:
    wf, other = workflow("a"), workflow("b")
    theirs = other.add(steps.value.prepare(1))
    mine = wf.add(steps.value.prepare(1), name="mine")
    cases: list[tuple[Any, str]] = [
        (lambda: wf.add(steps.value.prepare(2), after=theirs), "another workflow"),
        (lambda: wf.add(steps.value.prepare(2), after=["mine"]), "must list Steps"),
        (lambda: wf.add(steps.value.prepare(2), name="mine"), "named 'mine' already"),
        (lambda: wf.add(steps.value.prepare(2), name="x\x00"), "control character"),
        (lambda: wf.add(steps.value.prepare(2), name=""), "1 to 200"),
        (lambda: wf.add(steps.value.prepare(2), on_failure="maybe"), "'cancel', 'skip'"),
        (lambda: wf.add({"kind": "x"}), "Job.prepare()"),  # type: ignore[arg-type]
        (lambda: wf.add(steps.value.using(unique=True).prepare(3)), "unique"),
        (lambda: workflow(""), "1 to 200"),
        (lambda: workflow("\ud800"), "lone surrogate"),
        (lambda: workflow("pay\u009b31m"), "control character"),
        (lambda: wf.add(steps.value.prepare(2), name="a\u2028b"), "control character"),
        (lambda: Workflow("w").enqueue(), "at least one step"),
        (lambda: batch([]), "at least one member"),
        (lambda: batch("abc"), "iterable"),  # type: ignore[arg-type]
        (lambda: batch([steps.value.prepare(1)] * (MAX_BATCH_MEMBERS + 1)), "at most 100,000"),
        (lambda: wf.add(testjobs.noop.using(using="other").prepare()), None),
    ]
    for call, text in cases:
        with pytest.raises((InvalidOptionError, Exception)) as caught:
            call()
        if text is not None:
            assert text in str(caught.value), (text, caught.value)
    assert [s.name for s in wf.steps] == ["mine"]
    assert mine.workflow is wf
    wide = Workflow("wide")
    request = steps.value.prepare(1)
    for i in range(MAX_WORKFLOW_STEPS):
        wide.add(request, name=str(i))
    with pytest.raises(InvalidOptionError, match="at most 10,000 steps"):
        wide.add(request)
    assert nothing_written()


def sql_error(conn: psycopg.Connection[Any], spec: Any) -> str:
    with pytest.raises(psycopg.errors.InvalidParameterValue) as caught:
        conn.execute("SELECT * FROM awa.workflow_enqueue_v1(%s::jsonb)", [json.dumps(spec)])
    return str(caught.value)


JOB = {"kind": "k", "queue": "wf"}


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ([], "expected a JSON object"),
        ({"name": "w", "steps": []}, "at least one step"),
        ({"name": "", "steps": [{"job": JOB}]}, "name: must be 1 to 200"),
        ({"name": "w", "steps": [{"job": JOB}], "extra": 1}, "unknown key 'extra'"),
        ({"name": "w", "kind": "dag", "steps": [{"job": JOB}]}, 'kind: must be "workflow"'),
        ({"name": "w", "steps": [1]}, "step 0: must be a JSON object"),
        ({"name": "w", "steps": [{"job": JOB, "x": 1}]}, "step 0: unknown key 'x'"),
        (
            {"name": "w", "steps": [{"job": JOB, "step": "a"}, {"job": JOB, "step": "a"}]},
            "is the name of step 0 too",
        ),
        (
            {"name": "w", "steps": [{"job": JOB, "step": "a", "after": ["a"]}]},
            "cannot wait for itself",
        ),
        (
            {
                "name": "w",
                "steps": [
                    {"job": JOB, "step": "a", "after": ["b"]},
                    {"job": JOB, "step": "b", "after": ["a"]},
                ],
            },
            "'b' is a later step",
        ),
        (
            {"name": "w", "steps": [{"job": JOB, "step": "a", "after": ["zz"]}]},
            "'zz' is not a step of this workflow",
        ),
        (
            {"name": "w", "steps": [{"job": JOB, "step": "a"}, {"job": JOB, "after": ["a", "a"]}]},
            "'a' is listed twice",
        ),
        ({"name": "w", "steps": [{"job": JOB, "after": "*"}]}, '"*" needs an earlier step'),
        ({"name": "w", "steps": [{"job": JOB, "on_failure": "later"}]}, "on_failure: must be"),
        ({"name": "w", "steps": [{"job": {"kind": "k", "priority": 500}}]}, "step 0: priority"),
        (
            {"name": "w", "steps": [{"job": {"kind": "k", "metadata": {"awa:workflow": 1}}}]},
            "reserved",
        ),
        # A waiting step's policy is checked at enqueue, not when its dependency's finalize
        # releases it.
        (
            {
                "name": "w",
                "steps": [
                    {"job": JOB, "step": "a"},
                    {"job": {"kind": "k", "metadata": {"awa:retry": [1]}}, "after": ["a"]},
                ],
            },
            "step 1: metadata: awa:retry: must be a JSON object",
        ),
        ({"name": "pay\u009b", "steps": [{"job": JOB}]}, "name: must not contain control"),
        (
            {"name": "b", "kind": "batch", "steps": [{"job": JOB}, {"job": JOB, "after": ["0"]}]},
            'a batch\'s steps wait for nothing (members) or for "*" (callbacks)',
        ),
        (
            {
                "name": "b",
                "kind": "batch",
                "steps": [{"job": JOB}] + [{"job": JOB, "after": "*"}] * 4,
            },
            "at most 3 callbacks",
        ),
        (
            {"name": "w", "steps": [{"job": JOB}] * (MAX_WORKFLOW_STEPS + 1)},
            "10001 steps exceeds the limit of 10000",
        ),
    ],
)
def test_sql_refuses_bad_workflows(spec: Any, message: str) -> None:
    with pg() as conn:
        assert message in sql_error(conn, spec)
    assert nothing_written()


def test_a_batch_holds_100000_members_and_three_callbacks() -> None:
    with pg() as conn:
        bound = conn.execute("SELECT awa._workflow_max_steps_v1('batch')").fetchone()
    assert bound == (MAX_BATCH_MEMBERS + 3,)


def test_a_chain_of_one_and_names_made_unique() -> None:
    wf = chain(steps.value.prepare(1), steps.value.prepare(2), steps.value.prepare(3))
    assert [s.name for s in wf.steps] == ["value", "value-2", "value-3"]
    run = wf.enqueue()
    assert list(run.jobs) == ["value", "value-2", "value-3"]
