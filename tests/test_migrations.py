"""Migrations: install, reverse to zero, concurrent runs, no drift, released files pinned."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from io import StringIO
from pathlib import Path

import psycopg
import pytest
from django.apps import apps
from django.core.management import call_command
from django.db import connection

from tests.helpers import conninfo

pytestmark = pytest.mark.storage

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "awa_django"

# SHA-256 of every released migration file, in `sha256sum` format. A released file is never
# edited: add a new file (and a new Django migration) instead, and append its line here.
RELEASED = {
    path: digest
    for digest, path in (
        line.split(maxsplit=1)
        for line in (ROOT / "tests" / "released_migrations.sha256").read_text().splitlines()
        if line.strip()
    )
}


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_released_migration_files_are_unchanged() -> None:
    changed = {
        name: sha256(ROOT / name)
        for name, digest in RELEASED.items()
        if sha256(ROOT / name) != digest
    }
    assert changed == {}, "released migration files were edited (or a hash is missing)"


def test_every_sql_migration_has_a_django_migration() -> None:
    sql = sorted(p.stem for p in (PACKAGE / "sql" / "migrations").glob("*.sql"))
    django = sorted(p.stem for p in (PACKAGE / "migrations").glob("0*.py"))
    assert sql == django
    assert set(RELEASED) >= {f"awa_django/sql/migrations/{n}.sql" for n in sql}


@pytest.mark.django_db
def test_sqlmigrate_prints_the_sql_file_with_its_lock_and_record() -> None:
    out = StringIO()
    call_command("sqlmigrate", "awa_django", "0002", stdout=out)
    text = out.getvalue()
    assert "pg_advisory_xact_lock(4282180, 0)" in text
    assert "CREATE FUNCTION awa.claim_v1(" in text
    assert "INSERT INTO awa.schema_migrations (name) VALUES ('0002_functions.sql')" in text
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
        "ready_entries": 16,
        "ready_tombstones": 16,
        "done_entries": 16,
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
        # Only the bound checks of 0001 (used by its tables' constraints) remain.
        assert functions_and_views() == (3, 0)
    finally:
        call_command("migrate", "awa_django", verbosity=0)
    assert functions_and_views() == installed
    with connection.cursor() as cursor:
        cursor.execute("SELECT kind, state FROM awa.jobs WHERE id = %s", [job_id])
        assert cursor.fetchall() == [("k", "available")]
    backwards = StringIO()
    call_command("sqlmigrate", "awa_django", "0002", "--backwards", stdout=backwards)
    assert "DROP FUNCTION IF EXISTS" in backwards.getvalue()
    assert "'claim_v1'" in backwards.getvalue() and "'live_jobs'" in backwards.getvalue()


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
            row = conn.execute("SELECT count(*) FROM awa.schema_migrations").fetchone()
            assert row == (len(list((PACKAGE / "sql" / "migrations").glob("*.sql"))),)
            assert conn.execute(
                'SELECT count(*) FROM awa.enqueue_v1(\'[{"kind": "k"}]\')'
            ).fetchone() == (1,)
    finally:
        admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        admin.close()
