"""Typed rows: what the operator reads is built by column name, never by position.

:func:`fetch` runs one named query (``awa_django/sql/queries/*.sql``) on the Django connection
of ``using`` and builds each row as ``row_class(**{column name: value})``. A query and its row
class therefore agree by name: a column the class lacks, or a field the query does not select,
raises ``TypeError`` at once instead of shifting values into the wrong fields. ``convert`` types
the columns the database adapter cannot (jsonb, which Django's psycopg adapters hand back as
text; a numeric that should be a float; a uuid shown as text; a state as a ``JobState``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeAlias, TypeVar

from django.db import connections
from django.db.backends.utils import CursorWrapper

from awa_django.conf import get_awa_settings
from awa_django.db.transactions import checked_alias
from awa_django.sql import query

__all__ = ["Json", "Param", "Params", "alias", "cursor", "fetch", "fetch_one", "json_value"]

#: A decoded JSON value: a dict, list, str, int, float, bool or None, of unknown shape.
Json: TypeAlias = object
#: A query parameter the operator reads pass.
Param: TypeAlias = int | str | None
#: Query parameters: positional (``%s``) or named (``%(name)s``).
Params: TypeAlias = Sequence[Param] | Mapping[str, Param]
#: Per column, the function that types its value (``float``, ``str``, ``JobState``,
#: :func:`json_value`); it gets what the database adapter returned, which is untyped.
Converters: TypeAlias = Mapping[str, Callable[[Any], object]]

Row = TypeVar("Row")


def alias(using: str | None) -> str:
    """``using``, or ``AWA["DATABASE_ALIAS"]`` when it is None; ``InvalidOptionError`` unless it
    names a database in ``DATABASES``."""
    return checked_alias(get_awa_settings().DATABASE_ALIAS if using is None else using)


def cursor(using: str | None) -> CursorWrapper:
    """A cursor on the Django connection of ``using`` (see :func:`alias`)."""
    return connections[alias(using)].cursor()


def json_value(value: object) -> Json:
    """A jsonb column's value, decoded (Django's psycopg adapters hand jsonb back as text)."""
    return json.loads(value) if isinstance(value, str) else value


def fetch(
    row_class: Callable[..., Row],
    name: str,
    params: Params | None = None,
    *,
    using: str | None = None,
    convert: Converters | None = None,
) -> list[Row]:
    """Every row of the named query ``name``, each built by column name as ``row_class``."""
    with cursor(using) as c:
        c.execute(query(name), params)
        names = _names(c)
        return [_build(row_class, names, row, convert) for row in c.fetchall()]


def fetch_one(
    row_class: Callable[..., Row],
    name: str,
    params: Params | None = None,
    *,
    using: str | None = None,
    convert: Converters | None = None,
) -> Row | None:
    """The first row of the named query ``name`` built as ``row_class``, or None (no row)."""
    with cursor(using) as c:
        c.execute(query(name), params)
        row = c.fetchone()
        return None if row is None else _build(row_class, _names(c), row, convert)


def _names(c: CursorWrapper) -> list[str]:
    return [str(column.name) for column in c.description]


def _build(
    row_class: Callable[..., Row],
    names: Sequence[str],
    row: Sequence[object],
    convert: Converters | None,
) -> Row:
    values = dict(zip(names, row, strict=True))
    if convert:
        for column, to_type in convert.items():
            value = values[column]
            values[column] = None if value is None else to_type(value)
    return row_class(**values)
