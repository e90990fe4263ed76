"""A cheaper flush after each ``transaction=True`` test (Django's ``TransactionTestCase``).

Django's flush truncates every table of every installed app, then sends ``post_migrate``, whose
handlers create every content type and permission again: about 45 ms a test, on 2,000 tests of
the suite. This one truncates only the tables written since the last flush (a relation that was
truncated is an empty file until a row is written to it, even one that rolled back) and keeps
the content types, permissions and migration records, which are what ``post_migrate`` would
have written again: the state a test starts from is the same. A test that sets
``available_apps`` or ``serialized_rollback`` gets Django's own flush.
"""

from __future__ import annotations

from typing import Any

from django.db import connections
from django.test import TransactionTestCase

__all__ = ["install"]

# What Django's flush and post_migrate leave as they were: created once by migrate.
_KEPT = frozenset({"django_content_type", "auth_permission", "django_migrations"})

_django_teardown = TransactionTestCase._fixture_teardown


def _fixture_teardown(self: Any) -> None:
    if self.available_apps is not None or self.serialized_rollback:
        _django_teardown(self)
        return
    for alias in self._databases_names(include_mirrors=False):
        connection = connections[alias]
        tables = set(connection.introspection.django_table_names(only_existing=True)) - _KEPT
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT quote_ident(c.relname) FROM pg_class c "
                "WHERE c.relname = ANY (%s) AND c.relkind = 'r' "
                "AND c.relnamespace = current_schema()::regnamespace "
                "AND pg_relation_size(c.oid) > 0",
                [sorted(tables)],
            )
            written = [row[0] for row in cursor.fetchall()]
            if written:
                # CASCADE: a table referenced by an empty one is refused without it (the kept
                # tables reference none of the others).
                cursor.execute(f"TRUNCATE {', '.join(written)} CASCADE")


def install() -> None:
    """Use this flush for every ``TransactionTestCase`` of the session."""
    TransactionTestCase._fixture_teardown = _fixture_teardown  # type: ignore[method-assign]
