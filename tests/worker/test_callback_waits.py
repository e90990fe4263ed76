"""Waits for callbacks (docs/callbacks.md): extending a wait, early resolution, sequential waits
(WaitForCallback(resume=True)), through the engine's functions and through worker processes."""

from __future__ import annotations

import json
import signal
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from psycopg import errors

import awa_django
from awa_django import InvalidOptionError, WaitForCallback
from awa_django.context import JobContext
from awa_django.db import storage
from awa_django.db.storage import Finalization
from tests.jobs import common as testjobs
from tests.support.callbacks import (
    KEY,
    claimed,
    job_row,
    parked,
    post,
    register,
    scalar,
    status_of,
    wait_item,
)
from tests.support.database import pg
from tests.support.factories import WORKER
from tests.support.polling import wait_for
from tests.support.processes import ManagedProcess
from tests.testapp.models import Ledger

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("clean_awa")]

Start = Callable[..., ManagedProcess]


@pytest.fixture(autouse=True)
def callback_keys(settings: Any) -> None:
    settings.AWA = {**settings.AWA, "CALLBACK_KEYS": [KEY]}


def db_clock_passed(conn: psycopg.Connection[Any], at: Any) -> bool:
    return bool(scalar(conn, "SELECT now() > %s", at))


def timeout_at(conn: psycopg.Connection[Any], job_id: int) -> Any:
    return scalar(conn, "SELECT timeout_at FROM awa.callback_waits WHERE job_id = %s", job_id)


# Extending a wait ----------------------------------------------------------------------------


def test_an_extended_wait_is_not_rescued_at_its_first_timeout() -> None:
    with pg() as conn:
        c, callback = parked(conn, timeout=0.3)
        first = timeout_at(conn, c.job_id)
    assert awa_django.extend_callback(callback, 60) == "extended"
    with pg() as conn:
        moved = timeout_at(conn, c.job_id)
        assert (moved - first).total_seconds() > 50
        wait_for(lambda: db_clock_passed(conn, first), timeout=5, message="the first timeout")
        assert conn.execute("SELECT * FROM awa.rescue_v1(60)").fetchall() == []
        assert job_row(conn, c.job_id)["state"] == "waiting_external"
    assert awa_django.resolve_callback(callback, result="late but fine") == "resolved"
    with pg() as conn:
        assert job_row(conn, c.job_id)["result"] == "late but fine"


def test_an_unextended_wait_is_rescued_at_its_timeout() -> None:
    with pg() as conn:
        c, callback = parked(conn, timeout=0.2, max_attempts=3)
        first = timeout_at(conn, c.job_id)
        wait_for(lambda: db_clock_passed(conn, first), timeout=5, message="the timeout")
        assert conn.execute("SELECT job_id FROM awa.rescue_v1(60)").fetchall() == [(c.job_id,)]
    assert awa_django.extend_callback(callback, 60) == "stale"


def test_extend_callback_outcomes_and_refusals() -> None:
    with pg() as conn:
        c = claimed(conn)
        callback = register(conn, c)
    assert awa_django.extend_callback(callback, 10) == "pending"
    assert awa_django.extend_callback(uuid.uuid4(), 10) == "unknown"
    for bad in (0, -1, float("nan"), float("inf"), True, "60", 1e300):
        with pytest.raises(InvalidOptionError, match="timeout"):
            awa_django.extend_callback(callback, bad)
    with pytest.raises(InvalidOptionError, match="callback_id"):
        awa_django.extend_callback("nope", 10)
    with pg() as conn:
        assert storage.finalize(conn, [wait_item(c, callback, timeout=5)]) == []
    assert awa_django.extend_callback(callback) == "extended"  # by its own 5 s: not later
    with pg() as conn:  # one answer per call; a parked wait's extension is not kept for a park
        kept = "SELECT callback_extend_to FROM awa.attempt_state WHERE job_id = %s"
        before = conn.execute(kept, [c.job_id]).fetchone()
        rows = conn.execute("SELECT * FROM awa.callback_extend_v1(%s, 20)", [callback]).fetchall()
        assert [r[0] for r in rows] == ["extended"]
        assert rows[0][1] == timeout_at(conn, c.job_id)
        assert conn.execute(kept, [c.job_id]).fetchone() == before
    assert awa_django.resolve_callback(callback, result=1) == "resolved"
    assert awa_django.extend_callback(callback, 10) == "stale"
    with pg() as conn, pytest.raises(errors.InvalidParameterValue, match="timeout"):
        conn.execute("SELECT * FROM awa.callback_extend_v1(gen_random_uuid(), 'NaN')")


def test_extend_callback_joins_the_callers_transaction() -> None:
    from django.db import transaction

    with pg() as conn:
        c, callback = parked(conn, timeout=30)
        before = timeout_at(conn, c.job_id)
    with transaction.atomic():
        assert awa_django.extend_callback(callback, 3600) == "extended"
        transaction.set_rollback(True)
    with pg() as conn:
        assert timeout_at(conn, c.job_id) == before


