"""System checks: stable ids, no side effects, database checks only on request."""

from __future__ import annotations

import types

import pytest
from django.core.checks import CheckMessage, Tags, run_checks
from django.db import connection
from django.db.utils import ConnectionHandler
from django.test import override_settings

from awa_django import checks


def awa_ids(messages: list[CheckMessage]) -> list[str]:
    return [m.id for m in messages if m.id and m.id.startswith("awa.")]


def handler(**aliases: dict[str, object]) -> ConnectionHandler:
    """A private ConnectionHandler: DATABASES for one test, without touching settings."""
    return ConnectionHandler({"default": dict(connection.settings_dict), **aliases})


def test_the_test_settings_pass_every_check() -> None:
    assert awa_ids(run_checks()) == []


def test_e001_alias_missing_from_databases() -> None:
    with override_settings(AWA={"DATABASE_ALIAS": "queue"}):
        messages = run_checks()
    assert awa_ids(messages) == ["awa.E001"]
    assert "'queue', which is not in DATABASES (aliases: " in messages[-1].msg
    assert "default, repeatable" in messages[-1].msg


def test_e001_read_alias_missing_from_databases() -> None:
    with override_settings(AWA={"READ_DATABASE_ALIAS": "replica"}):
        messages = run_checks()
    assert awa_ids(messages) == ["awa.E001"]
    assert messages[-1].msg.startswith("AWA['READ_DATABASE_ALIAS'] is 'replica', which is not")
    with override_settings(AWA={"READ_DATABASE_ALIAS": "repeatable"}):
        assert awa_ids(run_checks()) == []


def test_e002_alias_is_not_postgresql() -> None:
    dbs = handler(other={"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"})
    messages = checks.database_config_errors("other", dbs)
    assert awa_ids(messages) == ["awa.E002"]
    assert "'django.db.backends.sqlite3'" in messages[0].msg


def test_e003_backend_runs_on_psycopg2(monkeypatch: pytest.MonkeyPatch) -> None:
    dbs = handler()
    monkeypatch.setattr(dbs["default"], "Database", types.ModuleType("psycopg2"))
    messages = checks.database_config_errors("default", dbs)
    assert awa_ids(messages) == ["awa.E003"]
    assert "runs on psycopg2" in messages[0].msg


def test_postgresql_on_psycopg3_passes_without_connecting() -> None:
    dbs = handler()
    assert checks.database_config_errors("default", dbs) == []
    assert dbs["default"].connection is None


def test_e005_invalid_settings_are_reported_not_raised() -> None:
    with override_settings(AWA={"POLL_INTERVL": 1}):
        messages = run_checks()
    assert awa_ids(messages) == ["awa.E005"]
    assert "Did you mean 'POLL_INTERVAL'?" in messages[0].msg


def test_only_the_version_check_is_a_database_check() -> None:
    # Django runs database-tagged checks only for `check --database` and migrate. The other
    # checks run everywhere (this test has no database access: a connection would fail).
    assert Tags.database in checks.check_server_version.tags  # type: ignore[attr-defined]
    assert Tags.database not in checks.check_database.tags  # type: ignore[attr-defined]
    assert Tags.database not in checks.check_settings.tags  # type: ignore[attr-defined]


@pytest.mark.django_db
def test_e004_passes_on_the_live_server() -> None:
    assert awa_ids(run_checks(databases=["default"])) == []
    assert connection.pg_version >= checks.MIN_SERVER_VERSION  # type: ignore[attr-defined]


@pytest.mark.parametrize(("version", "ids"), [(140012, ["awa.E004"]), (150000, []), (180006, [])])
def test_e004_rejects_servers_older_than_15(version: int, ids: list[str]) -> None:
    messages = checks.version_errors("default", version)
    assert awa_ids(messages) == ids
    if ids:
        assert "runs PostgreSQL 14.12" in messages[0].msg


@pytest.mark.django_db
def test_e006_unreachable_server_is_a_clean_error() -> None:
    unreachable = {
        **connection.settings_dict,
        "HOST": "127.0.0.1",
        "PORT": "1",
        "OPTIONS": {"connect_timeout": 2},
    }
    dbs = handler(down=unreachable)
    messages = checks.server_version_errors("down", dbs)
    assert awa_ids(messages) == ["awa.E006"]
    assert "Could not connect to database 'down'" in messages[0].msg


