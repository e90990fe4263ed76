"""The admin's workflows page (docs/workflows.md, "In the admin"): the list with each
workflow's state and progress, its page with the steps drawn as an SVG graph linked to their
jobs, and the actions (cancel a workflow, retry its dead-lettered steps), which need
``manage_workflow``."""

from __future__ import annotations

import pytest
from django.db import connection

from awa_django import workflow
from awa_django.testing import drain
from tests.jobs import workflow_steps as steps
from tests.support.admin_client import confirmed, messages_of, post_action
from tests.support.factories import HOSTILE, staff

pytestmark = pytest.mark.django_db

URL = "/admin/awa_django/workflowrecord/"


def test_the_page_draws_the_steps_and_links_each_to_its_job() -> None:
    wf = workflow(HOSTILE)
    a = wf.add(steps.value.prepare(1), name="first")
    b = wf.add(steps.boom.prepare(), name=HOSTILE)
    wf.add(steps.total.prepare(), after=[a, b], name="last")
    run = wf.enqueue()
    drain()  # first completes, the hostile one is dead-lettered, last waits
    listing = staff().get(URL).content.decode()
    assert HOSTILE not in listing and "&lt;script&gt;" in listing
    assert "2 of 3 steps ended" not in listing and "1 of 3 steps ended, 1 completed" in listing
    page = staff().get(f"{URL}{run.id}/change/").content.decode()
    assert "<svg" in page and HOSTILE not in page
    for name, job in run.jobs.items():
        assert f"?id={job.id}" in page, name
    assert "dead lettered" in page and "waiting" in page and "completed" in page
    assert page.count("<line ") == 2


def test_cancel_and_retry_need_the_permission_and_act_on_the_workflow() -> None:
    wf = workflow("held")
    a = wf.add(steps.boom.prepare(), name="a")
    wf.add(steps.value.prepare(1), after=a, name="b")
    run = wf.enqueue()
    drain()
    assert post_action(staff(), "workflowrecord", "retry_workflows", [run.id]).status_code == 403
    _, done = confirmed(
        staff("manage_workflow"), "workflowrecord", "retry_workflows", [run.id], confirm="yes"
    )
    assert "retried 1 step(s)" in " ".join(messages_of(done))
    _, done = confirmed(
        staff("manage_workflow"), "workflowrecord", "cancel_workflows", [run.id], confirm="yes"
    )
    assert "cancelled 2 step(s)" in " ".join(messages_of(done))
    with connection.cursor() as cursor:
        cursor.execute("SELECT state, cancelled FROM awa.workflow_v1(%s)", [run.id])
        assert cursor.fetchone() == ("failed", 2)
