"""The Django migration operation that installs awa_django's versioned SQL."""

from __future__ import annotations

import re
from typing import Any

from django.db import migrations
from django.db.backends.base.schema import BaseDatabaseSchemaEditor
from django.db.migrations.state import ProjectState

from awa_django.sql import migration_sql, query, reverse_sql

__all__ = ["RunAwaSQL"]

_VIEWS = re.compile(r"^CREATE VIEW awa\.(\w+)", re.MULTILINE)
_FUNCTIONS = re.compile(r"^CREATE FUNCTION awa\.(\w+)\(", re.MULTILINE)
_NAME = re.compile(r"[a-z_][a-z0-9_]*")


def _text_array(names: list[str]) -> str:
    """``ARRAY['a', 'b']`` of names checked to be plain lower-case identifiers."""
    for name in names:
        if _NAME.fullmatch(name) is None:  # pragma: no cover - the packaged files are checked
            raise ValueError(f"unexpected object name {name!r} in an awa_django SQL file")
    return "ARRAY[" + ", ".join(f"'{name}'" for name in names) + "]"


class RunAwaSQL(migrations.RunSQL):
    """Run one versioned ``awa_django/sql/migrations/*.sql`` file, once.

    A ``RunSQL`` whose SQL is the file's text, so ``manage.py sqlmigrate awa_django NNNN`` prints
    the script a DBA can run by hand: the migration lock, the file, and its row in
    ``awa.schema_migrations``.

    Guarantees:

    * Concurrent ``migrate`` runs are serialised by a transaction-scoped advisory lock (class
      4282180); a run that finds the file already applied (recorded in
      ``awa.schema_migrations``) skips it, so two ``migrate`` processes started at once both
      succeed. (A script printed by ``sqlmigrate`` has no such check: run by hand on a database
      that has the file already, it fails on its first ``CREATE`` and changes nothing.)
    * The file's text comes from the installed package.
    * Reversal: the first file (``drop_schema=True``) drops the whole ``awa`` schema; a later
      file drops the views and functions it created and forgets its record, so that migrating
      forward again re-creates them. Tables and their rows stay. A file that redefines earlier
      functions in place, or adds constraints that call its functions, names a ``reverse``
      script (``sql/reverse/NAME``), run first: it restores those bodies and drops those
      constraints. Nothing cascades: a view or
      function of the user's that depends on one of them stops the reversal (SQLSTATE 2BP01)
      with nothing dropped.
    """

    reduces_to_sql = True
    atomic = True

    def __init__(self, name: str, *, drop_schema: bool = False, reverse: str | None = None) -> None:
        self.name = name
        self.drop_schema = drop_schema
        self.reverse = reverse
        self.script = migration_sql(name)
        self.reverse_script = "" if reverse is None else reverse_sql(reverse)
        reverse_sql_text = query("schema_drop") if drop_schema else query("migration_forget")
        if not drop_schema:
            reverse_sql_text = f"{self._drop_created()};\n{reverse_sql_text}"
            if self.reverse_script:
                reverse_sql_text = f"{self.reverse_script}\n{reverse_sql_text}"
        super().__init__(sql=self.script, reverse_sql=reverse_sql_text)

    def _drop_created(self) -> str:
        """The statement that drops the views and functions this file creates."""
        return query("migration_drop_created").format(
            views=_text_array(_VIEWS.findall(self.script)[::-1]),
            functions=_text_array(_FUNCTIONS.findall(self.script)),
        )

    def deconstruct(self) -> tuple[str, list[Any], dict[str, Any]]:
        kwargs: dict[str, Any] = {"drop_schema": True} if self.drop_schema else {}
        if self.reverse is not None:
            kwargs["reverse"] = self.reverse
        return (self.__class__.__qualname__, [self.name], kwargs)

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
            cursor.execute(query("migration_lock"))
            if self._applied(cursor):
                return
            cursor.execute(self.script)
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
                if self.reverse_script:
                    schema_editor.execute(self.reverse_script, params=None)
                schema_editor.execute(self._drop_created(), params=None)
                schema_editor.execute(query("migration_forget"), params=[self.name])
            return
        with schema_editor.connection.cursor() as cursor:
            cursor.execute(query("migration_lock"))
            if self.drop_schema:
                cursor.execute(query("schema_drop"))
                return
            cursor.execute(query("schema_exists"))
            row = cursor.fetchone()
            if row is not None and row[0]:
                if self.reverse_script:
                    cursor.execute(self.reverse_script)
                cursor.execute(self._drop_created())
                cursor.execute(query("migration_forget"), [self.name])

    def describe(self) -> str:
        return f"Run awa_django SQL {self.name}"
