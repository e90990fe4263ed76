"""Worker-side psycopg connections, built from Django's DATABASES but never Django's own.

Workers keep long-lived connections for their loops (claim, finalize, heartbeat, LISTEN,
leadership). They are opened here from the same settings as ``connections[alias]`` and are
never shared with request handling or with the ORM used inside sync handlers.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import psycopg
from django.db import connections

from awa_django.conf import get_awa_settings
from awa_django.sql import query

__all__ = ["DatabaseReplaced", "connect_async", "connection_kwargs", "on_database_replaced"]

# Keys of Django's connection parameters that only make sense for Django's own cursors.
_DJANGO_ONLY = ("cursor_factory", "context", "prepare_threshold")


def connection_kwargs(alias: str, *, application_name: str) -> dict[str, Any]:
    """psycopg ``connect()`` keyword arguments for ``alias``, tagged with ``application_name``.

    Prepared statements stay on (psycopg's default threshold) unless the alias's OPTIONS set
    ``prepare_threshold`` (``None`` for transaction-mode poolers such as PgBouncer).
    """
    wrapper = connections[alias]
    params: dict[str, Any] = dict(wrapper.get_connection_params())
    options = wrapper.settings_dict.get("OPTIONS", {})
    for key in _DJANGO_ONLY:
        params.pop(key, None)
    if "prepare_threshold" in options:
        params["prepare_threshold"] = options["prepare_threshold"]
    params["application_name"] = application_name[:63]
    return params


async def connect_async(alias: str, *, application_name: str) -> psycopg.AsyncConnection[Any]:
    """Open an autocommit async connection: every statement is its own short transaction, at
    READ COMMITTED whatever the server's or the alias's default (the engine's functions need
    it)."""
    kwargs = connection_kwargs(alias, application_name=application_name)
    kwargs.pop("isolation_level", None)
    conn = await psycopg.AsyncConnection.connect(autocommit=True, **kwargs)
    try:
        cur = await conn.execute(query("worker_session"), [str(get_awa_settings().ENQUEUE_SHARDS)])
        row = await cur.fetchone()
        assert row is not None
        _same_database(alias, (row[3], row[4], row[5]))
    except BaseException:
        await conn.close()
        raise
    return conn


class DatabaseReplaced(RuntimeError):
    """A connection of this process reached a different database than its first one did."""


# alias -> (system identifier or None, database oid, awa schema oid) of the first connection.
_identities: dict[str, tuple[Any, Any, Any]] = {}
_identities_lock = threading.Lock()
_on_replaced: Callable[[DatabaseReplaced], None] | None = None


def on_database_replaced(handler: Callable[[DatabaseReplaced], None] | None) -> None:
    """Call ``handler`` (the worker's: log and exit) when a reconnect reaches a different
    database than this process first connected to, before any statement runs there;
    ``DatabaseReplaced`` is raised when it returns or none is set.

    A database dropped and recreated, restored elsewhere, or an ``awa`` schema reinstalled
    starts its ids over: state a process holds about the old one (open attempts, batched
    outcomes, lanes, leadership) must never be applied to the new one."""
    global _on_replaced
    _on_replaced = handler


def _same_database(alias: str, identity: tuple[Any, Any, Any]) -> None:
    with _identities_lock:
        first = _identities.setdefault(alias, identity)
    if first == identity:
        return
    error = DatabaseReplaced(
        f"the database of alias {alias!r} is not the one this process first connected to "
        f"(system identifier, database oid, awa schema oid were {first}, are {identity}): "
        "it was dropped and recreated, restored, or the awa schema was reinstalled"
    )
    if _on_replaced is not None:
        _on_replaced(error)
    raise error
