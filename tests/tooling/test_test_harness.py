"""The test harness itself: polling, database URLs, and real manage.py subprocesses."""

from __future__ import annotations

import signal
from collections.abc import Callable

import pytest
from django.db import connection

from tests.settings import database_settings
from tests.support.database import database_url
from tests.support.polling import WaitTimeout, wait_for
from tests.support.processes import ManagedProcess

ManagePy = Callable[..., ManagedProcess]


def test_wait_for_returns_the_first_truthy_value() -> None:
    calls = iter([None, 0, "ready"])
    assert wait_for(lambda: next(calls), timeout=5, interval=0) == "ready"


def test_wait_for_raises_with_the_message() -> None:
    with pytest.raises(WaitTimeout, match=r"timed out after 0.05s waiting for the moon"):
        wait_for(lambda: False, timeout=0.05, interval=0.01, message=lambda: "the moon")


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://postgres@127.0.0.1:5432/test_postgres",
        "postgresql://app:s%40cret%2F@db.internal:6543/app_db",
        "postgresql://app@/%2Fvar%2Frun%2Fpostgresql%2Fapp_db",
        "postgresql://app@:5433/%2Ftmp%2Fapp_db",
        "postgresql://app@db/app_db?sslmode=require",
    ],
)
def test_database_url_inverts_django_environ(url: str) -> None:
    settings_dict = database_settings(url)
    assert database_settings(database_url(settings_dict)) == settings_dict


def test_manage_py_runs_against_the_test_database(manage_py: ManagePy) -> None:
    name = connection.settings_dict["NAME"]
    assert name.startswith("test_")
    proc = manage_py(
        "shell", "-c", "from django.db import connection; print(connection.settings_dict['NAME'])"
    )
    assert proc.wait(60) == 0, proc.output()
    assert proc.output().strip().splitlines()[-1] == name


def test_manage_py_sees_a_migrated_database(manage_py: ManagePy) -> None:
    proc = manage_py("migrate", "--check")
    assert proc.wait(60) == 0, proc.output()


def test_manage_py_check_with_database_checks(manage_py: ManagePy) -> None:
    proc = manage_py("check", "--database", "default", "--fail-level", "WARNING")
    assert proc.wait(60) == 0, proc.output()
    assert "System check identified no issues" in proc.output()


def test_manage_py_processes_can_be_signalled(manage_py: ManagePy) -> None:
    proc = manage_py("shell", "-c", "import signal; print('up', flush=True); signal.pause()")
    wait_for(lambda: "up" in proc.output(), timeout=30, message=proc.output)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(10) == -signal.SIGTERM
