"""Least-privilege roles (issue 19, docs/roles.md): what each role of ``manage.py awa_roles`` can
and cannot do, on a database of its own migrated by a non-superuser owner.

The module creates five LOGIN roles (owner, app, worker, maintenance, operator) and a database
owned by the owner, migrates it as the owner (a subprocess), applies ``awa_roles --apply`` as the
owner, then connects as each role (a real login, trust authentication on the test server) and
proves what it may and may not do. Everything is dropped at the end. It needs a superuser
connection to create roles and databases; without one it is skipped.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from io import StringIO
from typing import Any

import psycopg
import pytest
from django.core.management import CommandError, call_command
from psycopg import errors, sql

from awa_django.db import storage
from awa_django.db.roles import ROLE_KINDS
from awa_django.db.storage import Finalization
from tests.support.factories import WORKER
from tests.support.processes import REPO

_TIMEOUT = 180


@dataclass(frozen=True)
class RolesDB:
    """The roles' database: its name, each role's name and a URL that logs in as it."""

    dbname: str
    names: dict[str, str]
    urls: dict[str, str]

    def connect(self, kind: str) -> psycopg.Connection[Any]:
        return psycopg.connect(self.urls[kind], autocommit=True)

    def django(self, kind: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run ``python -m django ARGS`` with tests.settings, logged in as role ``kind``."""
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            "DATABASE_URL": self.urls[kind],
            "PYTHONUNBUFFERED": "1",
        }
        proc = subprocess.run(
            [sys.executable, "-m", "django", *args],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=_TIMEOUT,
            check=False,
        )
        if check:
            assert proc.returncode == 0, f"{args[:2]} as {kind}:\n{proc.stdout}\n{proc.stderr}"
        return proc

    def shell(self, kind: str, code: str) -> Any:
        """Run ``code`` in ``manage.py shell`` as role ``kind``; return the JSON it printed last."""
        proc = self.django(kind, "shell", "-c", textwrap.dedent(code))
        return json.loads(proc.stdout.strip().splitlines()[-1])


def _url(server: str, user: str, dbname: str) -> str:
    params = psycopg.conninfo.conninfo_to_dict(server)
    host = params.get("host") or "127.0.0.1"
    port = params.get("port") or "5432"
    return f"postgresql://{user}@{host}:{port}/{dbname}"


@pytest.fixture(scope="module")
def roles_db(postgres_url: str) -> Iterator[RolesDB]:
    admin = psycopg.connect(postgres_url, autocommit=True)
    try:
        row = admin.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user").fetchone()
        if not (row and row[0]):
            pytest.skip("creating roles and a database needs a superuser connection (DATABASE_URL)")
        tag = f"awa_t{os.getpid()}"
        names = {kind: f"{tag}_{kind}" for kind in ROLE_KINDS}
        dbname = f"{tag}_roles"
        created: list[str] = []
        try:
            for name in names.values():
                admin.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(name)))
                created.append(name)
            admin.execute(
                sql.SQL("CREATE DATABASE {} OWNER {}").format(
                    sql.Identifier(dbname), sql.Identifier(names["owner"])
                )
            )
            # Nobody but the roles granted below may connect (PUBLIC has CONNECT by default).
            admin.execute(
                sql.SQL("REVOKE ALL ON DATABASE {} FROM PUBLIC").format(sql.Identifier(dbname))
            )
            db = RolesDB(
                dbname, names, {k: _url(postgres_url, n, dbname) for k, n in names.items()}
            )
            db.django("owner", "migrate", "-v", "0")
            with db.connect("owner") as owner:
                # The project's own tables (Django's, the test app's) are the project's to
                # grant, as on any Django site: here, row access for every role but the owner.
                for kind in ROLE_KINDS[1:]:
                    role = sql.Identifier(names[kind])
                    owner.execute(
                        sql.SQL(
                            "GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public "
                            "TO {}"
                        ).format(role)
                    )
                    owner.execute(
                        sql.SQL("GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO {}").format(role)
                    )
            db.django(
                "owner",
                "awa_roles",
                "--apply",
                *[arg for kind in ROLE_KINDS[1:] for arg in (f"--{kind}", names[kind])],
            )
            yield db
        finally:
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(dbname))
            )
            for name in created:
                admin.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(name)))
    finally:
        admin.close()


def _refused(conn: psycopg.Connection[Any], statement: str, params: Any = None) -> None:
    with pytest.raises(errors.InsufficientPrivilege):
        conn.execute(statement, params)


def _jobs(queue: str, n: int = 1) -> str:
    return json.dumps([{"kind": "tests.jobs.common.noop", "queue": queue} for _ in range(n)])


