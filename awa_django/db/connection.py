"""Worker-side psycopg connections, built from Django's DATABASES but never Django's own.

Workers keep long-lived connections for their loops (claim, finalize, heartbeat, LISTEN,
leadership). They are opened here from the same settings as ``connections[alias]`` and are
never shared with request handling or with the ORM used inside sync handlers.
"""

from __future__ import annotations

from typing import Any

import psycopg
from django.db import connections

from awa_django.conf import get_awa_settings
from awa_django.sql import query

__all__ = ["connect_async", "connection_kwargs"]

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
        await conn.execute(query("worker_session"), [str(get_awa_settings().ENQUEUE_SHARDS)])
    except BaseException:
        await conn.close()
        raise
    return conn
