"""The Django connections of async handlers, closed when Django would close them.

An async handler reaches the ORM through asgiref's ``sync_to_async`` (thread sensitive, its
default), which runs every such call of the process on one thread: the connections of that
thread are shared by all the async handlers of the process. Nothing closes them between jobs
as ``close_old_connections()`` does around a request (and ``run_sync`` around a sync handler),
so a connection the server dropped (a restart, ``pg_terminate_backend``) stayed in place and
every later async job failed on it. ``AsyncOrmConnections`` closes, after an async handler
ends, the connections of that thread Django would close at the end of a request: after an
error when the connection no longer works, past ``CONN_MAX_AGE``, with autocommit left off,
or each time when ``CONN_HEALTH_CHECKS`` is on; the next ORM call opens a new one. The
connections are watched from the event loop for free (a few attribute reads per async job);
the thread is asked to close them only when one needs it, one request at a time. A connection
inside an atomic block (a handler's transaction across several ``sync_to_async`` calls) is
left alone.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import weakref
from typing import Any

from asgiref.sync import sync_to_async
from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.signals import connection_created

__all__ = ["AsyncOrmConnections"]

log = logging.getLogger("awa_django.worker")


def _close_obsolete() -> None:
    """On the ORM thread: close its connections Django would close at a request's end."""
    for conn in connections.all(initialized_only=True):
        if not conn.in_atomic_block:
            conn.close_if_unusable_or_obsolete()


def _needs_closing(conn: BaseDatabaseWrapper) -> bool:
    """Whether ``close_if_unusable_or_obsolete`` has something to do on ``conn`` (read from
    another thread: plain attributes only, no query)."""
    if conn.connection is None or conn.in_atomic_block:
        return False
    if conn.errors_occurred or conn.autocommit != conn.settings_dict["AUTOCOMMIT"]:
        return True
    if conn.close_at is not None and time.monotonic() >= conn.close_at:
        return True
    # Django checks a connection before its first query of a request when asked to.
    return bool(
        getattr(conn, "health_check_enabled", False) and getattr(conn, "health_check_done", False)
    )


class AsyncOrmConnections:
    """Watches the connections of the thread that runs async handlers' ORM calls (``start``
    on the event loop; ``job_ended`` after each async handler; ``stop`` at the end)."""

    def __init__(self) -> None:
        self._thread: int | None = None
        self._conns: weakref.WeakSet[BaseDatabaseWrapper] = weakref.WeakSet()
        self._closing: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._uid = f"awa-async-orm-{id(self)}"

    async def start(self) -> None:
        """Learn which thread runs thread-sensitive ``sync_to_async`` calls, and watch the
        connections it opens from now on."""
        self._loop = asyncio.get_running_loop()
        self._thread = await sync_to_async(threading.get_ident)()
        connection_created.connect(self._created, weak=False, dispatch_uid=self._uid)

    def stop(self) -> None:
        """Stop watching."""
        connection_created.disconnect(dispatch_uid=self._uid)

    def _created(self, sender: Any, connection: BaseDatabaseWrapper, **kwargs: Any) -> None:
        if threading.get_ident() == self._thread:
            self._conns.add(connection)

    def job_ended(self) -> None:
        """An async handler ended: have the ORM thread close the connections Django would
        close now (one request at a time)."""
        loop = self._loop
        if self._closing is not None or not self._conns or loop is None or loop.is_closed():
            return
        if any(_needs_closing(conn) for conn in list(self._conns)):
            self._closing = loop.create_task(self._close())

    async def _close(self) -> None:
        try:
            await sync_to_async(_close_obsolete)()
        except Exception:
            log.exception("awa worker: closing the ORM connections of async handlers failed")
        finally:
            self._closing = None