def _state(db: RolesDB, job_id: int) -> str | None:
    with db.connect("operator") as conn:
        row = conn.execute("SELECT state FROM awa.jobs WHERE id = %s", [job_id]).fetchone()
    return None if row is None else str(row[0])


# The command -------------------------------------------------------------------------------


@pytest.mark.django_db
def test_print_sql_names_every_role_as_a_quoted_identifier() -> None:
    out = StringIO()
    call_command(
        "awa_roles", "--print-sql", "--app", "shop_app", "--maintenance", "Shop_Maint",
        stdout=out, stderr=StringIO(),
    )  # fmt: skip
    script = out.getvalue()
    assert 'GRANT USAGE ON SCHEMA awa TO "shop_app";' in script
    assert 'GRANT TRUNCATE ON "awa"."claim_closures_0", ' in script
    assert '"awa"."ready_entries_15"' in script and 'TO "Shop_Maint";' in script
    assert "awa.enqueue_one_v2(" in script
    app_grants = [
        line
        for line in script.split("-- The maintenance")[0].splitlines()
        if line.startswith("GRANT") and "awa" in line
    ]
    assert app_grants and not any("INSERT" in g or "TRUNCATE" in g for g in app_grants)
    assert "--worker" not in script and '"shop_worker"' not in script


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--app", 'x"; DROP SCHEMA awa; --'], "--app: "),
        (["--operator", "public"], "reserved"),
        (["--worker", "pg_monitor"], "reserved"),
        (["--owner", "1abc"], "not a role name"),
        (["--app", "a" * 64], "not a role name"),
        ([], "name at least one role"),
    ],
)
def test_bad_role_names_are_refused_before_anything_runs(args: list[str], message: str) -> None:
    with pytest.raises(CommandError, match=message):
        call_command("awa_roles", "--apply", *args, stdout=StringIO(), stderr=StringIO())


def test_the_script_converges_when_run_again(roles_db: RolesDB) -> None:
    # Run once by the fixture; again here: same grants, nothing fails.
    roles_db.django(
        "owner",
        "awa_roles",
        "--apply",
        *[arg for kind in ROLE_KINDS[1:] for arg in (f"--{kind}", roles_db.names[kind])],
    )
    with roles_db.connect("owner") as conn:
        row = conn.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user").fetchone()
        assert row == (False,)  # the entry points run as a plain role, not a superuser
        definer = conn.execute(
            "SELECT array_agg(p.proname::text ORDER BY p.proname) FROM pg_proc p "
            "JOIN pg_namespace n ON n.oid = p.pronamespace "
            "WHERE n.nspname = 'awa' AND p.prosecdef"
        ).fetchone()
    assert definer == (
        [
            "callback_extend_v1",
            "callback_receive_v1",
            "callback_resolve_v2",
            "enqueue_one_v1",
            "enqueue_one_v2",
            "enqueue_one_v3",
            "enqueue_v1",
            "ensure_lanes_v1",
            "flow_handoff_lane_v1",
        ],
    )


# The app role ------------------------------------------------------------------------------


def test_app_role_enqueues_into_a_new_queue_and_priority_and_reads_its_jobs(
    roles_db: RolesDB,
) -> None:
    # Through the Python API, inside one transaction: a single job into a queue and priority
    # never seen (the lanes and their sequences are created by awa.ensure_lanes_v1 as the
    # owner), a bulk batch (the COPY path is not open to this role: awa.enqueue_v1), a
    # scheduled job, a unique job and a django.tasks task; then the job states and the task's
    # result as the application reads them.
    result = roles_db.shell(
        "app",
        """
        import json
        from datetime import timedelta
        from django.db import transaction
        import awa_django
        from awa_django.operator import reads
        from tests.jobs import common as testjobs, tasks as tasks_for_tests

        with transaction.atomic():
            one = testjobs.noop.using(queue="app-fresh", priority=37).enqueue()
            many = awa_django.enqueue_many(
                [testjobs.noop.using(queue="app-bulk", priority=-3).prepare() for _ in range(3)]
            )
            later = testjobs.noop.using(queue="app-fresh", run_after=timedelta(hours=1)).enqueue()
            unique = testjobs.noop.using(queue="app-fresh", unique_key="u1").enqueue()
            again = testjobs.noop.using(queue="app-fresh", unique_key="u1").enqueue()
            task = tasks_for_tests.add.enqueue(2, 3)
        ids = [one.id, *(h.id for h in many), later.id, unique.id]
        print(json.dumps({
            "ids": ids,
            "states": [reads.job_show(i).state.value for i in ids],
            "duplicate": again.duplicate and again.id == unique.id,
            "task": tasks_for_tests.add.get_result(task.id).status.value,
        }))
        """,
    )
    assert result["states"] == ["available"] * 4 + ["scheduled", "available"]
    assert result["duplicate"] is True
    assert result["task"] == "READY"
    with roles_db.connect("owner") as conn:
        lanes = conn.execute(
            "SELECT l.queue, l.priority, c.relowner::regrole::text FROM awa.queue_lanes l "
            "JOIN pg_class c ON c.oid = l.enqueue_seq "
            "WHERE l.queue IN ('app-fresh', 'app-bulk') ORDER BY 1, 2, l.shard"
        ).fetchall()
    assert {(q, p) for q, p, _ in lanes} >= {("app-fresh", 37), ("app-bulk", -3)}
    assert {owner for _, _, owner in lanes} == {roles_db.names["owner"]}