# Sequential waits, engine level ----------------------------------------------------------------


def test_a_result_resumes_a_resume_wait_keeping_progress_and_the_attempt_count() -> None:
    with pg() as conn:
        c, callback = parked(conn, resume=True, progress={"percent": 33, "metadata": {"step": 1}})
        assert scalar(conn, "SELECT resume FROM awa.callback_waits WHERE job_id = %s", c.job_id)
    assert awa_django.resolve_callback(callback, result={"signed": True}) == "resolved"
    with pg() as conn:
        job = job_row(conn, c.job_id)
        assert job["state"] in ("scheduled", "available")
        assert job["metadata"]["awa:callback"] == {"id": str(callback), "result": {"signed": True}}
        assert job["progress"] == {"percent": 33, "metadata": {"step": 1}}
        assert job["errors"] in (None, [])
        assert storage.promote(conn) == 1
        [again] = storage.claim(conn, "cb-test", 1, WORKER)
    assert (again.job_id, again.attempt, again.run_lease) == (c.job_id, 1, c.run_lease + 1)
    ctx = JobContext.for_job(again)
    assert ctx.callback_result == {"signed": True}
    assert ctx.resumed_callback_id == callback
    assert ctx.progress == {"percent": 33, "metadata": {"step": 1}}
    # The old callback is spent.
    assert awa_django.resolve_callback(callback, result=2) == "stale"


def test_an_error_of_a_resume_wait_retries_it_and_a_timeout_is_rescued() -> None:
    with pg() as conn:
        c, callback = parked(conn, resume=True, max_attempts=3)
    assert awa_django.resolve_callback(callback, error="declined") == "resolved"
    with pg() as conn:
        job = job_row(conn, c.job_id)
        assert job["state"] == "retryable" and "awa:callback" not in (job["metadata"] or {})
        c2, _ = parked(conn, resume=True, timeout=0.1, max_attempts=3)
        first = timeout_at(conn, c2.job_id)
        wait_for(lambda: db_clock_passed(conn, first), timeout=5, message="the timeout")
        assert conn.execute("SELECT job_id FROM awa.rescue_v1(60)").fetchall() == [(c2.job_id,)]
        assert job_row(conn, c2.job_id)["errors"][-1]["message"] == "callback timed out"


def test_a_result_before_the_park_resumes_the_wait_at_once() -> None:
    with pg() as conn:
        c = claimed(conn)
        callback = register(conn, c)
    early = post(callback, {"result": "early"})
    assert status_of(early) == (202, "accepted")
    with pg() as conn:
        item = wait_item(c, callback, resume=True, progress={"percent": 50})
        assert storage.finalize(conn, [item]) == []
        job = job_row(conn, c.job_id)
        assert job["state"] in ("scheduled", "available")
        assert job["metadata"]["awa:callback"]["result"] == "early"
        assert job["progress"] == {"percent": 50}
        assert scalar(conn, "SELECT count(*) FROM awa.callback_waits") == 0
        # The same batch again (a reconnect that lost the reply): stale, nothing twice.
        assert storage.finalize(conn, [item]) == [(c.job_id, c.run_lease)]
        assert scalar(conn, "SELECT count(*) FROM awa.deferred_jobs") == 1
    # A later resolution of the spent callback is refused.
    assert status_of(post(callback, {"result": "again"})) == (409, "conflict")
    assert awa_django.resolve_callback(callback, result="again") == "stale"


def test_an_early_error_of_a_resume_wait_retries_it() -> None:
    with pg() as conn:
        c = claimed(conn, max_attempts=3)
        callback = register(conn, c)
    assert awa_django.resolve_callback(callback, error="no") == "resolved"
    with pg() as conn:
        assert storage.finalize(conn, [wait_item(c, callback, resume=True)]) == []
        assert job_row(conn, c.job_id)["state"] == "retryable"


def test_a_batch_mixing_resumes_parks_and_completions_is_one_statement() -> None:
    with pg() as conn:
        a = claimed(conn)
        cb_a = register(conn, a)
        b = claimed(conn)
        cb_b = register(conn, b)
        d = claimed(conn)
    assert awa_django.resolve_callback(cb_a, result="a") == "resolved"
    with pg() as conn:
        batch = [
            wait_item(a, cb_a, resume=True),
            wait_item(b, cb_b, resume=True, timeout=30),
            Finalization(d.job_id, d.run_lease, d.claim_slot, "completed", result_json="4"),
        ]
        assert storage.finalize(conn, batch) == []
        assert job_row(conn, a.job_id)["metadata"]["awa:callback"]["result"] == "a"
        assert job_row(conn, b.job_id)["state"] == "waiting_external"
        assert job_row(conn, d.job_id)["result"] == 4
        row = conn.execute(
            "SELECT callback_resume, callback_timeout FROM awa.attempt_state WHERE job_id = %s",
            [b.job_id],
        ).fetchone()
        assert row == (True, 30.0)


