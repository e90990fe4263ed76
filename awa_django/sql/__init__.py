"""Access to the SQL shipped with awa_django.

Two kinds of files live here:

* ``migrations/NNNN_name.sql``: versioned schema and function scripts, run once each by the
  Django migrations of the same number. Released files are never edited (a test pins their
  hashes); changes ship as new files.
* ``queries/*.sql``: named statements (``-- name: foo`` headers) used by the Python code. Python
  refers to them by name and passes every value as a parameter.
"""

from __future__ import annotations

import functools
import re
from importlib import resources

__all__ = ["migration_sql", "query"]

_NAME_RE = re.compile(r"^--\s*name:\s*([a-z_][a-z0-9_]*)\s*$", re.MULTILINE)


def migration_sql(name: str) -> str:
    """Return the text of the versioned migration script ``name`` (e.g. ``0001_schema.sql``)."""
    return (resources.files(__package__) / "migrations" / name).read_text(encoding="utf-8")


@functools.cache
def _load_queries() -> dict[str, str]:
    queries: dict[str, str] = {}
    folder = resources.files(__package__) / "queries"
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if not entry.name.endswith(".sql"):
            continue
        text = entry.read_text(encoding="utf-8")
        matches = list(_NAME_RE.finditer(text))
        for index, match in enumerate(matches):
            end = matches[index + 1].start() if index + 1 < len(matches) else len(text)
            name = match.group(1)
            if name in queries:
                raise RuntimeError(f"duplicate query name {name!r} in {entry.name}")
            queries[name] = text[match.end() : end].strip().rstrip(";")
    return queries


def query(name: str) -> str:
    """Return the named statement ``name`` from ``queries/*.sql``.

    Raises ``KeyError`` for an unknown name. The text is a constant shipped with the package;
    values are always passed separately as parameters.
    """
    return _load_queries()[name]
