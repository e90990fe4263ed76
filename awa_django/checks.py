"""System checks for awa_django (``manage.py check``), with stable ids.

========  ======================================================================================
awa.E001  ``AWA["DATABASE_ALIAS"]`` (or ``AWA["READ_DATABASE_ALIAS"]``) names an alias missing
          from ``DATABASES``.
awa.E002  That alias is not a PostgreSQL database.
awa.E003  Django's PostgreSQL backend runs on psycopg2; awa_django needs psycopg 3.
awa.E004  The PostgreSQL server is older than 15 (database check: ``check --database``, migrate).
awa.E005  Invalid ``AWA`` settings.
awa.E006  The server could not be reached to read its version (database check).
awa.E007  A periodic schedule is invalid: its cron expression, time zone or catch-up policy, a
          malformed ``AWA["PERIODIC"]`` entry, or a name declared twice.
awa.E008  A periodic schedule does not resolve: its job kind is not registered, or its
          arguments or options would be refused at enqueue (registered by
          ``awa_django.periodic``, which needs the job registry).
awa.W001  An ``AWA["QUEUES"]`` concurrency above ``AWA["CONCURRENCY"]``: a worker process runs
          at most ``CONCURRENCY`` jobs at once across its queues, so it can never be reached.
awa.W004  ``AWA["CALLBACK_MAX_BYTES"]`` above Django's ``DATA_UPLOAD_MAX_MEMORY_SIZE``: the
          callback receiver refuses bodies over the smaller of the two (413).
awa.W002  ``PROCESSES * (CONCURRENCY + 7)`` connections (``awa_django.connection_budget``)
          exceed the server's ``max_connections`` (database check).
awa.W003  The alias's connections JIT-compile expensive statements: every read of awa's views
          (the admin's lists, SQL) pays 100 ms to seconds of compilation (database check).
awa.W005  awa_django's migrations are recorded as applied, but ``AWA["SCHEMA"]`` names a
          schema that holds no queue: the setting changed after ``migrate`` (database check,
          registered by ``awa_django.db.schema_guard``).
awa.E010  ``AWA["SCHEMA"]`` names a schema that holds another Django project's (or another
          database role's) queue (likewise).
========  ======================================================================================

All checks are free of side effects. Only E004, E006, E010, W002, W003 and W005 connect, and
only when Django runs database checks (``check --database ALIAS``, ``migrate``); plain
``manage.py check`` does not run them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from django.apps import AppConfig
from django.core.checks import CheckMessage, Error, Tags, Warning, register
from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError, connections
from django.db.utils import ConnectionHandler

from awa_django.conf import AwaSettings, get_awa_settings, import_job_middleware
from awa_django.connection_budget import connection_budget, own_connections
from awa_django.cron import declared
from awa_django.sql import query

MIN_SERVER_VERSION = 150000
"""PostgreSQL 15, as ``server_version_num``."""


@register()
def check_settings(app_configs: Sequence[AppConfig] | None, **kwargs: Any) -> list[CheckMessage]:
    """awa.E005: the ``AWA`` dict is valid."""
    try:
        get_awa_settings()
    except ImproperlyConfigured as exc:
        return [Error(str(exc), hint="Fix settings.AWA; see docs/configuration.md.", id="awa.E005")]
    return []


@register()
def check_job_middleware(
    app_configs: Sequence[AppConfig] | None, **kwargs: Any
) -> list[CheckMessage]:
    """awa.E009: every ``AWA["JOB_MIDDLEWARE"]`` entry imports and is callable. A wrong entry
    would fail every job it wraps."""
    try:
        cfg = get_awa_settings()
    except ImproperlyConfigured:
        return []  # awa.E005's to report
    errors: list[CheckMessage] = []
    for path in cfg.JOB_MIDDLEWARE:
        try:
            import_job_middleware(path)
        except (ImportError, TypeError) as exc:
            errors.append(
                Error(
                    str(exc),
                    hint="Fix AWA['JOB_MIDDLEWARE'] (docs/jobs.md, \"Job middleware\"); until "
                    "then every job fails with this error.",
                    id="awa.E009",
                )
            )
    return errors


@register()
def check_schedules(app_configs: Sequence[AppConfig] | None, **kwargs: Any) -> list[CheckMessage]:
    """awa.E007: every declared periodic schedule (``@job(cron=...)``, ``AWA["PERIODIC"]``) has
    a valid cron expression, time zone and catch-up policy, and a name of its own. An invalid
    schedule is not synced, so it never fires and never reaches the leader."""
    try:
        cfg = get_awa_settings()
    except ImproperlyConfigured:
        return []  # awa.E005's to report
    _, problems = declared(cfg.PERIODIC)
    return [
        Error(
            problem,
            hint="Fix the schedule (docs/periodic.md); until then it is not synced and does "
            "not fire.",
            id="awa.E007",
        )
        for problem in problems
    ]


@register()
def check_concurrency(app_configs: Sequence[AppConfig] | None, **kwargs: Any) -> list[CheckMessage]:
    """awa.W001: no queue's concurrency is above the per-process ``CONCURRENCY``."""
    try:
        cfg = get_awa_settings()
    except ImproperlyConfigured:
        return []
    return concurrency_warnings(cfg)


