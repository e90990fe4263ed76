"""Connections to the test database: its URL for subprocesses, psycopg connections for a test's
own observers (``pg``, ``conninfo``) and for job handlers (``handler_conn``)."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator, Mapping
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

import psycopg

__all__ = ["PGBOUNCER", "conninfo", "count", "database_url", "handler_conn", "pg"]

#: The pgbouncer lane: the tests' Django connections go through PgBouncer in transaction
#: pooling mode (tests/conftest.py); ``AWA_TEST_DIRECT_URL`` is the server's own address.
PGBOUNCER = os.environ.get("AWA_TEST_PGBOUNCER") == "1"


def database_url(settings_dict: Mapping[str, Any]) -> str:
    """A ``postgresql://`` URL for a Django DATABASES entry (the inverse of django-environ)."""
    user = quote(str(settings_dict.get("USER") or ""), safe="")
    password = str(settings_dict.get("PASSWORD") or "")
    host = str(settings_dict.get("HOST") or "")
    port = str(settings_dict.get("PORT") or "")
    name = str(settings_dict["NAME"])
    auth = user + (f":{quote(password, safe='')}" if password else "")
    if host.startswith("/"):
        # A Unix socket directory: django-environ reads it from a path that starts with "/".
        host, name = "", f"{host}/{name}"
    netloc = (f"{auth}@" if auth else "") + host + (f":{port}" if port else "")
    url = f"postgresql://{netloc}/{quote(name, safe='')}"
    options = {
        k: v for k, v in (settings_dict.get("OPTIONS") or {}).items() if isinstance(v, str | int)
    }
    return f"{url}?{urlencode(options)}" if options else url


def conninfo(alias: str = "default") -> str:
    """psycopg conninfo for the (test) database behind ``alias`` (on the server itself, not
    through PgBouncer, when the pgbouncer lane runs: see tests/conftest.py)."""
    from django.db import connections

    s = connections[alias].settings_dict
    host, port = s.get("HOST"), s.get("PORT")
    direct = os.environ.get("AWA_TEST_DIRECT_URL")
    if direct:
        # Under PgBouncer (the pgbouncer lane): the test's own observers connect to the server
        # directly; only the code under test goes through the pooler.
        parts = urlsplit(direct)
        host, port = parts.hostname, parts.port
    return psycopg.conninfo.make_conninfo(
        dbname=s["NAME"],
        user=s.get("USER") or None,
        password=s.get("PASSWORD") or None,
        host=host or None,
        port=str(port) if port else None,
        options=(s.get("OPTIONS") or {}).get("options"),  # -c jit=off, as in tests/settings.py
    )


@contextlib.contextmanager
def pg(autocommit: bool = True) -> Iterator[psycopg.Connection[Any]]:
    """A fresh psycopg connection to the test database (worker-style), closed on exit."""
    conn = psycopg.connect(conninfo(), autocommit=autocommit)
    try:
        yield conn
    finally:
        conn.close()


_handler_local = threading.local()


def handler_conn() -> psycopg.Connection[Any]:
    """A job handler's own autocommit connection to the test database (``DATABASE_URL`` of the
    worker process), one per thread, opened again if it was closed: handlers of the tests' job
    modules record what they do over it, committed at once."""
    conn: psycopg.Connection[Any] | None = getattr(_handler_local, "conn", None)
    if conn is None or conn.closed:
        conn = psycopg.connect(os.environ["DATABASE_URL"].split("?", 1)[0], autocommit=True)
        _handler_local.conn = conn
    return conn


def count(sql: str, *params: Any) -> int:
    """The integer that ``sql`` (a ``SELECT count(*) ...``) returns, read on a fresh connection."""
    with pg() as conn:
        row = conn.execute(sql, list(params)).fetchone()
    assert row is not None
    return int(row[0])
