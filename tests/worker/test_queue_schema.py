"""Queue storage in a schema of one's choice (docs/schema.md): a second Django project on the
same database, with ``AWA["SCHEMA"] = "second_awa"`` and its own tables in ``second_project``,
migrates, enqueues and drains only its own jobs while this project's worker drains its own;
each schema elects its own leader; ``awa_roles`` grants on the project's schema and nothing of
``awa``; ``sqlmigrate`` prints the SQL for the configured schema."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import connection, transaction

from awa_django.db.roles import RoleNames, read_schema_facts, roles_script
from awa_django.db.schema_guard import check_advisory, check_install, check_owned, schema_problem
from awa_django.sql import for_schema, query, sql_file
from tests.jobs import common, worker_env
from tests.support.polling import wait_for
from tests.support.workers import Start, exited, worker

pytestmark = [pytest.mark.worker, pytest.mark.usefixtures("clean_awa")]

SCHEMA = "second_awa"
TABLES = "second_project"
ROLES = ("second_awa_app", "second_awa_worker")


def second_env(**overrides: Any) -> dict[str, str]:
    """The second project's environment: its AWA schema and its own Django tables."""
    tables = overrides.pop("tables", TABLES)
    env = worker_env(**{"SCHEMA": SCHEMA, **overrides})
    env["AWA_TEST_SEARCH_PATH"] = tables
    return env


