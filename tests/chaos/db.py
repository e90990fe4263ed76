"""Database access for the chaos lane: the named statements of ledger.sql and a self-healing
psycopg connection for the driver's own bookkeeping (it must survive PostgreSQL restarts)."""

from __future__ import annotations

import contextlib
import functools
import re
import time
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

__all__ = ["CONNECTION_ERRORS", "LedgerConn", "composed", "named_statements", "statement"]

LEDGER_SQL = Path(__file__).with_name("ledger.sql")
_NAME_RE = re.compile(r"^--\s*name:\s*([a-z_][a-z0-9_]*)\s*$", re.MULTILINE)

CONNECTION_ERRORS = (psycopg.OperationalError, psycopg.InterfaceError)


@functools.cache
def named_statements(path: Path) -> dict[str, str]:
    """The statements of a .sql file, each after a ``-- name: NAME`` line (the chaos lane's
    ledger.sql, the fleet test's fleet.sql)."""
    text = path.read_text(encoding="utf-8")
    matches = list(_NAME_RE.finditer(text))
    found: dict[str, str] = {}
    for index, match in enumerate(matches):
        end = matches[index + 1].start() if index + 1 < len(matches) else len(text)
        found[match.group(1)] = text[match.end() : end].strip().rstrip(";")
    return found


def _statements() -> dict[str, str]:
    return named_statements(LEDGER_SQL)


def statement(name: str) -> str:
    """The named statement ``name`` of ledger.sql (``KeyError`` if unknown)."""
    return _statements()[name]


def composed(name: str, **identifiers: tuple[str, str]) -> sql.Composed:
    """A named statement with ``{placeholders}`` filled by quoted (schema, table) identifiers."""
    return sql.SQL(statement(name)).format(
        **{key: sql.Identifier(*parts) for key, parts in identifiers.items()}
    )


class LedgerConn:
    """One lazily (re)opened autocommit connection; ``execute`` retries on connection errors
    until ``patience`` seconds have passed, so a PostgreSQL restart only delays a write."""

    def __init__(self, url: str, role: str, *, patience: float = 60.0) -> None:
        self.url = url
        self.role = role
        self.patience = patience
        self.conn: psycopg.Connection[Any] | None = None

    def connection(self) -> psycopg.Connection[Any]:
        if self.conn is None or self.conn.closed:
            self.conn = psycopg.connect(
                self.url, autocommit=True, connect_timeout=3, application_name=f"chaos:{self.role}"
            )
        return self.conn

    def execute(
        self, query: str | sql.Composed, params: Any = None, *, patience: float | None = None
    ) -> list[tuple[Any, ...]]:
        """Run one statement (a name from ledger.sql, or composed SQL); return its rows."""
        text = statement(query) if isinstance(query, str) else query
        deadline = time.monotonic() + (self.patience if patience is None else patience)
        while True:
            try:
                cursor = self.connection().execute(text, params)
                return cursor.fetchall() if cursor.description else []
            except CONNECTION_ERRORS:
                self.close()
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.1)

    def close(self) -> None:
        conn, self.conn = self.conn, None
        if conn is not None and not conn.closed:
            with contextlib.suppress(psycopg.Error):
                conn.close()
