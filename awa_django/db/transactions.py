"""Write transactions on Django's connection: the caller's when it has one, else one of ours.

Every public write of awa_django (enqueue, bulk enqueue, cancel, callback resolution, DLQ retry
and purge, drains) is atomic: inside the caller's ``transaction.atomic()`` block it joins that
transaction (and commits or rolls back with it); in autocommit it runs in a transaction of its
own, so a write of several statements never commits half-way, and the wake-up NOTIFY is
delivered only when every row exists.

:func:`release_thread_connections` puts back the Django connections a sync handler (a job's, a
task's) left in a transaction (an ``atomic()`` block entered and never exited, autocommit turned
off), so the next job on that thread starts clean. A transaction that was already open before
the handler ran (a test's, when ``awa_django.testing.drain()`` runs the handler inside it) is
not the handler's to lose: :func:`mark_open_transactions` sets a savepoint in it first, and the
release then undoes only what the handler left open, back to that savepoint.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from django.db import connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper

from awa_django.exceptions import InvalidOptionError, IsolationLevelError
from awa_django.sql import query

__all__ = [
    "OpenTransaction",
    "checked_alias",
    "mark_open_transactions",
    "release_thread_connections",
    "write_transaction",
]

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


@dataclasses.dataclass(frozen=True, slots=True)
class OpenTransaction:
    """A transaction open on one of this thread's connections before a handler ran, and the
    savepoint set in it then (None when none could be set: the transaction was already
    broken)."""

    wrapper: BaseDatabaseWrapper
    savepoint: str | None
    in_atomic_block: bool
    commit_on_exit: bool
    needs_rollback: bool
    atomic_blocks: int
    savepoint_ids: int
    on_commit: int


def mark_open_transactions() -> dict[str, OpenTransaction]:
    """The transactions open on this thread's connections, by alias, each with a savepoint
    set now: pass them to :func:`release_thread_connections` after the handler ran, so that
    they are kept. A thread without such a transaction (a worker's) gets ``{}`` and pays no
    query."""
    marks: dict[str, OpenTransaction] = {}
    for conn in connections.all(initialized_only=True):
        # Never connects: a wrapper that never connected holds no transaction.
        if not (conn.in_atomic_block or (conn.connection is not None and not conn.autocommit)):
            continue
        sid: str | None = None
        with contextlib.suppress(Exception):  # broken already: the handler cannot use it either
            sid = conn.savepoint()
        marks[conn.alias] = OpenTransaction(
            wrapper=conn,
            savepoint=sid,
            in_atomic_block=conn.in_atomic_block,
            commit_on_exit=conn.commit_on_exit,
            needs_rollback=conn.needs_rollback,
            atomic_blocks=len(conn.atomic_blocks),
            savepoint_ids=len(conn.savepoint_ids),
            on_commit=len(conn.run_on_commit),
        )
    return marks


def _restore(conn: BaseDatabaseWrapper, mark: OpenTransaction) -> bool:
    """Put ``conn`` back as ``mark`` found it; True when the handler had left a transaction
    (an ``atomic()`` block) open in it, which is then rolled back to the mark's savepoint.

    Kept as the handler left it otherwise, its writes included; but a statement of the
    handler's that failed outside any block of its own aborted the transaction (PostgreSQL
    refuses every later statement in it), so it is rolled back with everything the handler
    did, and the caller's transaction goes on.
    """
    left_open = len(conn.atomic_blocks) > mark.atomic_blocks or (
        conn.in_atomic_block and not mark.in_atomic_block
    )
    raw: Any = conn.connection
    aborted = False
    with contextlib.suppress(Exception):
        aborted = raw is not None and raw.info.transaction_status == 3  # INERROR
    # transaction.set_rollback(True) outside a block of the handler's own: it marked the
    # caller's block; the handler's part is rolled back instead (a worker refuses the flag).
    aborted = aborted or (conn.needs_rollback and not mark.needs_rollback)
    if not (left_open or aborted):
        if mark.savepoint is not None:
            try:
                conn.savepoint_commit(mark.savepoint)
            except Exception:
                conn.needs_rollback = True  # the caller's atomic block then reports it
        return False
    if left_open:
        del conn.atomic_blocks[mark.atomic_blocks :]
        del conn.savepoint_ids[mark.savepoint_ids :]
        conn.in_atomic_block = mark.in_atomic_block
        conn.commit_on_exit = mark.commit_on_exit
    conn.needs_rollback = mark.needs_rollback  # cursor() refuses to run while it is set
    try:
        if mark.savepoint is None or conn.closed_in_transaction:
            raise RuntimeError("nothing to roll back to")
        conn.savepoint_rollback(mark.savepoint)
        conn.savepoint_commit(mark.savepoint)
        del conn.run_on_commit[mark.on_commit :]
    except Exception:
        # The handler's part cannot be undone alone: the whole transaction must go, and
        # Django's atomic block refuses every query until it is rolled back.
        conn.needs_rollback = True
    return left_open


def release_thread_connections(kept: Mapping[str, OpenTransaction] | None = None) -> list[str]:
    """Close this thread's Django connections that a handler left inside a transaction, so the
    next job on the thread gets fresh ones; return their aliases (the handler's uncommitted
    writes are rolled back with them). Clean connections are left alone.

    ``kept``: the transactions :func:`mark_open_transactions` found open before the handler
    ran. They are not the handler's, and stay open: only an ``atomic()`` block the handler
    left open inside one is rolled back (to the mark's savepoint), and its alias returned."""
    leaked: list[str] = []
    for conn in connections.all(initialized_only=True):
        mark = kept.get(conn.alias) if kept else None
        if mark is not None and mark.wrapper is conn:
            if _restore(conn, mark):
                leaked.append(conn.alias)
            continue
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