def test_w001_a_queue_concurrency_above_the_process_concurrency() -> None:
    with override_settings(
        AWA={"CONCURRENCY": 8, "QUEUES": {"bulk": {"concurrency": 20}, "mail": {"concurrency": 8}}}
    ):
        messages = run_checks()
    assert awa_ids(messages) == ["awa.W001"]
    [warning] = [m for m in messages if m.id == "awa.W001"]
    assert "AWA['QUEUES']['bulk']['concurrency'] is 20" in warning.msg
    assert "at most AWA['CONCURRENCY'] = 8 jobs at once across all its queues" in warning.msg


def test_w004_callback_bodies_above_djangos_upload_limit() -> None:
    with override_settings(AWA={"CALLBACK_MAX_BYTES": 4_000_000}):
        messages = run_checks()
    assert awa_ids(messages) == ["awa.W004"]
    assert "DATA_UPLOAD_MAX_MEMORY_SIZE is 2,621,440" in messages[0].msg
    with override_settings(
        AWA={"CALLBACK_MAX_BYTES": 4_000_000}, DATA_UPLOAD_MAX_MEMORY_SIZE=5_000_000
    ):
        assert awa_ids(run_checks()) == []


def test_only_the_version_and_connection_checks_connect() -> None:
    assert Tags.database not in checks.check_concurrency.tags  # type: ignore[attr-defined]


@pytest.mark.django_db
def test_w002_more_worker_connections_than_the_server_allows() -> None:
    from awa_django.conf import load_settings

    fleet = load_settings({"PROCESSES": 256, "CONCURRENCY": 10_000})
    dbs = handler()
    try:
        messages = checks.connection_budget_warnings("default", dbs, fleet)
        assert checks.connection_budget_warnings("default", dbs, load_settings({})) == []
    finally:
        dbs.close_all()
    assert awa_ids(messages) == ["awa.W002"]
    assert "256 x (10000 + 7) = 2561792 connections" in messages[0].msg


def test_connection_budget_counts_every_connection_of_a_worker() -> None:
    from awa_django.worker.config import OWN_CONNECTIONS, connection_budget, own_connections

    assert OWN_CONNECTIONS == ("claim", "finalize", "heartbeat", "sweep", "listen", "leader")
    assert own_connections() == 7  # the six above + the async handlers' sync_to_async thread
    assert own_connections(listen=False) == own_connections(maintenance=False) == 6
    assert connection_budget(2, 32) == 78  # the defaults' worst case, under max_connections 100
    assert connection_budget(2, 4) == 22
    assert connection_budget(2, 9999, maintenance=False) == 20010


@pytest.mark.django_db
def test_w002_is_a_database_check() -> None:
    with override_settings(AWA={"PROCESSES": 256, "CONCURRENCY": 10_000}):
        assert "awa.W002" not in awa_ids(run_checks())
        assert awa_ids(run_checks(databases=["default"])) == ["awa.W002"]


@pytest.mark.storage  # the pg15 lane's Debian server has JIT; the embedded one has not
@pytest.mark.django_db
def test_w003_warns_while_the_connection_would_jit_compile() -> None:
    with_jit = dict(connection.settings_dict)
    with_jit["OPTIONS"] = {**with_jit.get("OPTIONS", {}), "options": "-c jit=on"}
    dbs = handler(default=with_jit, quiet=dict(connection.settings_dict))
    try:
        with dbs["default"].cursor() as cursor:
            cursor.execute("SELECT pg_jit_available()")
            available = cursor.fetchone() == (True,)
        messages = checks.jit_warnings("default", dbs)
        assert checks.jit_warnings("quiet", dbs) == []  # the test settings turn it off
    finally:
        dbs.close_all()
    assert awa_ids(messages) == (["awa.W003"] if available else [])


@pytest.mark.django_db(transaction=True)
def test_worker_connections_never_jit_compile() -> None:
    import asyncio

    from awa_django.db.connection import connect_async

    async def settings() -> tuple[object, ...] | None:
        conn = await connect_async("default", application_name="awa:test")
        try:
            cursor = await conn.execute(
                "SELECT current_setting('jit'), current_setting('default_transaction_isolation')"
            )
            return await cursor.fetchone()
        finally:
            await conn.close()

    assert asyncio.run(settings()) == ("off", "read committed")


# -- the django.tasks backend's checks (AwaTaskBackend.check) -------------------------------------