def test_finalize_v3_refuses_a_resume_that_is_not_a_bool() -> None:
    with pg() as conn:
        c = claimed(conn)
        callback = register(conn, c)
        item = {**wait_item(c, callback).to_value(), "resume": "yes"}
        with pytest.raises(errors.InvalidParameterValue, match="resume"):
            conn.execute("SELECT * FROM awa.finalize_v3(%s::jsonb)", [json.dumps([item])])
    with pytest.raises(InvalidOptionError, match="resume"):
        WaitForCallback(callback, resume=1)  # type: ignore[arg-type]


def test_context_reads_the_resuming_callback_from_metadata_only() -> None:
    callback = uuid.uuid4()

    def ctx(metadata: Any) -> JobContext:
        return JobContext(
            job_id=1,
            run_lease=1,
            attempt=1,
            max_attempts=1,
            queue="q",
            kind="k",
            deadline_at=None,
            progress=None,
            metadata=metadata,
        )

    assert ctx(None).callback_result is None and ctx(None).resumed_callback_id is None
    resumed = ctx({"awa:callback": {"id": str(callback), "result": [1]}})
    assert resumed.callback_result == [1] and resumed.resumed_callback_id == callback
    odd = ctx({"awa:callback": {"id": "not a uuid", "result": None}})
    assert odd.resumed_callback_id is None
    assert ctx({"awa:callback": "garbage"}).callback_result is None


# Through worker processes ----------------------------------------------------------------------


def _steps_recorded(job_id: int) -> list[str]:
    return list(Ledger.objects.filter(job_id=job_id).order_by("id").values_list("note", flat=True))


def _callback_of_step(job_id: int, step: int) -> str:
    notes = wait_for(
        lambda: [n for n in _steps_recorded(job_id) if n.startswith(f"step {step}:")],
        timeout=20,
        message=f"step {step} to wait",
    )
    return notes[0].split(": ", 1)[1]


def _state(job_id: int) -> str:
    with pg() as conn:
        return str(job_row(conn, job_id)["state"])


def test_three_sequential_waits_resume_the_same_job_with_each_result(manage_py: Start) -> None:
    job_id = testjobs.three_steps.enqueue("order-7").id
    proc = manage_py("awa_worker", "--queue", "cb-steps")

    def parked_at(step: int) -> str:
        callback = _callback_of_step(job_id, step)
        wait_for(
            lambda: _state(job_id) == "waiting_external",
            timeout=20,
            message=lambda: f"step {step} to park; output:\n{proc.output()}",
        )
        return callback

    first = parked_at(1)
    assert status_of(post(first, {"heartbeat": True, "timeout": 120})) == (200, "extended")
    assert status_of(post(first, {"result": {"paid": True}})) == (200, "resolved")
    second = parked_at(2)
    with pg() as conn:
        progress = job_row(conn, job_id)["progress"]
    assert progress["metadata"] == {"step": 2, "results": [{"paid": True}]}
    assert awa_django.resolve_callback(second, result="shipped") == "resolved"
    third = parked_at(3)
    assert len({first, second, third}) == 3
    assert status_of(post(third, {"result": 3})) == (200, "resolved")
    wait_for(
        lambda: _state(job_id) == "completed",
        timeout=20,
        message=lambda: f"the last step; output:\n{proc.output()}",
    )
    with pg() as conn:
        job = job_row(conn, job_id)
    assert job["result"] == {
        "order": "order-7",
        "results": [{"paid": True}, "shipped", 3],
        "attempt": 1,
    }
    assert job["errors"] in (None, []) and job["progress"] is None
    # One run per step, each its own attempt lease, none of them a retry.
    leases = list(
        Ledger.objects.filter(job_id=job_id).order_by("id").values_list("run_lease", "attempt")
    )
    assert [a for _, a in leases] == [1, 1, 1]
    assert len({lease for lease, _ in leases}) == 3
    # Every spent callback is refused.
    assert status_of(post(first, {"result": {"paid": True}})) == (200, "resolved")  # a replay
    assert status_of(post(first, {"result": "other"})) == (409, "conflict")
    assert awa_django.resolve_callback(second, result="again") == "stale"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(20) == 0


def test_a_result_sent_before_the_handler_returns_resumes_it(manage_py: Start) -> None:
    job_id = testjobs.early_resume.enqueue().id
    proc = manage_py("awa_worker", "--queue", "cb-steps")
    wait_for(
        lambda: _state(job_id) == "completed",
        timeout=30,
        message=lambda: f"the resumed run; output:\n{proc.output()}",
    )
    with pg() as conn:
        assert job_row(conn, job_id)["result"] == {"got": "early"}
    assert _steps_recorded(job_id) == ["first", "resumed"]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(20) == 0


def test_the_testing_helper_parks_a_resume_wait_as_one() -> None:
    from awa_django.testing import drain

    job_id = testjobs.three_steps.enqueue("drained").id
    [run] = drain("cb-steps")
    assert (run.id, run.outcome) == (job_id, "wait")
    with pg() as conn:
        assert scalar(conn, "SELECT resume FROM awa.callback_waits WHERE job_id = %s", job_id)