@register()
def check_callback_size(
    app_configs: Sequence[AppConfig] | None, **kwargs: Any
) -> list[CheckMessage]:
    """awa.W004: the callback receiver's body limit is not above Django's upload limit."""
    from django.conf import settings

    try:
        cfg = get_awa_settings()
    except ImproperlyConfigured:
        return []
    upload = getattr(settings, "DATA_UPLOAD_MAX_MEMORY_SIZE", 2_621_440)
    if upload is None or upload >= cfg.CALLBACK_MAX_BYTES:
        return []
    return [
        Warning(
            f"AWA['CALLBACK_MAX_BYTES'] is {cfg.CALLBACK_MAX_BYTES:,}, but Django's "
            f"DATA_UPLOAD_MAX_MEMORY_SIZE is {upload:,}: the callback receiver refuses bodies "
            "over the smaller one (413).",
            hint="Raise DATA_UPLOAD_MAX_MEMORY_SIZE or lower AWA['CALLBACK_MAX_BYTES']; see "
            "docs/callbacks.md.",
            id="awa.W004",
        )
    ]


def concurrency_warnings(cfg: AwaSettings) -> list[CheckMessage]:
    """W001 for each ``AWA["QUEUES"]`` entry whose concurrency exceeds ``CONCURRENCY``."""
    return [
        Warning(
            f"AWA['QUEUES'][{name!r}]['concurrency'] is {queue.concurrency}, but a worker process "
            f"runs at most AWA['CONCURRENCY'] = {cfg.CONCURRENCY} jobs at once across all its "
            "queues, so this queue never runs more than that.",
            hint="Raise AWA['CONCURRENCY'] (or start workers with --concurrency), or lower the "
            "queue's concurrency; see docs/configuration.md.",
            id="awa.W001",
        )
        for name, queue in cfg.QUEUES.items()
        if queue.concurrency is not None and queue.concurrency > cfg.CONCURRENCY
    ]


@register()
def check_database(app_configs: Sequence[AppConfig] | None, **kwargs: Any) -> list[CheckMessage]:
    """awa.E001-E003: the configured aliases (``DATABASE_ALIAS``, and ``READ_DATABASE_ALIAS``
    when set) exist, are PostgreSQL and run on psycopg 3."""
    alias = configured_alias()
    if alias is None:
        return []  # invalid settings are awa.E005's to report
    errors = database_config_errors(alias, connections)
    read = get_awa_settings().READ_DATABASE_ALIAS
    if read is not None and read != alias:
        errors += database_config_errors(read, connections, setting="READ_DATABASE_ALIAS")
    return errors


@register(Tags.database)
def check_server_version(
    app_configs: Sequence[AppConfig] | None,
    databases: Iterable[str] | None = None,
    **kwargs: Any,
) -> list[CheckMessage]:
    """awa.E004/E006: the server is PostgreSQL 15 or newer; awa.W002: it allows enough
    connections for the workers. Runs only with ``--database`` (and in ``migrate``)."""
    alias = configured_alias()
    if alias is None or databases is None or alias not in databases:
        return []
    if database_config_errors(alias, connections):
        return []  # nothing sensible to connect to
    errors = server_version_errors(alias, connections)
    if errors:
        return errors
    return [
        *connection_budget_warnings(alias, connections, get_awa_settings()),
        *jit_warnings(alias, connections),
    ]


def _server_row(
    alias: str, handler: ConnectionHandler, name: str, params: Any = None
) -> tuple[Any, ...] | None:
    """The one row of the named query on ``alias``'s connection; None when there is none or
    the server cannot be reached (E006 reports that)."""
    try:
        with handler[alias].cursor() as cursor:
            cursor.execute(query(name), params)
            row = cursor.fetchone()
    except DatabaseError:
        return None
    return None if row is None else tuple(row)


def jit_warnings(alias: str, handler: ConnectionHandler) -> list[CheckMessage]:
    """W003 when ``alias``'s connections would JIT-compile statements (a server built with
    LLVM and ``jit`` on, the default of most packages and managed services); connects."""
    row = _server_row(alias, handler, "jit_in_use")
    if not (row and row[0]):
        return []
    return [
        Warning(
            f"Database {alias!r} JIT-compiles expensive statements: awa_django's views span "
            "dozens of partitions, so each read of them in the admin or in SQL pays from "
            "100 ms to seconds of compilation for a few rows. awa_django's read functions and "
            "workers turn JIT off for themselves; the views cannot.",
            hint=f"Add 'options': '-c jit=off' to DATABASES[{alias!r}]['OPTIONS'], or run "
            "ALTER ROLE <role> SET jit = off (docs/configuration.md, 'PostgreSQL settings').",
            id="awa.W003",
        )
    ]


