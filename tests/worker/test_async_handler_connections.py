"""The Django connections of async handlers (awa_django/worker/async_orm.py): every ORM call
of the process's async handlers runs on asgiref's one ``sync_to_async`` thread, whose
connections are closed after a job when Django would close them at a request's end. Real
``awa_worker`` subprocesses against real PostgreSQL; waits on database state.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.jobs import common as testjobs
from tests.support.database import pg
from tests.support.polling import wait_for
from tests.support.processes import ManagedProcess
from tests.testapp.models import Ledger

pytestmark = [pytest.mark.worker, pytest.mark.usefixtures("clean_awa")]

Start = Callable[..., ManagedProcess]

_OTHERS = """
SELECT pid FROM pg_stat_activity
WHERE datname = current_database() AND backend_type = 'client backend'
  AND application_name NOT LIKE 'awa:%%' AND pid <> pg_backend_pid()
"""


def _others() -> set[int]:
    with pg() as conn:
        return {row[0] for row in conn.execute(_OTHERS).fetchall()}


def _completed(job_id: int) -> bool:
    with pg() as conn:
        row = conn.execute(
            "SELECT attempt FROM awa.jobs WHERE id = %s AND state = 'completed'", [job_id]
        ).fetchone()
    return row is not None


def _attempts(job_id: int) -> int:
    with pg() as conn:
        row = conn.execute("SELECT attempt FROM awa.jobs WHERE id = %s", [job_id]).fetchone()
    assert row is not None
    return int(row[0])


def test_async_handlers_replace_an_orm_connection_the_server_dropped(manage_py: Start) -> None:
    """With persistent connections (CONN_MAX_AGE), the server dropping the async handlers'
    connection fails at most the job that meets it: the connection is replaced, and every
    later job runs (it used to fail every later async job for good)."""
    Ledger.objects.count()  # this test's own Django connection, opened before the worker's
    before = _others()
    proc = manage_py(
        "awa_worker", "--queue", "work-async", extra_env={"AWA_TEST_CONN_MAX_AGE": "600"}
    )
    first = testjobs.ledger_async.enqueue(0).id
    wait_for(lambda: _completed(first), timeout=30, message=proc.output)
    dropped = _others() - before
    assert dropped, "the worker keeps its async handlers' connection (CONN_MAX_AGE)"
    with pg() as conn:
        for pid in dropped:
            conn.execute("SELECT pg_terminate_backend(%s)", [pid])
    later = []
    for n in range(1, 4):
        job = testjobs.ledger_async.enqueue(n).id
        wait_for(lambda job=job: _completed(job), timeout=30, message=proc.output)
        later.append(job)
    assert [_attempts(job) for job in later[1:]] == [1, 1], proc.output()
    assert Ledger.objects.filter(job_id__in=later).values("job_id").distinct().count() == 3


def test_async_handlers_do_not_keep_a_connection_past_conn_max_age(manage_py: Start) -> None:
    """CONN_MAX_AGE = 0 (Django's default): as after a request, the async handlers'
    connection is closed once their job ends."""
    Ledger.objects.count()
    before = _others()
    proc = manage_py("awa_worker", "--queue", "work-async")
    job = testjobs.ledger_async.enqueue(0).id
    wait_for(lambda: _completed(job), timeout=30, message=proc.output)
    wait_for(
        lambda: not _others() - before,
        timeout=10,
        message=lambda: f"the worker's idle ORM connection to close\n{proc.output()}",
    )