def tasks_backend_messages(options: dict[str, object], **params: object) -> list[CheckMessage]:
    from awa_django.backends.tasks import AwaTaskBackend

    return list(AwaTaskBackend("emails", {"OPTIONS": options, **params}).check())


def test_e101_says_awa_django_is_not_installed_and_hints_how_to_install_it() -> None:
    from django.conf import settings

    without = [app for app in settings.INSTALLED_APPS if app != "awa_django"]
    with override_settings(INSTALLED_APPS=without):
        [message] = tasks_backend_messages({})
    assert message.id == "awa.E101"
    assert message.msg == (
        "TASKS['emails'] uses AwaTaskBackend, but awa_django is not in INSTALLED_APPS."
    )
    assert message.hint is not None
    assert message.hint.startswith("Add 'awa_django' to INSTALLED_APPS and run manage.py migrate")


def test_e102_says_which_database_is_wrong_and_hints_at_a_postgresql_alias() -> None:
    from django.db import connections

    # Other test modules may add aliases for the whole session (the read-replica tests do).
    aliases = ", ".join(connections.settings)
    assert {"default", "repeatable"} <= set(connections.settings)
    [message] = tasks_backend_messages({"database": "queue"})
    assert message.id == "awa.E102"
    assert message.msg == (
        "TASKS['emails']: OPTIONS['database'] is 'queue', which is not in DATABASES "
        f"(aliases: {aliases})."
    )
    assert message.hint == (
        "Name a PostgreSQL alias of DATABASES, or remove OPTIONS['database'] to use "
        "AWA['DATABASE_ALIAS']."
    )
    assert tasks_backend_messages({"database": "repeatable"}) == []


@pytest.mark.parametrize(
    ("options", "params", "problem", "remedy"),
    [
        (
            {"max_attempt": 3},
            {},
            "TASKS['emails']: unknown OPTIONS 'max_attempt'.",
            "Remove or rename them (did you mean 'max_attempts' for 'max_attempt'?)",
        ),
        (
            {"max_attempts": 0},
            {},
            "TASKS['emails']: OPTIONS['max_attempts'] is 0, not an int in 1..1000.",
            "Give an int in 1..1000",
        ),
        (
            {"deadline": -1},
            {},
            "TASKS['emails']: OPTIONS['deadline'] is invalid: deadline: -1 is not a number",
            "Give one attempt's time limit as a positive number of seconds",
        ),
        (
            {"tags": "billing"},
            {},
            "TASKS['emails']: OPTIONS['tags'] is invalid: tags: must be a list of strings",
            "Give a list of strings",
        ),
        (
            {"retry": {"base": -1}},
            {},
            "TASKS['emails']: OPTIONS['retry'] is invalid: retry: base:",
            "Give an awa_django.RetryPolicy or a dict of its fields",
        ),
        (
            {},
            {"QUEUES": ["Mail"]},
            "TASKS['emails']: QUEUES: 'Mail' is not a valid queue name",
            "Rename the queue",
        ),
    ],
    ids=["unknown", "max_attempts", "deadline", "tags", "retry", "queues"],
)
def test_e103_says_what_is_wrong_in_msg_and_what_to_do_in_hint(
    options: dict[str, object], params: dict[str, object], problem: str, remedy: str
) -> None:
    [message] = tasks_backend_messages(options, **params)
    assert message.id == "awa.E103"
    assert message.msg.startswith(problem)
    assert message.hint is not None and message.hint.startswith(remedy)
    assert remedy not in message.msg


def test_every_awa_check_puts_its_remedy_in_the_hint() -> None:
    core: list[CheckMessage] = []
    for awa in (
        {"POLL_INTERVL": 1},
        {
            "DATABASE_ALIAS": "queue",
            "CALLBACK_MAX_BYTES": 4_000_000,
            "CONCURRENCY": 2,
            "QUEUES": {"bulk": {"concurrency": 3}},
        },
    ):
        with override_settings(AWA=awa):
            core += [m for m in run_checks() if m.id and m.id.startswith("awa.")]
    backend = tasks_backend_messages({"database": "nope", "colour": 1, "max_attempts": 0})
    assert {m.id for m in core + backend} == {
        "awa.E001",
        "awa.E005",
        "awa.W001",
        "awa.W004",
        "awa.E102",
        "awa.E103",
    }
    for message in core + backend:
        assert message.hint, f"{message.id} has no hint: {message.msg}"
