"""Migrations: install, reverse to zero, concurrent runs, no drift, one source per object."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from io import StringIO
from pathlib import Path

import psycopg
import pytest
from django.apps import apps
from django.core.management import call_command
from django.db import connection

from tests.support.database import conninfo

pytestmark = pytest.mark.storage

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "awa_django"


def migration_files() -> list[str]:
    """The schema files the migrations run, in order."""
    from django.db.migrations.loader import MigrationLoader

    from awa_django.db.migration import RunAwaSQL

    loader = MigrationLoader(None, ignore_no_migrations=True)
    files: list[str] = []
    for key in sorted(k for k in loader.disk_migrations if k[0] == "awa_django"):
        for operation in loader.disk_migrations[key].operations:
            if isinstance(operation, RunAwaSQL):
                files.extend(operation.files)
    return files


def test_every_schema_file_is_run_once_by_the_migrations() -> None:
    sql = PACKAGE / "sql"
    on_disk = sorted(
        str(p.relative_to(sql))
        for p in sql.rglob("*.sql")
        if p.parent.name != "queries" and p.name != "roles.sql"
    )
    assert sorted(migration_files()) == on_disk


def test_every_function_trigger_and_view_is_defined_once() -> None:
    """One source per object: a change to a function is a change to one place."""
    import re

    text = "".join((PACKAGE / "sql" / f).read_text() for f in migration_files())
    for kind in ("FUNCTION", "VIEW", "TRIGGER"):
        names = re.findall(rf"^CREATE (?:OR REPLACE )?{kind} (?:awa\.)?(\w+)", text, re.M)
        assert names and len(names) == len(set(names)), kind
    assert "CREATE FUNCTION" not in text and "CREATE VIEW" not in text  # all OR REPLACE


@pytest.mark.django_db
def test_sqlmigrate_prints_the_sql_file_with_its_lock_and_record() -> None:
    out = StringIO()
    call_command("sqlmigrate", "awa_django", "0002", stdout=out)
    text = out.getvalue()
    assert "pg_advisory_xact_lock(4282180, 0)" in text
    assert "CREATE OR REPLACE FUNCTION awa.claim_v3(" in text
    # The claim's per-slot statements, rendered: one branch per claim slot, none left unrendered.
    assert "FROM awa.claims_7 c" in text and "\n    --@each" not in text and "_slot}" not in text
    assert "INSERT INTO awa.schema_migrations (name, installed_for)\nVALUES ('0002_engine'," in text
    backwards = StringIO()
    call_command("sqlmigrate", "awa_django", "0001", "--backwards", stdout=backwards)
    assert "DROP SCHEMA IF EXISTS awa CASCADE" in backwards.getvalue()


@pytest.mark.django_db
def test_makemigrations_is_clean() -> None:
    call_command("makemigrations", "awa_django", "--check", "--dry-run", verbosity=0)


def relation_count() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = 'awa'"
        )
        row = cursor.fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.django_db(transaction=True)
def test_migrate_installs_the_substrate_and_zero_removes_it() -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT parent.relname, count(*) FROM pg_inherits i "
            "JOIN pg_class parent ON parent.oid = i.inhparent "
            "JOIN pg_namespace n ON n.oid = parent.relnamespace WHERE n.nspname = 'awa' "
            "GROUP BY parent.relname"
        )
        partitions = dict(cursor.fetchall())
    assert {
        k: v for k, v in partitions.items() if not k.endswith("_idx") and not k.endswith("_pkey")
    } == {
        "ready_entries": 8,
        "ready_tombstones": 8,
        "done_entries": 8,
        "done_counts": 8,
        "claims": 8,
        "claim_closures": 8,
        "leases": 8,
    }
    try:
        call_command("migrate", "awa_django", "zero", verbosity=0)
        assert relation_count() == 0
        with connection.cursor() as cursor:
            cursor.execute("SELECT to_regnamespace('awa')")
            assert cursor.fetchone() == (None,)
    finally:
        call_command("migrate", "awa_django", verbosity=0)
        from awa_django.db.enqueue import forget_known_lanes

        forget_known_lanes()
    assert relation_count() > 100


@pytest.mark.django_db(transaction=True)
def test_unapplying_the_functions_and_applying_them_again_keeps_the_tables_and_jobs() -> None:
    def functions_and_views() -> tuple[int, int]:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT (SELECT count(*) FROM pg_proc WHERE pronamespace = 'awa'::regnamespace),"
                " (SELECT count(*) FROM pg_class WHERE relkind = 'v'"
                " AND relnamespace = 'awa'::regnamespace)"
            )
            row = cursor.fetchone()
        assert row is not None
        return int(row[0]), int(row[1])

    with connection.cursor() as cursor:
        cursor.execute("""SELECT job_id FROM awa.enqueue_v1('[{"kind": "k"}]')""")
        [(job_id,)] = cursor.fetchall()
    installed = functions_and_views()
    try:
        call_command("migrate", "awa_django", "0001", verbosity=0)
        # Only the checks the tables use (their constraints and an index) remain.
        assert functions_and_views() == (5, 0)
    finally:
        call_command("migrate", "awa_django", verbosity=0)
    assert functions_and_views() == installed
    with connection.cursor() as cursor:
        cursor.execute("SELECT kind, state FROM awa.jobs WHERE id = %s", [job_id])
        assert cursor.fetchall() == [("k", "available")]
    backwards = StringIO()
    call_command("sqlmigrate", "awa_django", "0002", "--backwards", stdout=backwards)
    assert "DROP FUNCTION IF EXISTS" in backwards.getvalue()
    assert "'claim_v3'" in backwards.getvalue() and "'live_jobs'" in backwards.getvalue()
    assert "'flow_kind_rate_row'" in backwards.getvalue()  # the trigger, before its function


@pytest.mark.django_db(transaction=True)
def test_unapplying_the_functions_never_drops_a_users_view_on_them() -> None:
    from django.db import DatabaseError

    with connection.cursor() as cursor:
        cursor.execute("CREATE SCHEMA userapp")
        cursor.execute("CREATE VIEW userapp.my_jobs AS SELECT id, state FROM awa.jobs")
        # The order PostgreSQL returns catalog rows in must not matter.
        cursor.execute("SET enable_indexscan = off")
    try:
        with pytest.raises(DatabaseError, match="other objects depend on it"):
            call_command("migrate", "awa_django", "0001", verbosity=0)
        with connection.cursor() as cursor:
            cursor.execute("SELECT (SELECT count(*) FROM userapp.my_jobs) = count(*) FROM awa.jobs")
            assert cursor.fetchone() == (True,)
            cursor.execute("SELECT count(*) FROM awa.schema_migrations")
            assert cursor.fetchone() == (2,)
    finally:
        with connection.cursor() as cursor:
            cursor.execute("RESET enable_indexscan")
            cursor.execute("DROP SCHEMA userapp CASCADE")
    call_command("migrate", "awa_django", "0001", verbosity=0)
    call_command("migrate", "awa_django", verbosity=0)


@pytest.mark.django_db(transaction=True)
def test_two_migrate_processes_started_at_once_both_succeed() -> None:
    name = "awa_migrate_race"
    admin = psycopg.connect(conninfo(), autocommit=True)
    try:
        admin.execute(f"DROP DATABASE IF EXISTS {name}")
        admin.execute(f"CREATE DATABASE {name}")
        settings = connection.settings_dict
        url = (
            f"postgresql://{settings['USER']}:{settings['PASSWORD'] or ''}@"
            f"{settings['HOST'] or '127.0.0.1'}:{settings['PORT']}/{name}"
        )
        env = {**os.environ, "DATABASE_URL": url, "DJANGO_SETTINGS_MODULE": "tests.settings"}
        command = [sys.executable, "-m", "django", "migrate", "--verbosity", "0"]
        # Django's own bookkeeping table is created first: racing its creation is Django's
        # concern; racing awa_django's migrations is ours.
        subprocess.run([*command, "contenttypes"], env=env, cwd=ROOT, check=True, timeout=120)
        # So is the content-type rows' creation after migrate (post_migrate), which both
        # processes would attempt at once: the rows are there before the race starts.
        with psycopg.connect(
            conninfo().replace(f"dbname={settings['NAME']}", f"dbname={name}"), autocommit=True
        ) as conn:
            for model in apps.get_app_config("awa_django").get_models():
                conn.execute(
                    "INSERT INTO django_content_type (app_label, model) VALUES (%s, %s)",
                    ["awa_django", model._meta.model_name],
                )
        procs = [
            subprocess.Popen(
                [*command, "awa_django"],
                env=env,
                cwd=ROOT,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
            )
            for _ in range(2)
        ]
        outputs = [p.communicate(timeout=120)[0].decode() for p in procs]
        assert [p.returncode for p in procs] == [0, 0], outputs
        with psycopg.connect(
            conninfo().replace(f"dbname={settings['NAME']}", f"dbname={name}"), autocommit=True
        ) as conn:
            row = conn.execute("SELECT name FROM awa.schema_migrations ORDER BY name").fetchall()
            assert row == [("0001_initial",), ("0002_engine",)]
            assert conn.execute(
                'SELECT count(*) FROM awa.enqueue_v1(\'[{"kind": "k"}]\')'
            ).fetchone() == (1,)
    finally:
        admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        admin.close()


#: The last commit whose migrations were the development chain (0001_schema .. 0018), which
#: databases migrated during development carry.
DEVELOPMENT_CHAIN = "75e4593"


#: Lines of a catalog picture that name the queue ring's slots 8-15, or count relations: a
#: database made by the development chain keeps the 16 queue slots it was made with (the
#: functions read the count from awa.rings, and take their generic statements for slots 8-15).
_EXTRA_QUEUE_SLOTS = re.compile(
    r"\b(?:ready_entries|ready_tombstones|done_entries|done_counts)_(?:[89]|1[0-5])\b"
    r"|^-- (?:relation|partition index) \(\d+\)$"
)


def _without_extra_queue_slots(picture: str) -> str:
    return "".join(
        line for line in picture.splitlines(keepends=True) if not _EXTRA_QUEUE_SLOTS.search(line)
    )


@pytest.mark.django_db(transaction=True)
def test_a_database_migrated_by_a_development_version_converges(tmp_path: Path) -> None:
    """A database migrated with the development chain takes the settled schema as applied
    (Django's ``replaces``), and the next migration converges it: its catalog is a fresh
    database's apart from the queue slots 8-15 it keeps, the functions nothing calls any more
    dropped (two retry-policy constraints stay NOT VALID: added to tables that had rows, they
    were never validated)."""
    import io
    import shutil
    import tarfile

    from tests.support.awa_schema import schema_dump

    git = shutil.which("git")
    if (
        git is None
        or subprocess.run(
            [git, "-C", str(ROOT), "cat-file", "-e", f"{DEVELOPMENT_CHAIN}^{{commit}}"],
            capture_output=True,
        ).returncode
    ):
        pytest.skip("the development chain's commit is not in this clone's history")
    archive = subprocess.run(
        [git, "-C", str(ROOT), "archive", DEVELOPMENT_CHAIN, "awa_django", "tests"],
        capture_output=True,
        check=True,
    ).stdout
    old = tmp_path / "development"
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(old, filter="data")
    name = "awa_development_chain"
    admin = psycopg.connect(conninfo(), autocommit=True)
    settings = connection.settings_dict
    url = (
        f"postgresql://{settings['USER']}:{settings['PASSWORD'] or ''}@"
        f"{settings['HOST'] or '127.0.0.1'}:{settings['PORT']}/{name}"
    )
    try:
        admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        admin.execute(f"CREATE DATABASE {name}")
        env = {**os.environ, "DATABASE_URL": url, "DJANGO_SETTINGS_MODULE": "tests.settings"}
        command = [sys.executable, "-m", "django", "migrate", "awa_django", "--verbosity", "0"]
        subprocess.run(
            command, env={**env, "PYTHONPATH": str(old)}, cwd=old, check=True, timeout=300
        )
        subprocess.run(command, env=env, cwd=ROOT, check=True, timeout=300)
        dump = schema_dump()
        with psycopg.connect(url, autocommit=True) as conn:
            upgraded = dump.schema_text(conn).replace(" NOT VALID", "")
            applied = conn.execute("SELECT app, name FROM django_migrations").fetchall()
        with psycopg.connect(conninfo(), autocommit=True) as conn:
            fresh = dump.schema_text(conn)
        fresh, upgraded = _without_extra_queue_slots(fresh), _without_extra_queue_slots(upgraded)
        assert dump.diff(fresh, upgraded) == ""
        assert ("awa_django", "0002_engine") in applied
    finally:
        admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        admin.close()