def connection_budget_warnings(
    alias: str, handler: ConnectionHandler, cfg: AwaSettings
) -> list[CheckMessage]:
    """W002 when ``PROCESSES`` worker processes of ``CONCURRENCY`` handler threads each could
    need more connections than the server's ``max_connections``: the count of
    :func:`awa_django.connection_budget.connection_budget` (every handler thread may hold a Django
    connection, and each process holds its own claim, finalize, heartbeat, sweep, LISTEN and
    election connections plus one for async handlers' ORM calls); connects."""
    own = own_connections(listen=cfg.NOTIFY)
    needed = connection_budget(cfg.PROCESSES, cfg.CONCURRENCY, listen=cfg.NOTIFY)
    row = _server_row(alias, handler, "connection_budget", {"mine": None})
    if row is None:
        return []  # E006 reports an unreachable server
    maximum = int(row[0])  # max_connections less the reserved slots
    if needed <= maximum:
        return []
    return [
        Warning(
            f"AWA['PROCESSES'] = {cfg.PROCESSES} worker processes running AWA['CONCURRENCY'] = "
            f"{cfg.CONCURRENCY} jobs at once each may need {cfg.PROCESSES} x "
            f"({cfg.CONCURRENCY} + {own}) = {needed} connections to database {alias!r}, which "
            f"allows {maximum} (max_connections less its reserved slots).",
            hint="Lower AWA['CONCURRENCY'] or AWA['PROCESSES'], or raise max_connections; "
            "remember the web processes and every other worker host (docs/deployment.md, "
            '"Connection budget").',
            id="awa.W002",
        )
    ]


def database_config_errors(
    alias: str, handler: ConnectionHandler, *, setting: str = "DATABASE_ALIAS"
) -> list[CheckMessage]:
    """E001-E003 for ``alias`` (the value of ``AWA[setting]``) in ``handler``, without
    connecting."""
    if alias not in handler.settings:
        return [
            Error(
                f"AWA[{setting!r}] is {alias!r}, which is not in DATABASES "
                f"(aliases: {', '.join(handler.settings) or 'none'}).",
                hint=f"Add that alias to DATABASES or point AWA[{setting!r}] at one.",
                id="awa.E001",
            )
        ]
    connection = handler[alias]
    if connection.vendor != "postgresql":
        return [
            Error(
                f"awa_django needs PostgreSQL, but database {alias!r} uses "
                f"{handler.settings[alias]['ENGINE']!r}.",
                hint="Use ENGINE 'django.db.backends.postgresql' for this alias.",
                id="awa.E002",
            )
        ]
    # The backend binds the DB-API module it imported (psycopg or psycopg2) to its wrapper
    # class as ``Database``; django-stubs does not declare the attribute.
    driver: str = connection.Database.__name__  # type: ignore[attr-defined]
    if driver != "psycopg":
        return [
            Error(
                f"awa_django needs psycopg 3, but database {alias!r} runs on {driver}.",
                hint="pip install 'psycopg[binary]' (Django prefers psycopg 3 when installed).",
                id="awa.E003",
            )
        ]
    return []


def server_version_errors(alias: str, handler: ConnectionHandler) -> list[CheckMessage]:
    """E004 (server too old) or E006 (unreachable) for ``alias``; connects."""
    from django.db.backends.postgresql.base import DatabaseWrapper

    connection = handler[alias]
    assert isinstance(connection, DatabaseWrapper)  # guaranteed by database_config_errors()
    try:
        connection.ensure_connection()
        version = connection.pg_version
    except DatabaseError as exc:
        return [
            Error(
                f"Could not connect to database {alias!r} to check its PostgreSQL version: "
                f"{str(exc).strip()}",
                hint="Is the server running, and are the DATABASES credentials right?",
                id="awa.E006",
            )
        ]
    return version_errors(alias, version)


def version_errors(alias: str, version: int) -> list[CheckMessage]:
    """E004 if ``version`` (``server_version_num``) is older than PostgreSQL 15."""
    if version >= MIN_SERVER_VERSION:
        return []
    return [
        Error(
            f"awa_django needs PostgreSQL 15 or newer; database {alias!r} runs "
            f"{_format_version(version)}.",
            hint="Upgrade the server.",
            id="awa.E004",
        )
    ]


def _format_version(version: int) -> str:
    major, minor = divmod(version, 10000)
    return f"PostgreSQL {major}.{minor}" if major >= 10 else f"PostgreSQL {version}"


def configured_alias() -> str | None:
    """``AWA["DATABASE_ALIAS"]``, or None when the settings are invalid (E005 says why)."""
    try:
        return get_awa_settings().DATABASE_ALIAS
    except ImproperlyConfigured:
        return None
