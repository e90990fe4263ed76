"""Write transactions on Django's connection: the caller's when it has one, else one of ours.

Every public write of awa_django (enqueue, bulk enqueue, cancel, callback resolution, DLQ retry
and purge, drains) is atomic: inside the caller's ``transaction.atomic()`` block it joins that
transaction (and commits or rolls back with it); in autocommit it runs in a transaction of its
own, so a write of several statements never commits half-way, and the wake-up NOTIFY is
delivered only when every row exists.

:func:`release_thread_connections` puts back the Django connections a sync handler (a job's, a
task's) left in a transaction (an ``atomic()`` block entered and never exited, autocommit turned
off), so the next job on that thread starts clean.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextlib import contextmanager

from django.db import connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper

from awa_django.exceptions import InvalidOptionError, IsolationLevelError
from awa_django.sql import query

__all__ = ["checked_alias", "release_thread_connections", "write_transaction"]

_READ_COMMITTED = ("read committed", "read uncommitted")  # PostgreSQL runs the latter as RC


def checked_alias(using: str) -> str:
    """``using`` if it is the alias of a PostgreSQL database in ``DATABASES``, else
    ``InvalidOptionError``."""
    if type(using) is not str or using not in connections.settings:
        raise InvalidOptionError("using", f"{using!r} is not a database alias in DATABASES")
    if connections.settings[using].get("ENGINE") not in _POSTGRESQL_ENGINES:
        vendor = connections[using].vendor
        if vendor != "postgresql":
            raise InvalidOptionError(
                "using", f"{using!r} is a {vendor} database; awa_django needs PostgreSQL"
            )
    return using


#: The engine names that are PostgreSQL without asking the backend (the common case, cheap).
_POSTGRESQL_ENGINES = frozenset(
    {"django.db.backends.postgresql", "django.db.backends.postgresql_psycopg2"}
)


@contextmanager
def write_transaction(
    using: str, *, statements: int = 2, read_committed: bool = False
) -> Iterator[BaseDatabaseWrapper]:
    """The connection of ``using``, inside a transaction for a write of ``statements``.

    * In the caller's transaction (an atomic block, or autocommit turned off): nothing is
      added; the write commits or rolls back with it.
    * In autocommit, a write of more than one statement runs in a transaction of its own.
    * ``read_committed``: the engine function needs READ COMMITTED (it takes locks and then
      reads with fresh snapshots). A transaction of our own is set to it, whatever the
      alias's default; in the caller's transaction at another level, ``IsolationLevelError``
      is raised before anything is written, and the transaction stays usable.
    """
    connection = connections[checked_alias(using)]
    if connection.in_atomic_block or not connection.get_autocommit():
        if read_committed:
            with connection.cursor() as cursor:
                cursor.execute(query("isolation"))
                row = cursor.fetchone()
            level = str(row[0]) if row else ""
            if level not in _READ_COMMITTED:
                raise IsolationLevelError(
                    f"this needs READ COMMITTED, but the caller's transaction on {using!r} runs "
                    f"at {level.upper()}"
                )
        yield connection
        return
    if statements <= 1 and not read_committed:
        yield connection
        return
    with transaction.atomic(using=using):
        if read_committed:
            with connection.cursor() as cursor:
                cursor.execute(query("read_committed"))
        yield connection


def release_thread_connections() -> list[str]:
    """Close this thread's Django connections that a handler left inside a transaction, so the
    next job on the thread gets fresh ones; return their aliases (the handler's uncommitted
    writes are rolled back with them). Clean connections are left alone."""
    leaked: list[str] = []
    for conn in connections.all(initialized_only=True):
        raw = conn.connection
        if raw is None and not conn.in_atomic_block:
            continue
        open_transaction = conn.in_atomic_block or not conn.get_autocommit()
        if raw is not None and not open_transaction:
            with contextlib.suppress(Exception):
                open_transaction = raw.info.transaction_status != 0  # not IDLE
        if not open_transaction:
            continue
        leaked.append(conn.alias)
        with contextlib.suppress(Exception):
            if raw is not None:
                raw.close()
        with contextlib.suppress(Exception):
            del connections[conn.alias]  # a new wrapper, outside any atomic block, next time
    return leaked
