"""Self-healing database connections for the worker's loops.

A ``Link`` owns one autocommit psycopg connection for one role (claim, finalize, heartbeat,
listen, leader). When Postgres restarts or a backend is terminated, the failing call is retried
on a fresh connection after a backoff that grows 50 ms → 5 s; one log line per backoff step, so
an outage never floods the log. The process never needs a restart for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import psycopg

from awa_django.db.connection import connect_async

__all__ = ["CONNECTION_ERRORS", "Link"]

log = logging.getLogger("awa_django.worker")

T = TypeVar("T")

CONNECTION_ERRORS = (psycopg.OperationalError, psycopg.InterfaceError)

_BACKOFF_FIRST = 0.05
_BACKOFF_MAX = 5.0


class Link:
    """One named, lazily (re)opened connection. ``run(fn)`` calls ``fn(conn)`` until it works."""

    def __init__(
        self,
        alias: str,
        role: str,
        instance_id: str,
        *,
        on_connect: Callable[[psycopg.AsyncConnection[Any]], Awaitable[None]] | None = None,
    ) -> None:
        self.alias = alias
        self.role = role
        self.application_name = f"awa:worker:{instance_id}"
        self.on_connect = on_connect
        self.conn: psycopg.AsyncConnection[Any] | None = None
        self.reconnects = 0
        self._lock = asyncio.Lock()

    async def connection(self) -> psycopg.AsyncConnection[Any]:
        """The open connection, opening it (and running ``on_connect``) when needed."""
        if self.conn is None or self.conn.closed:
            self.conn = await connect_async(self.alias, application_name=self.application_name)
            if self.on_connect is not None:
                await self.on_connect(self.conn)
        return self.conn

    async def run(
        self,
        fn: Callable[[psycopg.AsyncConnection[Any]], Awaitable[T]],
        *,
        give_up: Callable[[], bool] = lambda: False,
    ) -> T:
        """Run ``fn`` on this link's connection, reconnecting on connection errors.

        ``give_up()`` is asked before each retry; when it says yes the last error is raised.
        Errors that are not about the connection (SQL errors, bugs) propagate at once.
        """
        delay = _BACKOFF_FIRST
        while True:
            try:
                async with self._lock:
                    return await fn(await self.connection())
            except CONNECTION_ERRORS as exc:
                await self.discard()
                if give_up():
                    raise
                self.reconnects += 1
                log.warning(
                    "awa worker: %s connection lost (%s); reconnecting in %.2f s",
                    self.role,
                    str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__,
                    delay,
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, _BACKOFF_MAX)

    async def discard(self) -> None:
        """Drop the connection (it is reopened on the next ``run``)."""
        conn, self.conn = self.conn, None
        if conn is not None and not conn.closed:
            with contextlib.suppress(Exception):
                await conn.close()

    async def close(self) -> None:
        """Close the connection for good (at shutdown)."""
        await self.discard()
