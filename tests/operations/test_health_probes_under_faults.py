"""Health probes (docs/observability.md, "Health probes") when things go wrong: a database server
that hangs, a lock on the control tables, an unmigrated database, bad arguments, requests of
other methods or with too many parameters. Each test states the documented behaviour it checks.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable

import psycopg
import pytest

from tests.support.database import conninfo, database_url
from tests.support.observability_probes import run_python
from tests.support.processes import REPO, ManagedProcess

pytestmark = pytest.mark.usefixtures("clean_awa")


def test_health_command_huge_stale_after_is_a_usage_error_not_a_database_failure(
    manage_py: Callable[..., ManagedProcess],
) -> None:
    """``--stale-after 1e300`` passes the command's own check (finite, above 0) and then makes
    PostgreSQL's make_interval overflow: the probe says "database error: interval out of range"
    (exit 1), blaming a healthy database. A bad argument must exit 2 (docs: "bad arguments exit
    with status 2"), or the value be capped."""
    for value in ("1e300", "1e308"):
        probe = manage_py("awa_health", "--no-leader", "--stale-after", value)
        code = probe.wait(60)
        assert "database error" not in probe.output(), probe.output()
        assert code == 2, (value, code, probe.output())


def test_health_view_answers_when_the_database_server_hangs(hung_server: str) -> None:
    """docs: the view answers 503 "when one fails (the database unreachable included)", and
    the database check fails when "a check's statement fails or runs past 5 s". Against a
    server that accepts the connection but never answers (frozen PostgreSQL), the view never
    answers at all: no connect timeout, and statement_timeout is enforced by the frozen server
    itself. Every probe then pins a web worker thread forever."""
    code = (
        "import django; django.setup()\n"
        "from django.test import Client\n"
        "r = Client(raise_request_exception=False).get('/awa/health/')\n"
        "print(r.status_code)\n"
    )
    started = time.monotonic()
    done = run_python(code, {"DATABASE_URL": hung_server}, timeout=40)
    assert done is not None, (
        f"the health view did not answer within {time.monotonic() - started:.0f} s "
        "against a server that does not answer"
    )
    assert done.stdout.strip() == "503", done.stdout + done.stderr


def test_health_command_ends_when_the_database_server_hangs(hung_server: str) -> None:
    """The same for ``manage.py awa_health``: it hangs forever instead of exiting 1 with
    "database error: ..." (a systemd or cron probe without its own timeout never ends)."""
    started = time.monotonic()
    try:
        done = subprocess.run(
            [sys.executable, "-m", "django", "awa_health", "--no-worker"],
            cwd=REPO,
            env={
                **os.environ,
                "DJANGO_SETTINGS_MODULE": "tests.settings",
                "DATABASE_URL": hung_server,
            },
            capture_output=True,
            text=True,
            timeout=40,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"awa_health still running after {time.monotonic() - started:.0f} s")
    assert done.returncode == 1, done
    assert "database" in done.stderr, done.stderr


def test_health_view_other_methods_get_405_not_a_csrf_page() -> None:
    """docs: "other methods get 405". With Django's CsrfViewMiddleware (in every default
    project, and in tests.settings) a POST, PUT, PATCH or DELETE never reaches the view's
    require_GET: the answer is the CSRF failure page, 403 text/html."""
    from django.test import Client

    client = Client(raise_request_exception=False, enforce_csrf_checks=True)
    for method in ("post", "put", "patch", "delete"):
        response = getattr(client, method)("/awa/health/?leader=0")
        assert response.status_code == 405, (method, response.status_code, response["Content-Type"])


def test_health_view_too_many_parameters_is_a_json_400() -> None:
    """docs: "a bad parameter is a 400 with {"error": ...}". 1,001 ``max_lag`` values (past
    DATA_UPLOAD_MAX_NUMBER_FIELDS) get Django's HTML "Bad Request (400)" page instead: a
    probe client that parses the JSON body chokes."""
    from django.test import Client

    client = Client(raise_request_exception=False)
    response = client.get("/awa/health/?" + "&".join(["max_lag=5"] * 1001))
    assert response.status_code == 400
    assert response["Content-Type"] == "application/json", response.content[:200]
    assert "error" in response.json()


def test_health_view_a_lock_on_the_control_tables_is_a_prompt_503() -> None:
    """A DB error mid-query: another session holds an ACCESS EXCLUSIVE lock on
    awa.runtime_instances (a migration, a VACUUM FULL). The view must answer 503 with a
    database check, within its documented bounds (1 s lock timeout, 5 s statement timeout),
    and never a 500."""
    from django.test import Client

    from tests.support.database import pg

    with pg(autocommit=False) as locker:
        locker.execute("LOCK TABLE awa.runtime_instances IN ACCESS EXCLUSIVE MODE")
        started = time.monotonic()
        response = Client(raise_request_exception=False).get("/awa/health/?host=web-1")
        elapsed = time.monotonic() - started
        locker.rollback()
    assert response.status_code == 503, response.content[:300]
    body = response.json()
    assert body["status"] == "unhealthy" and not body["checks"]["database"]["ok"], body
    assert elapsed < 6, elapsed
    assert "no-store" in response["Cache-Control"]


def test_health_without_checks_on_an_unmigrated_database_is_unhealthy(
    manage_py: Callable[..., ManagedProcess],
) -> None:
    """``awa_health --no-worker --no-leader`` said "database reachable" (exit 0) on a database
    that was never migrated; it now checks that the awa schema is installed."""
    from django.db import connection

    db = connection.settings_dict
    server = psycopg.conninfo.make_conninfo(conninfo(), dbname="postgres")
    name = "awa_health_unmigrated"
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        url = database_url({**db, "NAME": name})
        probe = manage_py(
            "awa_health", "--no-worker", "--no-leader", extra_env={"DATABASE_URL": url}
        )
        assert probe.wait(60) == 1, probe.output()
        assert "the awa schema is not installed" in probe.output(), probe.output()
    finally:
        with psycopg.connect(server, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