def test_app_role_cannot_write_the_rings_truncate_purge_or_claim(roles_db: RolesDB) -> None:
    with roles_db.connect("app") as conn:
        [(job_id, _)] = conn.execute(
            "SELECT job_id, state FROM awa.enqueue_v1(%s::jsonb)", [_jobs("app-refused")]
        ).fetchall()
        _refused(
            conn,
            "INSERT INTO awa.ready_entries (ready_slot, ready_generation, lane_id, lane_seq, "
            "job_id, priority, attempt, max_attempts, run_lease, queue, kind, args, run_at, "
            "created_at) VALUES (0, 0, 1, 1, 1, 0, 0, 1, 0, 'q', 'os.system', '{}', now(), now())",
        )
        _refused(conn, "INSERT INTO awa.deferred_jobs SELECT * FROM awa.deferred_jobs LIMIT 0")
        _refused(conn, "UPDATE awa.queue_meta SET paused = true")
        _refused(conn, "TRUNCATE awa.ready_entries_0")
        _refused(conn, "TRUNCATE awa.dlq_entries")
        _refused(conn, "SELECT awa.dlq_purge_v1(ARRAY[%s]::bigint[])", [job_id])
        _refused(conn, "SELECT awa.queue_pause_v1('app-refused', true)")
        _refused(conn, "SELECT awa.cancel_v1(%s)", [job_id])
        _refused(conn, "CREATE SEQUENCE awa.app_made_this")
        _refused(conn, "SELECT nextval('awa.job_id_seq')")
        with pytest.raises(errors.InsufficientPrivilege):
            storage.claim(conn, "app-refused", 1, WORKER)
        conn.rollback()
        # Reading its job is allowed.
        assert conn.execute("SELECT state FROM awa.jobs WHERE id = %s", [job_id]).fetchone() == (
            "available",
        )
    assert _state(roles_db, job_id) == "available"


def test_a_forged_lane_record_does_not_let_an_enqueue_skip_the_lane_lock(
    roles_db: RolesDB,
) -> None:
    # awa.xact_lanes records the lanes a transaction holds; any caller can set it. The
    # SECURITY DEFINER enqueue must still take the lane's lock: with every lane of the queue
    # held by another transaction, a forged record makes it wait (here: time out), not append.
    with roles_db.connect("app") as app:
        app.execute("SELECT * FROM awa.enqueue_v1(%s::jsonb)", [_jobs("app-forged")])
    with roles_db.connect("worker") as holder, roles_db.connect("app") as app:
        lanes = [
            r[0]
            for r in holder.execute(
                "SELECT lane_id FROM awa.queue_lanes WHERE queue = 'app-forged' AND priority = 0"
            )
        ]
        with holder.transaction():
            for lane in lanes:
                holder.execute("SELECT pg_advisory_xact_lock(4282177, %s)", [lane])
            with pytest.raises(errors.LockNotAvailable), app.transaction():
                app.execute("SET LOCAL lock_timeout = '300ms'")
                app.execute("SELECT set_config('awa.xact_lanes', %s, true)", [str(lanes[0])])
                app.execute(
                    "SELECT * FROM awa.enqueue_one_v2('tests.jobs.common.noop', 'app-forged', 0, "
                    '\'{"args": [], "kwargs": {}}\', 1)'
                )


# The worker role ---------------------------------------------------------------------------


def test_worker_role_claims_and_finalizes_and_cannot_truncate(roles_db: RolesDB) -> None:
    with roles_db.connect("app") as app:
        ids = [
            r[0]
            for r in app.execute(
                "SELECT job_id FROM awa.enqueue_v1(%s::jsonb)", [_jobs("worker-q", 2)]
            )
        ]
    with roles_db.connect("worker") as conn:
        conn.execute("LISTEN awa_jobs")
        claimed = storage.claim(conn, "worker-q", 10, WORKER)
        assert sorted(c.job_id for c in claimed) == ids
        storage.heartbeat(conn, [(c.job_id, c.run_lease, None) for c in claimed])
        stale = storage.finalize(
            conn, [Finalization(c.job_id, c.run_lease, c.claim_slot, "completed") for c in claimed]
        )
        assert stale == []
        _refused(conn, "TRUNCATE awa.claims_0")
        _refused(conn, "TRUNCATE awa.ready_entries_0")
        _refused(conn, "CREATE TABLE awa.worker_made_this (x int)")
        _refused(conn, "DELETE FROM awa.schema_migrations")
    assert [_state(roles_db, i) for i in ids] == ["completed", "completed"]


