"""What keeps one queue schema to one Django project (docs/schema.md): the checks ``migrate``
runs before it creates or drops the schema of ``AWA["SCHEMA"]``, and the question the system
checks and ``awa_worker`` ask of an installed one.

Every refusal raises ``ImproperlyConfigured`` with a message that names the schema and what to
do, before anything is written (``migrate`` also asks before the first migration of any app,
through ``pre_migrate``; the migration asks again under its lock, and its transaction undoes
the schema when the check after ``CREATE SCHEMA`` fails).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from django.apps import AppConfig
from django.core.checks import CheckMessage, Error, Tags, Warning, register
from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError, connections
from django.db.utils import ConnectionHandler
from psycopg import sql

from awa_django.checks import configured_alias, database_config_errors
from awa_django.sql import lock_space, query, roles_blocks, schema

__all__ = [
    "check_advisory",
    "check_before_migrate",
    "check_created",
    "check_install",
    "check_owned",
    "check_queue_schema",
    "schema_messages",
    "schema_problem",
]


def _one(cursor: Any, statement: str, name: str, params: list[Any] | None = None) -> Any:
    """The first column of the one row of ``statement`` for the schema ``name``."""
    cursor.execute(query(statement, name), params)
    row = cursor.fetchone()
    return None if row is None else row[0]


def check_advisory(cursor: Any) -> None:
    """Refuse, with the statement that fixes it, a role that may not take advisory locks here
    (a superuser ran ``awa_roles --lock-advisory`` for another queue of the database before
    this one was installed)."""
    if _one(cursor, "migration_may_lock", "awa"):
        return
    functions = " ".join(
        line.strip()
        for line in roles_blocks()["advisory_functions"].splitlines()
        if not line.startswith("--")
    )
    cursor.execute("SELECT current_user")
    role = cursor.fetchone()[0]
    grant = sql.SQL("GRANT EXECUTE ON {} TO {}").format(sql.SQL(functions), sql.Identifier(role))
    raise ImproperlyConfigured(
        f"the role {role!r} may not take advisory locks in this database (a superuser took "
        f"them from PUBLIC with `awa_roles --lock-advisory` for another queue), and awa_django "
        f"needs them. As a superuser, run first: {grant.as_string(cursor.connection)}; "
        f"(docs/roles.md). Nothing was changed."
    )


def _foreign(cursor: Any, name: str, migration: str) -> str | None:
    """Whose queue the installed schema ``name`` is when not this project's: another database
    role's (it may not be used), or another Django project's (its record of ``migration`` names
    another project's ``django_migrations``); None when it is this project's, or unknown."""
    if not _one(cursor, "migration_schema_usable", name):
        return f"the schema {name!r} holds another database role's queue"
    installed_for = _one(cursor, "migration_installed_for", name, [migration])
    ours = _one(cursor, "migration_project", name)
    if installed_for is not None and ours is not None and installed_for != ours:
        return (
            f"the schema {name!r} holds the queue of another Django project (whose "
            f"django_migrations table is in the schema {installed_for!r}; this project's is "
            f"in {ours!r})"
        )
    return None


def check_owned(cursor: Any, name: str, migration: str) -> None:
    """Refuse to touch the schema ``name`` when another Django project (or database role)
    installed it: the same ``AWA["SCHEMA"]`` in two projects."""
    if not _one(cursor, "migrations_table_exists", name):
        return
    problem = _foreign(cursor, name, migration)
    if problem is not None:
        raise ImproperlyConfigured(
            f"AWA['SCHEMA'] is {name!r}, but {problem}. Two projects cannot share a queue "
            f"schema: give this one an AWA['SCHEMA'] of its own (docs/schema.md). Nothing was "
            f"changed."
        )


def _on_search_path(name: str) -> ImproperlyConfigured:
    return ImproperlyConfigured(
        f"AWA['SCHEMA'] is {name!r}, which is on this connection's search_path (by name or as "
        f'"$user"): Django would create its own tables in the queue\'s schema. Choose another '
        f"AWA['SCHEMA'] or change the search_path (docs/schema.md). Nothing was changed."
    )


def check_install(cursor: Any, name: str, migration: str) -> None:
    """Before the migration that creates the schema ``name``: refuse, with nothing written, a
    schema another project installed, a schema that exists and is not a queue, a name this
    server takes as a keyword, a schema on the connection's search_path (Django would create
    its own tables in it, and reversing the migration would drop them), and a name whose
    advisory-lock key space another queue of the database already uses."""
    if _one(cursor, "schema_exists", name):
        if not _one(cursor, "migrations_table_exists", name):
            raise ImproperlyConfigured(
                f"AWA['SCHEMA'] is {name!r}, a schema that already exists in this database "
                f"and holds no awa_django queue: choose another name (docs/schema.md), or "
                f"drop that schema first. Nothing was changed."
            )
        check_owned(cursor, name, migration)
        return
    if _one(cursor, "migration_schema_keyword", name):
        raise ImproperlyConfigured(
            f"AWA['SCHEMA'] is {name!r}, a keyword of this PostgreSQL server: choose another "
            f"name (docs/schema.md). Nothing was changed."
        )
    if _one(cursor, "migration_schema_on_search_path", name):
        raise _on_search_path(name)
    cursor.execute(query("migration_queue_schemas", name))
    space = lock_space(name)[0]
    for (other,) in cursor.fetchall():
        if other != name and lock_space(other)[0] == space:
            raise ImproperlyConfigured(
                f"AWA['SCHEMA'] is {name!r}, whose advisory-lock key space is that of the "
                f"queue in the schema {other!r} of this database (their names collide in "
                f"CRC-32): choose another name. Nothing was changed."
            )


def check_created(cursor: Any, name: str) -> None:
    """After ``CREATE SCHEMA``, in the migration's transaction: the server's own reading of
    the search_path (``current_schemas``) must not include the new schema."""
    if _one(cursor, "migration_schema_searched", name):
        raise _on_search_path(name)


def schema_problem(cursor: Any, name: str) -> str | None:
    """What is wrong with the installed schema ``name`` for this project, or None: it holds
    no queue, or another project's (``AWA["SCHEMA"]`` changed after ``migrate``)."""
    if not _one(cursor, "migrations_table_exists", name):
        return f"the schema {name!r} holds no awa_django queue"
    return _foreign(cursor, name, "0001_initial")


