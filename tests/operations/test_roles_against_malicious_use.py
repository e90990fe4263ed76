"""Hostile tests of the least-privilege roles (docs/roles.md): what a malicious app or a
read-only operator role can do to the system without any table privilege.

Each test states the expected (documented or implied) behaviour; a failure is a finding.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from django.core.management import CommandError, call_command
from psycopg import sql

from tests.jobs import common as testjobs
from tests.support.database import conninfo, pg
from tests.support.polling import wait_for
from tests.support.processes import ManagedProcess
from tests.testapp.models import Ledger

pytestmark = pytest.mark.django_db(transaction=True)

Start = Callable[..., ManagedProcess]
ROLES = {
    "app": "atk19_app",
    "worker": "atk19_worker",
    "maintenance": "atk19_maint",
    "operator": "atk19_ops",
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
        "--app",
        ROLES["app"],
        "--worker",
        ROLES["worker"],
        "--maintenance",
        ROLES["maintenance"],
        "--operator",
        ROLES["operator"],
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


def schema_owner() -> str:
    with pg() as conn:
        row = conn.execute(
            "SELECT pg_get_userbyid(nspowner) FROM pg_namespace WHERE nspname = 'awa'"
        ).fetchone()
    assert row is not None
    return str(row[0])


# --- Finding 1: the maintenance leader lock is an unprivileged advisory lock ----------------


def test_a_read_only_operator_cannot_keep_the_maintenance_leadership_from_everyone(
    locked_down: Callable[[str], psycopg.Connection[Any]],
) -> None:
    # Holding the leader's advisory lock needs no privilege by default: while it is held no
    # worker or awa_maintenance ever becomes leader. With --lock-advisory the operator (and the
    # app) can no longer take it; the maintenance role still can.
    ops = locked_down("operator")
    ops.execute("SET application_name = 'awa:worker:00000000-0000-0000-0000-000000000000'")
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        ops.execute("SELECT pg_try_advisory_lock(%s)", [LEADER_KEY])
    maint = locked_down("maintenance")
    got = maint.execute("SELECT pg_try_advisory_lock(%s)", [LEADER_KEY]).fetchone()
    assert got == (True,)


# --- Finding 2: lane locks are unprivileged advisory locks ---------------------------------


def test_a_read_only_operator_cannot_stall_every_enqueue_into_a_queue(
    locked_down: Callable[[str], psycopg.Connection[Any]],
) -> None:
    app = locked_down("app")
    app.execute("SELECT awa.ensure_lanes_v1('victim', 0)")
    ops = locked_down("operator")
    lanes = [
        r[0]
        for r in ops.execute(
            "SELECT lane_id FROM awa.queue_lanes WHERE queue = 'victim' AND priority = 0"
        ).fetchall()
    ]
    assert lanes
    for who in ("operator", "app"):
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            locked_down(who).execute("SELECT pg_advisory_lock(%s, %s)", [LANE_LOCK, lanes[0]])
    # The app enqueues all the same: its locks are taken inside the entry point, as the owner.
    row = app.execute(
        "SELECT state FROM awa.enqueue_one_v2('k', 'victim', 0, %s::jsonb, 3)", [ARGS]
    ).fetchone()
    assert row == ("available",)


# --- Finding 3: flow-control permits are unprivileged advisory locks -----------------------


def test_a_read_only_operator_cannot_take_a_queues_flow_permits(
    locked_down: Callable[[str], psycopg.Connection[Any]],
) -> None:
    ops = locked_down("operator")
    (key,) = ops.execute("SELECT awa._flow_key_v1('limited', 0)").fetchone() or (None,)
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        ops.execute("SELECT pg_try_advisory_lock(%s, %s)", [FLOW_LOCK, key])
    worker = locked_down("worker")
    # A worker of queue "limited" with max_running = 1 asks for its one permit.
    row = worker.execute("SELECT awa._flow_take_v1('limited', 1, NULL, 1, '{}')").fetchone()
    keys = row[0] if row else None
    assert keys, "the worker role keeps the advisory-lock functions"


# --- Finding 4: NOTIFY awa_cancel from any role stops a running handler ---------------------


def test_a_read_only_operator_cannot_make_a_running_handler_stop(
    as_role: Callable[[str], psycopg.Connection[Any]], manage_py: Start
) -> None:
    job = testjobs.slow_sync.enqueue(4)
    proc = manage_py("awa_worker", "--queue", "slow")
    try:
        ops = as_role("operator")

        def lease() -> Any:
            row = ops.execute(
                "SELECT run_lease FROM awa.jobs WHERE id = %s AND state = 'running'", [job.id]
            ).fetchone()
            return row[0] if row else None

        wait_for(lambda: lease() is not None, timeout=20, message=lambda: proc.output())
        payload = json.dumps({"id": job.id, "lease": lease()})
        ops.execute("SELECT pg_notify('awa_cancel', %s)", [payload])
        wait_for(
            lambda: (
                ops.execute("SELECT state FROM awa.jobs WHERE id = %s", [job.id]).fetchone()
                == ("completed",)
            ),
            timeout=30,
            message=lambda: proc.output(),
        )
        assert not Ledger.objects.filter(job_id=job.id, note="saw-cancel").exists(), (
            "a NOTIFY from the read-only operator role told the handler it was cancelled"
        )
    finally:
        proc.send_signal(signal.SIGTERM)


# --- Finding 5: awa_roles accepts the schema owner, or one role in two blocks ---------------


def test_awa_roles_refuses_the_schema_owner_as_the_app_role(clean_awa: None) -> None:
    # The app block revokes ALL on every awa table and CREATE on the schema from the role it
    # names: named the owner, it takes the owner's own privileges away, and every SECURITY
    # DEFINER entry point (which runs as the owner) then fails for every role.
    with pytest.raises(CommandError):
        call_command("awa_roles", "--print-sql", "--app", schema_owner())


def test_awa_roles_refuses_one_role_for_two_kinds(clean_awa: None) -> None:
    # --app x --operator x: the operator block revokes EXECUTE the app block granted; the
    # last block silently wins. A role for two kinds is a mistake the command should name.
    _create_roles()
    with pytest.raises(CommandError):
        call_command("awa_roles", "--print-sql", "--app", ROLES["app"], "--operator", ROLES["app"])


# --- Finding 6: a caller-chosen backoff base moves a retry into the past --------------------


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


# --- Finding 7: a malformed awa.xact_lanes (session state) breaks every later enqueue ---------


@pytest.mark.parametrize("forged", ["x", "99999999999", "1,,2", "NaN"])
def test_a_malformed_lane_record_does_not_break_enqueues(
    as_role: Callable[[str], psycopg.Connection[Any]], forged: str
) -> None:
    # docs/roles.md: "Caller state they read is not trusted". A session-level value (behind
    # PgBouncer transaction pooling: left on a server connection by one client, inherited by
    # every client lent that connection afterwards) makes every enqueue fail with a cast error.
    app = as_role("app")
    app.execute("SELECT set_config('awa.xact_lanes', %s, false)", [forged])
    row = app.execute(
        "SELECT state FROM awa.enqueue_one_v2('k', 'default', 0, %s::jsonb, 3)", [ARGS]
    ).fetchone()
    assert row == ("available",)
    rows = app.execute('SELECT state FROM awa.enqueue_v1(\'[{"kind": "k"}]\')').fetchall()
    assert rows == [("available",)]


def test_awa_roles_refuses_an_owner_that_does_not_own_the_schema(clean_awa: None) -> None:
    # --owner names the migration owner; once the awa schema exists it has one. Naming another
    # role (a typo: --owner shop_app) prints GRANT CONNECT, CREATE ON DATABASE to it (the app
    # could then create schemas, e.g. one named like the worker role, first in its search_path)
    # and default privileges for a role that never creates awa objects.
    _create_roles()
    assert schema_owner() != ROLES["app"]
    with pytest.raises(CommandError):
        call_command("awa_roles", "--print-sql", "--owner", ROLES["app"], "--app", ROLES["app"])
