"""A database of its own for the least-privilege roles (docs/roles.md), shared by the
``test_roles_*`` modules.

The ``roles_db`` fixture creates six LOGIN roles (owner, app, worker, maintenance, operator,
reader) and a database owned by the owner, migrates it as the owner (a subprocess: the owner is
not a superuser), applies ``awa_roles --apply`` as the owner, then hands out connections and
``manage.py`` runs that log in as each role (a real login, trust authentication on the test
server). Everything is dropped at the end of the session. It needs a superuser connection to
create roles and databases; without one the tests that use it are skipped.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import errors, sql

from awa_django.db.roles import ROLE_KINDS
from tests.jobs import worker_env
from tests.support.awa_schema import RESET_SQL
from tests.support.processes import REPO, ManagedProcess

__all__ = [
    "RolesDB",
    "enqueue_as",
    "refused",
    "roles_db",
    "state_of",
]

_TIMEOUT = 180


@dataclass
class RolesDB:
    """The roles' database: its name, each role's name and a URL that logs in as it."""

    dbname: str
    names: dict[str, str]
    urls: dict[str, str]
    logs: Path
    started: list[ManagedProcess] = field(default_factory=list)

    def connect(self, kind: str) -> psycopg.Connection[Any]:
        """An autocommit connection that logs in as role ``kind``."""
        return psycopg.connect(self.urls[kind], autocommit=True)

    def env(self, kind: str, overrides: dict[str, Any] | None = None) -> dict[str, str]:
        return {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            "DATABASE_URL": self.urls[kind],
            "PYTHONUNBUFFERED": "1",
            **worker_env(**(overrides or {})),
        }

    def django(self, kind: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run ``python -m django ARGS`` with tests.settings to its end, logged in as ``kind``."""
        proc = subprocess.run(
            [sys.executable, "-m", "django", *args],
            cwd=REPO,
            env=self.env(kind),
            capture_output=True,
            text=True,
            timeout=_TIMEOUT,
            check=False,
        )
        if check:
            assert proc.returncode == 0, f"{args[:2]} as {kind}:\n{proc.stdout}\n{proc.stderr}"
        return proc

    def start(
        self, kind: str, *args: str, overrides: dict[str, Any] | None = None
    ) -> ManagedProcess:
        """Start ``python -m django ARGS`` as ``kind`` in its own process group, its output in a
        file; :meth:`stop_all` kills what is still running."""
        argv = [sys.executable, "-m", "django", *args]
        log_path = self.logs / f"{kind}-{len(self.started)}.log"
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                argv,
                cwd=REPO,
                env=self.env(kind, overrides),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.started.append(ManagedProcess(proc, log_path, argv))
        return self.started[-1]

    def stop_all(self) -> None:
        for process in self.started:
            process.kill()
        self.started.clear()

    def shell(self, kind: str, code: str) -> Any:
        """Run ``code`` in ``manage.py shell`` as role ``kind``; return the JSON it printed last."""
        proc = self.django(kind, "shell", "-c", textwrap.dedent(code))
        return json.loads(proc.stdout.strip().splitlines()[-1])

    def reset(self) -> None:
        """Empty every awa table, as the owner (tests/storage_support.py, ``RESET_SQL``)."""
        with self.connect("owner") as conn:
            conn.execute(RESET_SQL)

    def scalar(self, statement: str, params: Any = None) -> Any:
        """One value read as the owner (who may read everything)."""
        with self.connect("owner") as conn:
            row = conn.execute(statement, params).fetchone()
        return None if row is None else row[0]


def _url(server: str, user: str, dbname: str) -> str:
    params = psycopg.conninfo.conninfo_to_dict(server)
    host = params.get("host") or "127.0.0.1"
    port = params.get("port") or "5432"
    return f"postgresql://{user}@{host}:{port}/{dbname}"


def _grant_project_tables(db: RolesDB) -> None:
    """The project's own tables (Django's, the test app's) are the project's to grant, as on any
    Django site: here, row access for every role but the owner."""
    with db.connect("owner") as owner:
        for kind in ROLE_KINDS[1:]:
            role = sql.Identifier(db.names[kind])
            owner.execute(
                sql.SQL(
                    "GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {}"
                ).format(role)
            )
            owner.execute(
                sql.SQL("GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO {}").format(role)
            )


@pytest.fixture(scope="session")
def roles_db(postgres_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RolesDB]:
    admin = psycopg.connect(postgres_url, autocommit=True)
    try:
        row = admin.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user").fetchone()
        if not (row and row[0]):
            pytest.skip("creating roles and a database needs a superuser connection (DATABASE_URL)")
        tag = f"awa_t{os.getpid()}"
        names = {kind: f"{tag}_{kind}" for kind in ROLE_KINDS}
        dbname = f"{tag}_roles"
        created: list[str] = []
        db = RolesDB(
            dbname,
            names,
            {k: _url(postgres_url, n, dbname) for k, n in names.items()},
            tmp_path_factory.mktemp("roles"),
        )
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
            db.django("owner", "migrate", "-v", "0")
            _grant_project_tables(db)
            db.django(
                "owner",
                "awa_roles",
                "--apply",
                *[arg for kind in ROLE_KINDS[1:] for arg in (f"--{kind}", names[kind])],
            )
            yield db
        finally:
            db.stop_all()
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(dbname))
            )
            for name in created:
                admin.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(name)))
    finally:
        admin.close()


def refused(conn: psycopg.Connection[Any], statement: Any, params: Any = None) -> None:
    """``statement`` fails with "permission denied" (SQLSTATE 42501)."""
    with pytest.raises(errors.InsufficientPrivilege):
        conn.execute(statement, params)


def enqueue_as(db: RolesDB, kind: str, queue: str, n: int = 1, **job: Any) -> list[int]:
    """Enqueue ``n`` jobs of ``tests.jobs.common.noop`` into ``queue`` through ``awa.enqueue_v1``,
    logged in as role ``kind``; their ids."""
    jobs = json.dumps([{"kind": "tests.jobs.common.noop", "queue": queue, **job}] * n)
    with db.connect(kind) as conn:
        rows = conn.execute("SELECT job_id FROM awa.enqueue_v1(%s::jsonb)", [jobs]).fetchall()
    return [int(r[0]) for r in rows]


def state_of(db: RolesDB, job_id: int) -> str | None:
    """A job's state as the reader role sees it (None: no such job)."""
    with db.connect("reader") as conn:
        row = conn.execute("SELECT state FROM awa.jobs WHERE id = %s", [job_id]).fetchone()
    return None if row is None else str(row[0])