def sql(statement: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        return cursor.fetchall() if cursor.description else []


def drop_second_project() -> None:
    for name in (SCHEMA, TABLES, "third_project", "reports", "app_iagfolnh", "collider_project"):
        sql(f"DROP SCHEMA IF EXISTS {name} CASCADE")
    for role in ROLES:
        if sql("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)):
            sql(f"DROP OWNED BY {role}")
            sql(f"DROP ROLE {role}")


@pytest.fixture
def second_project(manage_py: Start) -> Iterator[None]:
    """The second project, migrated (Django's tables in ``second_project``, awa's in
    ``second_awa``); dropped again afterwards."""
    drop_second_project()
    sql(f"CREATE SCHEMA {TABLES}")
    migrate = manage_py("migrate", "--verbosity", "0", extra_env=second_env())
    assert exited(migrate, timeout=120) == 0, migrate.output()
    assert sql(f"SELECT to_regclass('{TABLES}.django_migrations') IS NOT NULL") == [(True,)]
    yield
    drop_second_project()


def states(schema: str) -> dict[str, list[Any]]:
    rows = sql(f"SELECT state, args FROM {schema}.jobs WHERE queue = 'other'")
    found: dict[str, list[Any]] = {}
    for state, args in rows:
        found.setdefault(state, []).append(json.loads(args) if isinstance(args, str) else args)
    return found


@pytest.mark.usefixtures("second_project")
def test_two_projects_on_one_database_each_drain_only_their_own(manage_py: Start) -> None:
    enqueue = manage_py(
        "shell",
        "-c",
        "from tests.jobs.common import renamed\nfor n in range(5): renamed.enqueue(f'second-{n}')",
        extra_env=second_env(),
    )
    assert exited(enqueue, timeout=60) == 0, enqueue.output()
    for n in range(4):
        common.renamed.enqueue(f"first-{n}")
    # The same queue name in both projects: each sees only its own jobs.
    assert len(states(SCHEMA)["available"]) == 5
    assert len(states("awa")["available"]) == 4

    second = manage_py("awa_worker", "--queue", "other", extra_env=second_env())
    wait_for(
        lambda: states(SCHEMA).get("completed", []) and len(states(SCHEMA)["completed"]) == 5,
        timeout=60,
        message=lambda: f"the second project's jobs to complete; output:\n{second.output()}",
    )
    waiting = states("awa")
    assert set(waiting) == {"available"} and len(waiting["available"]) == 4

    first = worker(manage_py, "--queue", "other")
    wait_for(
        lambda: len(states("awa").get("completed", [])) == 4,
        timeout=60,
        message=lambda: f"this project's jobs to complete; output:\n{first.output()}",
    )
    assert set(states(SCHEMA)) == {"completed"}
    expected = (json.loads(common.renamed.prepare(f"second-{n}").args_json) for n in range(5))
    assert sorted(map(str, states(SCHEMA)["completed"])) == sorted(map(str, expected))
    # Each schema's leader lock is its own: both fleets elect a leader at once.
    for schema in ("awa", SCHEMA):
        wait_for(
            lambda schema=schema: (
                sql(f"SELECT count(*) FROM {schema}.runtime_instances WHERE is_leader")[0][0] == 1
            ),
            timeout=30,
            message=f"a leader in {schema}",
        )
    first.kill()
    second.kill()


@pytest.mark.usefixtures("second_project")
def test_roles_and_sqlmigrate_follow_the_schema(manage_py: Start) -> None:
    for role in ROLES:
        sql(f"CREATE ROLE {role} NOLOGIN")
    roles = manage_py(
        "awa_roles",
        "--apply",
        "--app",
        ROLES[0],
        "--worker",
        ROLES[1],
        extra_env=second_env(),
    )
    assert exited(roles, timeout=60) == 0, roles.output()
    for role in ROLES:
        assert sql("SELECT has_schema_privilege(%s, %s, 'USAGE')", (role, SCHEMA)) == [(True,)]
        assert sql("SELECT has_schema_privilege(%s, 'awa', 'USAGE')", (role,)) == [(False,)]
    enqueue = sql(
        "SELECT has_function_privilege(%s, p.oid, 'EXECUTE') FROM pg_proc p"
        " WHERE p.pronamespace = %s::regnamespace AND p.proname = 'enqueue_v1'",
        (ROLES[0], SCHEMA),
    )
    assert enqueue == [(True,)]

    # --lock-advisory takes database-wide functions from PUBLIC: the owners of the other queues
    # of the database keep them.
    sql(f"ALTER SCHEMA {SCHEMA} OWNER TO {ROLES[0]}")
    with connection.cursor() as cursor:
        facts = read_schema_facts(cursor)
        assert facts is not None and facts.other_queues == ((SCHEMA, ROLES[0]),)
        script = roles_script(RoleNames(maintenance=ROLES[1]), facts, lock_advisory=True)
        text = script.as_string(cursor.cursor.connection)
    assert f'TO "{facts.schema_owner}", "{ROLES[0]}", "{ROLES[1]}";' in text

    printed = manage_py("sqlmigrate", "awa_django", "0001", extra_env=second_env())
    assert exited(printed, timeout=60) == 0
    text = printed.output()
    assert f"CREATE SCHEMA {SCHEMA};" in text and f"{SCHEMA}.job_id_seq" in text
    assert "awa." not in text.replace(f"{SCHEMA}.", "")


def preflight(name: str, search_path: str | None = None) -> None:
    """The checks ``migrate`` runs before it creates the schema ``name``, on a connection
    whose search_path is ``search_path`` (this transaction only)."""
    with transaction.atomic(), connection.cursor() as cursor:
        if search_path:
            cursor.execute("SELECT set_config('search_path', %s, true)", [search_path])
        check_install(cursor, name, "0001_initial")


@pytest.mark.usefixtures("second_project")
def test_migrate_refuses_a_shared_a_foreign_an_unsafe_or_a_colliding_schema(
    manage_py: Start,
) -> None:
    preflight(SCHEMA, TABLES)  # the second project itself: already installed, by it
    sql("CREATE SCHEMA third_project")
    sql("CREATE TABLE third_project.django_migrations (id int)")
    sql("CREATE SCHEMA reports")
    sql("CREATE TABLE reports.totals (n int)")
    refusals = {
        (SCHEMA, "third_project"): "holds the queue of another Django project",
        ("reports", None): "holds no awa_django queue",
        ("third_awa", "third_project, third_awa"): "on this connection's search_path",
        ("postgres", None): "on this connection's search_path",  # "$user": the test's role
        ("postgres", "$USER, public"): "on this connection's search_path",
        ("third_awa", "third_project, Third_Awa"): "on this connection's search_path",
    }
    for (name, search_path), message in refusals.items():
        with pytest.raises(ImproperlyConfigured, match=message):
            preflight(name, search_path)
    # migrate awa_django zero from another project leaves the queue alone.
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL search_path TO third_project")
        with pytest.raises(ImproperlyConfigured, match="another Django project"):
            check_owned(cursor, SCHEMA, "0002_engine")
    # A quoted entry keeps its case: "Third_Awa" is not third_awa.
    preflight("third_awa", 'third_project, "Third_Awa"')
    # A role that may not take advisory locks (awa_roles --lock-advisory ran for another queue)
    # is told the GRANT that lets it migrate.
    with (
        pytest.raises(
            ImproperlyConfigured, match=r"GRANT EXECUTE ON FUNCTION .* TO \"locked_out\""
        ),
        transaction.atomic(),
        connection.cursor() as cursor,
    ):
        cursor.execute(
            "REVOKE EXECUTE ON FUNCTION pg_advisory_xact_lock(integer, integer) FROM PUBLIC"
        )
        cursor.execute("CREATE ROLE locked_out")
        cursor.execute("SET LOCAL ROLE locked_out")
        check_advisory(cursor)
    # Another project's queue, named by this one's settings.
    with connection.cursor() as cursor:
        assert "another Django project" in (schema_problem(cursor, SCHEMA) or "")
        assert schema_problem(cursor, "awa") is None
    # The server's own keywords are checked too (the settings refuse those they know).
    assert sql(query("migration_schema_keyword", "int")) == [(True,)]
    assert sql(query("migration_schema_keyword", SCHEMA)) == [(False,)]
    # Two names whose advisory-lock key spaces collide (CRC-32) cannot both hold a queue.
    sql("CREATE SCHEMA collider_project")
    collider = manage_py(
        "migrate",
        "awa_django",
        "--verbosity",
        "0",
        extra_env=second_env(SCHEMA="app_iagfolnh", tables="collider_project"),
    )
    try:
        assert exited(collider, timeout=120) == 0, collider.output()
        with pytest.raises(ImproperlyConfigured, match="'app_iagfolnh'"):
            preflight("app_ayfyqowf", "third_project")
    finally:
        sql("DROP SCHEMA IF EXISTS app_iagfolnh CASCADE")
        sql("DROP SCHEMA IF EXISTS collider_project CASCADE")

    # The setting changed after migrate: check warns (awa.W005) and the worker will not start.
    moved = second_env(SCHEMA="moved_awa")
    check = manage_py("check", "--database", "default", extra_env=moved)
    exited(check, timeout=60)
    assert "awa.W005" in check.output() and "migrate awa_django zero --fake" in check.output()
    refused = manage_py("awa_worker", extra_env=moved)
    assert exited(refused, timeout=60) == 1
    assert "the schema 'moved_awa' holds no awa_django queue" in refused.output()
    # This project's settings naming the second project's schema: an error, which stops migrate.
    foreign = manage_py("check", "--database", "default", extra_env=worker_env(SCHEMA=SCHEMA))
    assert exited(foreign, timeout=60) != 0
    assert "awa.E010" in foreign.output()


def test_statements_for_another_schema_share_no_name_channel_or_lock() -> None:
    text = "\n".join(query(name) for name in ("leader_try", "listen_jobs", "migration_lock"))
    moved = "\n".join(
        query(name, SCHEMA) for name in ("leader_try", "listen_jobs", "migration_lock")
    )
    assert for_schema(text, "awa") == text
    assert moved == for_schema(text, SCHEMA) != text
    assert "LISTEN second_awa_jobs" in moved and "4282180" not in moved
    assert "4708303813012965710" not in moved
    # The workflows' channel, in its LISTEN and in the settle that notifies it.
    assert query("listen_done", SCHEMA) == "LISTEN second_awa_done"
    settle = sql_file("functions/workflows.sql", SCHEMA)
    assert "pg_notify('second_awa_done'" in settle and "awa_done" not in settle.replace(
        "second_awa_done", ""
    )
    # Custom settings keep the prefix awa: a schema may be named like a reserved prefix.
    assert "'awa.plpgsql_xact_lanes'" in for_schema("current_setting('awa.xact_lanes')", "plpgsql")
