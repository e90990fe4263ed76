"""The Django migration operation that installs awa_django's SQL schema files."""

from __future__ import annotations

import re
from typing import Any

from django.db import migrations
from django.db.backends.base.schema import BaseDatabaseSchemaEditor
from django.db.migrations.state import ProjectState

from awa_django.db.schema_guard import check_advisory, check_created, check_install, check_owned
from awa_django.sql import query, schema, sql_file

__all__ = ["RunAwaSQL"]

_VIEWS = r"^CREATE OR REPLACE VIEW {schema}\.(\w+)"
_FUNCTIONS = r"^CREATE OR REPLACE FUNCTION {schema}\.(\w+)\("
_TRIGGERS = r"^CREATE OR REPLACE TRIGGER (\w+) .*? ON {schema}\.(\w+)"
_NAME = re.compile(r"[a-z_][a-z0-9_]*")


def _text_array(names: list[str]) -> str:
    """``ARRAY['a', 'b']::text[]`` of names checked to be plain lower-case identifiers."""
    for name in names:
        if _NAME.fullmatch(name) is None:  # pragma: no cover - the packaged files are checked
            raise ValueError(f"unexpected object name {name!r} in an awa_django SQL file")
    return "ARRAY[" + ", ".join(f"'{name}'" for name in names) + "]::text[]"


class RunAwaSQL(migrations.RunSQL):
    """Run awa_django schema files (``awa_django/sql/``), rendered, as one script, once.

    A ``RunSQL`` whose SQL is the files' text, so ``manage.py sqlmigrate awa_django NNNN``
    prints the script a DBA can run by hand: the migration lock, the files, and the migration's
    row in ``awa.schema_migrations`` (``name``).

    Guarantees:

    * Concurrent ``migrate`` runs are serialised by a transaction-scoped advisory lock (class
      4282180); a run that finds the migration already applied (recorded in
      ``awa.schema_migrations``) skips it, so two ``migrate`` processes started at once both
      succeed.
    * The files' text comes from the installed package (``awa_django.sql.sql_file``).
    * Reversal is derived, never hand-kept: a migration that creates the schema
      (``drop_schema=True``) drops the whole ``awa`` schema; any other drops the views,
      triggers and functions its files create and forgets its record. Tables and their rows
      stay. Nothing cascades: a view or function of the user's that depends on one of them
      stops the reversal (SQLSTATE 2BP01) with nothing dropped.
    * One schema, one project: each record names the schema of the Django project's own
      ``django_migrations`` table, and a migration of another project (the same
      ``AWA["SCHEMA"]`` in two projects) is refused either way with ``ImproperlyConfigured``,
      nothing changed. Before the schema is created, a name the server takes as a keyword, a
      schema that exists and is not a queue, one on the connection's ``search_path`` and one
      whose advisory-lock key space another queue of the database uses are refused too.
    """

    reduces_to_sql = True
    atomic = True

    def __init__(self, *files: str, name: str, drop_schema: bool = False) -> None:
        self.files = files
        self.name = name
        self.drop_schema = drop_schema
        self.schema = schema()
        self.script = "\n".join(sql_file(path) for path in files)
        reverse_sql_text = query("schema_drop") if drop_schema else query("migration_forget")
        if not drop_schema:
            reverse_sql_text = f"{self._drop_created()};\n{reverse_sql_text}"
        super().__init__(sql=self.script, reverse_sql=reverse_sql_text)

    def _drop_created(self) -> str:
        """The statement that drops the views, triggers and functions the files create."""

        def found(pattern: str) -> list[Any]:
            return re.findall(pattern.format(schema=self.schema), self.script, re.MULTILINE)

        triggers = found(_TRIGGERS)
        return query("migration_drop_created").format(
            views=_text_array(found(_VIEWS)[::-1]),
            triggers=_text_array([name for name, _ in triggers]),
            trigger_tables=_text_array([table for _, table in triggers]),
            functions=_text_array(found(_FUNCTIONS)),
        )

    def deconstruct(self) -> tuple[str, list[Any], dict[str, Any]]:
        kwargs: dict[str, Any] = {"name": self.name}
        if self.drop_schema:
            kwargs["drop_schema"] = True
        return (self.__class__.__qualname__, list(self.files), kwargs)

    def state_forwards(self, app_label: str, state: ProjectState) -> None:
        """No model state: the SQL objects are not Django models."""

    def database_forwards(
        self,
        app_label: str,
        schema_editor: BaseDatabaseSchemaEditor,
        from_state: ProjectState,
        to_state: ProjectState,
    ) -> None:
        if schema_editor.collect_sql:
            # sqlmigrate: the script as a DBA would run it, in one transaction.
            schema_editor.execute(query("migration_lock"), params=None)
            schema_editor.execute(self.script, params=None)
            schema_editor.execute(query("migration_record"), params=[self.name])
            return
        with schema_editor.connection.cursor() as cursor:
            check_advisory(cursor)
            cursor.execute(query("migration_lock"))
            if self.drop_schema:
                check_install(cursor, self.schema, self.name)
            if self._applied(cursor):
                return
            cursor.execute(self.script)
            if self.drop_schema:
                check_created(cursor, self.schema)
            cursor.execute(query("migration_record"), [self.name])

    def _applied(self, cursor: Any) -> bool:
        cursor.execute(query("migrations_table_exists"))
        row = cursor.fetchone()
        if row is None or not row[0]:
            return False
        cursor.execute(query("migration_applied"), [self.name])
        row = cursor.fetchone()
        return bool(row is not None and row[0])

    def database_backwards(
        self,
        app_label: str,
        schema_editor: BaseDatabaseSchemaEditor,
        from_state: ProjectState,
        to_state: ProjectState,
    ) -> None:
        if schema_editor.collect_sql:
            schema_editor.execute(query("migration_lock"), params=None)
            if self.drop_schema:
                schema_editor.execute(query("schema_drop"), params=None)
            else:
                schema_editor.execute(self._drop_created(), params=None)
                schema_editor.execute(query("migration_forget"), params=[self.name])
            return
        with schema_editor.connection.cursor() as cursor:
            check_advisory(cursor)
            cursor.execute(query("migration_lock"))
            check_owned(cursor, self.schema, self.name)
            if self.drop_schema:
                cursor.execute(query("schema_drop"))
                return
            cursor.execute(query("schema_exists"))
            row = cursor.fetchone()
            if row is not None and row[0]:
                cursor.execute(self._drop_created())
                cursor.execute(query("migration_forget"), [self.name])

    def describe(self) -> str:
        return f"Run awa_django SQL {self.name}"