def test_a_worker_process_as_the_worker_role_drains_what_the_app_role_enqueued(
    roles_db: RolesDB,
) -> None:
    with roles_db.connect("app") as app:
        ids = [
            r[0]
            for r in app.execute(
                "SELECT job_id FROM awa.enqueue_v1(%s::jsonb)", [_jobs("burst-q", 5)]
            )
        ]
    roles_db.django("worker", "awa_worker", "--burst", "--no-maintenance", "--queue", "burst-q")
    assert [_state(roles_db, i) for i in ids] == ["completed"] * 5


# The maintenance role ----------------------------------------------------------------------


def _run_through(conn: psycopg.Connection[Any], queue: str) -> None:
    conn.execute("SELECT * FROM awa.enqueue_v1(%s::jsonb)", [_jobs(queue)])
    claimed = storage.claim(conn, queue, 1, WORKER)
    storage.finalize(
        conn, [Finalization(c.job_id, c.run_lease, c.claim_slot, "completed") for c in claimed]
    )


def test_maintenance_role_rotates_and_prunes_where_a_worker_cannot(roles_db: RolesDB) -> None:
    with roles_db.connect("maintenance") as conn:
        # Rotate the claim ring until its oldest sealed slot holds only closed claims.
        (start,) = conn.execute(
            "SELECT current_slot FROM awa.ring_state WHERE ring = 'claim'"
        ).fetchone()  # type: ignore[misc]
        for _ in range(7):
            _run_through(conn, "maint-q")
            conn.execute("SELECT awa.prune_v1('claim')")
            assert conn.execute("SELECT awa.rotate_v3('claim')").fetchone() == ("rotated",)
        _run_through(conn, "maint-q")
        with roles_db.connect("worker") as worker:
            _refused(worker, "SELECT awa.prune_v1('claim')")
        assert conn.execute("SELECT awa.prune_v1('claim')").fetchone() == ("pruned",)
        assert conn.execute("SELECT awa.promote_v1()").fetchone() is not None
        assert conn.execute("SELECT * FROM awa.rescue_v1(60)").fetchall() is not None
        (after,) = conn.execute(
            "SELECT current_slot FROM awa.ring_state WHERE ring = 'claim'"
        ).fetchone()  # type: ignore[misc]
        assert after == (start + 7) % 8


# The operator role -------------------------------------------------------------------------


def test_operator_role_reads_the_admins_lists_and_cannot_write(roles_db: RolesDB) -> None:
    with roles_db.connect("app") as app:
        [job_id] = [
            r[0]
            for r in app.execute("SELECT job_id FROM awa.enqueue_v1(%s::jsonb)", [_jobs("op-q")])
        ]
    result = roles_db.shell(
        "operator",
        f"""
        import json
        from django.apps import apps
        from awa_django.operator import reads

        counts = {{}}
        for model in apps.get_app_config("awa_django").get_models():
            counts[model.__name__] = len(list(model.objects.all()[:50]))
        reads.queue_stats(); reads.workers(); reads.rings(); reads.dlq_list()
        reads.schedules(); reads.queue_limits(); reads.throughput("op-q")
        print(json.dumps({{"counts": counts, "job": reads.job_show({job_id}).state.value}}))
        """,
    )
    assert result["job"] == "available"
    assert result["counts"]
    refused = roles_db.django("operator", "awa_queue", "pause", "op-q", check=False)
    assert refused.returncode == 1 and "permission denied" in refused.stderr
    with roles_db.connect("operator") as conn:
        _refused(conn, "SELECT * FROM awa.enqueue_v1(%s::jsonb)", [_jobs("op-q")])
        _refused(conn, "SELECT awa.cancel_v1(%s)", [job_id])
        _refused(conn, "SELECT awa.queue_pause_v1('op-q', true)")
        _refused(conn, "SELECT awa.dlq_purge_v1(ARRAY[%s]::bigint[])", [job_id])
        _refused(conn, "SELECT * FROM awa.callback_resolve_v2(gen_random_uuid())")
        _refused(conn, "DELETE FROM awa.deferred_jobs")
    assert _state(roles_db, job_id) == "available"
