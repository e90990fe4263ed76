"""What a least-privilege role can still reach without any table privilege (docs/roles.md):
PostgreSQL's advisory locks and notifications, session settings, and the inputs of the
functions it may call. None of them lets the application or a reader stall or mislead the
queue; ``awa_roles --lock-advisory`` takes the advisory locks from everyone but the owner and
the maintenance role.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from django.core.management import call_command
from psycopg import sql

from tests.jobs import common as testjobs
from tests.support.database import conninfo, pg
from tests.support.polling import wait_for
from tests.support.processes import ManagedProcess
from tests.testapp.models import Ledger

pytestmark = pytest.mark.django_db(transaction=True)

Start = Callable[..., ManagedProcess]
ROLES = {
    "app": "awa_locks_app",
    "worker": "awa_locks_worker",
    "maintenance": "awa_locks_maint",
    "operator": "awa_locks_ops",
    "reader": "awa_locks_reader",
}
LEADER_KEY = 4708303813012965710  # awa_django/sql/queries/storage.sql, leader_try
LANE_LOCK = 4282177  # awa._lane_for_v1
FLOW_LOCK = 4282182  # awa._flow_take_v1
ARGS = '{"args": [], "kwargs": {}}'


def _create_roles() -> None:
    with pg() as conn:
        for name in ROLES.values():
            conn.execute(
                sql.SQL(
                    "DO $$BEGIN IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = {n}) "
                    "THEN CREATE ROLE {i} LOGIN; END IF; END$$"
                ).format(n=sql.Literal(name), i=sql.Identifier(name))
            )


def _roles(*extra: str) -> Iterator[Callable[[str], psycopg.Connection[Any]]]:
    """Connections as the roles the script grants (``awa_roles --apply`` with ``extra``)."""
    _create_roles()
    call_command(
        "awa_roles",
        "--apply",
        *[arg for kind, name in ROLES.items() for arg in (f"--{kind}", name)],
        *extra,
    )
    opened: list[psycopg.Connection[Any]] = []

    def connect(kind: str) -> psycopg.Connection[Any]:
        conn = psycopg.connect(conninfo(), user=ROLES[kind], autocommit=True)
        opened.append(conn)
        return conn

    yield connect
    for conn in opened:
        conn.close()


@pytest.fixture
def as_role(clean_awa: None) -> Iterator[Callable[[str], psycopg.Connection[Any]]]:
    yield from _roles()


@pytest.fixture
def locked_down(clean_awa: None) -> Iterator[Callable[[str], psycopg.Connection[Any]]]:
    """As ``as_role``, with ``--lock-advisory`` (docs/roles.md); PUBLIC gets the advisory-lock
    functions back afterwards (the test database serves the other tests' roles too)."""
    from awa_django.sql import roles_blocks

    try:
        yield from _roles("--lock-advisory")
    finally:
        functions = "\n".join(
            line
            for line in roles_blocks()["advisory_functions"].splitlines()
            if not line.startswith("--")
        )
        with pg() as conn:
            conn.execute(f"GRANT EXECUTE ON {functions} TO PUBLIC")


# Advisory locks ----------------------------------------------------------------------------


def test_with_lock_advisory_only_the_maintenance_role_may_take_the_leaders_lock(
    locked_down: Callable[[str], psycopg.Connection[Any]],
) -> None:
    # Holding the leader's advisory lock needs no privilege by default: while it is held no
    # worker or awa_maintenance ever becomes leader. With --lock-advisory the reader, the
    # operator, the app and the worker can no longer take it; the maintenance role still can.
    for kind in ("reader", "operator", "app", "worker"):
        conn = locked_down(kind)
        conn.execute("SET application_name = 'awa:worker:00000000-0000-0000-0000-000000000000'")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SELECT pg_try_advisory_lock(%s)", [LEADER_KEY])
    maint = locked_down("maintenance")
    got = maint.execute("SELECT pg_try_advisory_lock(%s)", [LEADER_KEY]).fetchone()
    assert got == (True,)


def test_with_lock_advisory_no_reader_or_app_can_stall_the_enqueues_of_a_queue(
    locked_down: Callable[[str], psycopg.Connection[Any]],
) -> None:
    app = locked_down("app")
    app.execute("SELECT awa.ensure_lanes_v1('victim', 0)")
    lanes = [
        r[0]
        for r in locked_down("reader").execute(
            "SELECT lane_id FROM awa.queue_lanes WHERE queue = 'victim' AND priority = 0"
        )
    ]
    assert lanes
    for who in ("reader", "app"):
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            locked_down(who).execute("SELECT pg_advisory_lock(%s, %s)", [LANE_LOCK, lanes[0]])
    # The app enqueues all the same: its locks are taken inside the function, as the owner.
    row = app.execute(
        "SELECT state FROM awa.enqueue_one_v2('k', 'victim', 0, %s::jsonb, 3)", [ARGS]
    ).fetchone()
    assert row == ("available",)


def test_with_lock_advisory_flow_permits_are_taken_inside_the_claim_only(
    locked_down: Callable[[str], psycopg.Connection[Any]],
) -> None:
    from awa_django.db import storage
    from tests.support.factories import WORKER

    with pg() as owner:
        owner.execute("SELECT awa.flow_set_v1('limited', 1, NULL, NULL, 'test', false)")
        (key,) = owner.execute("SELECT awa._flow_key_v1('limited', 0)").fetchone() or (None,)
    for who in ("reader", "worker"):
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            locked_down(who).execute("SELECT pg_try_advisory_lock(%s, %s)", [FLOW_LOCK, key])
    locked_down("app").execute(
        'SELECT * FROM awa.enqueue_v1(\'[{"kind": "k", "queue": "limited"}]\')'
    )
    # A worker of queue "limited" (max_running = 1) claims: the claim takes the permit.
    [claimed] = storage.claim(locked_down("worker"), "limited", 5, WORKER)
    assert claimed.permits


# Notifications -----------------------------------------------------------------------------


def test_a_cancel_note_from_a_reader_does_not_stop_a_running_handler(
    as_role: Callable[[str], psycopg.Connection[Any]], manage_py: Start
) -> None:
    # Any role may NOTIFY awa_cancel; the worker acts on a note only once the database says
    # the attempt was closed.
    job = testjobs.slow_sync.enqueue(4)
    proc = manage_py("awa_worker", "--queue", "slow")
    try:
        reader = as_role("reader")

        def lease() -> Any:
            row = reader.execute(
                "SELECT run_lease FROM awa.jobs WHERE id = %s AND state = 'running'", [job.id]
            ).fetchone()
            return row[0] if row else None

        wait_for(lambda: lease() is not None, timeout=20, message=lambda: proc.output())
        payload = json.dumps({"id": job.id, "lease": lease()})
        reader.execute("SELECT pg_notify('awa_cancel', %s)", [payload])
        wait_for(
            lambda: (
                reader.execute("SELECT state FROM awa.jobs WHERE id = %s", [job.id]).fetchone()
                == ("completed",)
            ),
            timeout=30,
            message=lambda: proc.output(),
        )
        assert not Ledger.objects.filter(job_id=job.id, note="saw-cancel").exists(), (
            "a NOTIFY from the reader role told the handler it was cancelled"
        )
    finally:
        proc.send_signal(signal.SIGTERM)


# Inputs and session settings ---------------------------------------------------------------


def test_an_app_role_cannot_resolve_a_callback_into_a_retry_in_the_past(
    as_role: Callable[[str], psycopg.Connection[Any]],
) -> None:
    from tests.support.callbacks import job_row, parked

    with pg() as conn:
        c, callback = parked(conn)
    app = as_role("app")
    try:
        row = app.execute(
            'SELECT outcome FROM awa.callback_resolve_v2(%s, NULL, \'{"message": "x"}\', '
            "false, -100000000)",
            [callback],
        ).fetchone()
    except psycopg.errors.InvalidParameterValue:
        return  # refused: fine
    assert row == ("resolved",)
    with pg() as conn:
        job = job_row(conn, c.job_id)
        now = conn.execute("SELECT now()").fetchone()
    assert now is not None
    assert job["state"] == "retryable"
    assert job["run_at"] >= now[0], f"a negative backoff base put the retry at {job['run_at']}"


@pytest.mark.parametrize("forged", ["x", "99999999999", "1,,2", "NaN"])
def test_a_malformed_lane_record_does_not_break_enqueues(
    as_role: Callable[[str], psycopg.Connection[Any]], forged: str
) -> None:
    # A session-level value (behind PgBouncer transaction pooling: left on a server connection
    # by one client, inherited by every client lent that connection afterwards) must not make
    # every enqueue fail with a cast error.
    app = as_role("app")
    app.execute("SELECT set_config('awa.xact_lanes', %s, false)", [forged])
    row = app.execute(
        "SELECT state FROM awa.enqueue_one_v2('k', 'default', 0, %s::jsonb, 3)", [ARGS]
    ).fetchone()
    assert row == ("available",)
    rows = app.execute('SELECT state FROM awa.enqueue_v1(\'[{"kind": "k"}]\')').fetchall()
    assert rows == [("available",)]
