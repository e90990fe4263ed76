"""Self-healing database connections for the worker's loops and the maintenance leader.

A ``Link`` owns one autocommit psycopg connection for one role (claim, finalize, heartbeat,
listen, leader). Errors fall in three kinds, told apart by :func:`is_connection_lost` and
:data:`TRANSIENT_SQLSTATES`:

* a **lost connection** (Postgres restarted, the backend was terminated, the network is gone):
  the call is retried on a fresh connection after a backoff that grows 50 ms → 5 s, with one
  log line per backoff step, so an outage never floods the log. The process never needs a
  restart for it;
* a **transient** error on a live connection (deadlock, lock timeout, statement timeout,
  serialization failure): the call is retried on the same connection a few times with backoff,
  then the error is raised;
* anything else (a SQL error, a bug): raised at once, for the caller to handle.

Every statement a link runs is idempotent on retry (the engine's functions are written so).

Its log records go to the ``awa_django.worker`` logger, as those of the loops it serves.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import psycopg

from awa_django.db.connection import connect_async

__all__ = [
    "CONNECTION_ERRORS",
    "RECONNECT_BACKOFF_MAX",
    "TRANSIENT_SQLSTATES",
    "Link",
    "first_line",
    "is_connection_lost",
    "is_transient",
]

log = logging.getLogger("awa_django.worker")

T = TypeVar("T")

CONNECTION_ERRORS = (psycopg.OperationalError, psycopg.InterfaceError)

#: deadlock_detected, serialization_failure, lock_not_available, query_canceled (statement or
#: lock timeout, pg_cancel_backend): the statement failed, the connection is fine.
TRANSIENT_SQLSTATES = frozenset({"40P01", "40001", "55P03", "57014"})

# admin_shutdown, crash_shutdown, cannot_connect_now: the server is going away or coming back.
_LOST_SQLSTATES = frozenset({"57P01", "57P02", "57P03"})

_BACKOFF_FIRST = 0.05
#: The longest pause between two reconnect attempts (seconds): a process may reconnect that
#: long after the database is back.
RECONNECT_BACKOFF_MAX = 5.0
_TRANSIENT_TRIES = 5


def is_connection_lost(exc: BaseException, conn: Any) -> bool:
    """Whether ``exc`` (raised while using ``conn``, which may be None) means the connection is
    gone, rather than one statement failing on a live connection."""
    if isinstance(exc, psycopg.InterfaceError):
        return True
    if not isinstance(exc, psycopg.Error):
        return False
    if conn is not None and (conn.closed or getattr(conn, "broken", False)):
        return True
    state = exc.sqlstate
    if state is None:
        # No server error code: the client failed to talk to the server at all.
        return isinstance(exc, psycopg.OperationalError)
    return state.startswith("08") or state in _LOST_SQLSTATES


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` is a statement failure worth retrying as is (see the module docstring)."""
    return isinstance(exc, psycopg.Error) and exc.sqlstate in TRANSIENT_SQLSTATES


def first_line(exc: BaseException) -> str:
    """The first line of an error's text (its type when it has none)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


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
        #: time.monotonic() when a call last worked on this link's connection.
        self.last_ok = 0.0
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
        retry_transient: bool = True,
    ) -> T:
        """Run ``fn`` on this link's connection: reconnect after a lost connection, retry a
        transient failure a few times (unless not ``retry_transient``), raise anything else at
        once.

        ``give_up()`` is asked before each reconnect; when it says yes the last error is raised.
        """
        delay = _BACKOFF_FIRST
        transient = 0
        while True:
            try:
                async with self._lock:
                    result = await fn(await self.connection())
                self.last_ok = time.monotonic()
                return result
            except Exception as exc:
                if is_connection_lost(exc, self.conn):
                    await self.discard()
                    if give_up():
                        raise
                    self.reconnects += 1
                    log.warning(
                        "awa worker: %s connection lost (%s); reconnecting in %.2f s",
                        self.role,
                        first_line(exc),
                        delay,
                    )
                elif retry_transient and is_transient(exc) and transient < _TRANSIENT_TRIES:
                    transient += 1
                    log.info(
                        "awa worker: %s statement failed (%s); retrying in %.2f s",
                        self.role,
                        first_line(exc),
                        delay,
                    )
                else:
                    raise
                await asyncio.sleep(delay)
                delay = min(delay * 2, RECONNECT_BACKOFF_MAX)

    async def discard(self) -> None:
        """Drop the connection (it is reopened on the next ``run``)."""
        conn, self.conn = self.conn, None
        if conn is not None and not conn.closed:
            with contextlib.suppress(Exception):
                await conn.close()

    async def close(self) -> None:
        """Close the connection for good (at shutdown)."""
        await self.discard()