def schema_messages(alias: str, handler: ConnectionHandler) -> list[CheckMessage]:
    """E010 when the configured schema holds another project's (or role's) queue; W005 when
    Django records awa_django's first migration as applied on ``alias`` but the schema holds
    no queue (``AWA["SCHEMA"]`` changed after ``migrate``); connects."""
    from django.db.migrations.recorder import MigrationRecorder

    name = schema()
    try:
        with handler[alias].cursor() as cursor:
            problem = schema_problem(cursor, name)
        applied = MigrationRecorder(handler[alias]).applied_migrations()
    except DatabaseError:
        return []
    if problem is None:
        return []
    if "holds no awa_django queue" not in problem:
        return [
            Error(
                f"AWA['SCHEMA'] is {name!r}, but {problem}: this project would enqueue into "
                f"and run that queue's jobs.",
                hint="Set AWA['SCHEMA'] to this project's own schema (docs/schema.md).",
                id="awa.E010",
            )
        ]
    if ("awa_django", "0001_initial") not in applied:
        return []  # migrate installs it
    return [
        Warning(
            f"AWA['SCHEMA'] is {name!r}, but that schema holds no awa_django queue, while "
            f"awa_django's migrations are recorded as applied on {alias!r}: they installed the "
            f"queue in another schema, and `migrate` will not create this one.",
            hint=(
                "Set AWA['SCHEMA'] back, or install the queue in the new schema with "
                "`manage.py migrate awa_django zero --fake` then `manage.py migrate awa_django` "
                "(the old schema and its jobs stay where they are; docs/schema.md)."
            ),
            id="awa.W005",
        )
    ]


@register(Tags.database)
def check_queue_schema(
    app_configs: Sequence[AppConfig] | None,
    databases: Iterable[str] | None = None,
    **kwargs: Any,
) -> list[CheckMessage]:
    """awa.E010/W005 (``check --database``, ``migrate``): the configured schema is this
    project's queue, or none yet."""
    alias = configured_alias()
    if alias is None or databases is None or alias not in databases:
        return []
    if database_config_errors(alias, connections):
        return []
    return schema_messages(alias, connections)


def check_before_migrate(*, plan: Any = None, using: str = "default", **kwargs: Any) -> None:
    """``pre_migrate``: before the first migration of any app, refuse a schema that awa_django's
    first migration would refuse, so that a refused ``migrate`` leaves no app half-migrated."""
    if not plan or not any(
        migration.app_label == "awa_django" and migration.name == "0001_initial" and not back
        for migration, back in plan
    ):
        return
    with connections[using].cursor() as cursor:
        check_advisory(cursor)
        check_install(cursor, schema(), "0001_initial")
