"""Where the admin's pages read: ``AWA["READ_DATABASE_ALIAS"]`` (a streaming replica), or the
primary when that alias cannot be read this request; and the banner that says how far behind a
replica is (docs/deployment.md, "A read replica for the admin and status")."""

from __future__ import annotations

from contextvars import ContextVar

from django.contrib import messages
from django.db import DatabaseError, connections

from awa_django.conf import awa_settings
from awa_django.operator import replica_status
from awa_django.sql import query

__all__ = ["LAG_WARNING", "admin_read_alias", "choose_read_alias", "replica_banner"]

#: A replica further behind than this (seconds) is shown as a warning, not as information.
LAG_WARNING = 1.0


#: Where this request's admin pages read: set by :func:`choose_read_alias` at the start of each
#: awa admin view (the primary when the read alias cannot be read).
_read_alias: ContextVar[str | None] = ContextVar("awa_admin_read_alias", default=None)


def admin_read_alias() -> str:
    """The alias the admin's lists and detail pages read in this request."""
    return _read_alias.get() or awa_settings.read_alias


def choose_read_alias() -> tuple[int, str] | None:
    """Decide where this request's pages read, and what to tell the user about it.

    ``AWA["READ_DATABASE_ALIAS"]`` when it can be read and has the awa schema, with the
    :func:`replica_banner` of a standby; otherwise the primary (``DATABASE_ALIAS``), with a
    warning that says why: a replica that is down, or that is not a copy of this database,
    never turns the admin into an error page. Two short queries on the read alias."""
    read, primary = awa_settings.read_alias, awa_settings.DATABASE_ALIAS
    _read_alias.set(read)
    if read == primary:
        return None
    try:
        with connections[read].cursor() as cursor:
            cursor.execute(query("health_schema"))
            row = cursor.fetchone()
        if not (row and row[0]):
            problem = "it has no awa schema: is it a replica of this database?"
        else:
            return replica_banner()
    except DatabaseError as exc:
        text = str(exc).strip()
        problem = text.splitlines()[0] if text else type(exc).__name__
    _read_alias.set(primary)
    return messages.WARNING, (
        f"The read database {read!r} (AWA['READ_DATABASE_ALIAS']) cannot be read ({problem}); "
        "this page reads from the primary."
    )


def replica_banner() -> tuple[int, str] | None:
    """The message level and text a list shows when it reads from a standby
    (``AWA["READ_DATABASE_ALIAS"]``, see docs/deployment.md): how far behind its primary it is.
    None when the lists read from ``AWA["DATABASE_ALIAS"]`` or from a database that is not a
    standby. One short query on the read alias."""
    read, primary = awa_settings.read_alias, awa_settings.DATABASE_ALIAS
    if read == primary:
        return None
    status = replica_status(using=read)
    if not status.in_recovery:
        return None
    lag = status.lag_seconds
    paused = " (its WAL replay is paused)" if status.replay_paused else ""
    if lag is not None and lag < LAG_WARNING and not status.replay_paused:
        return messages.INFO, (
            f"Read from the replica {read!r}, up to date with the primary within a second. "
            "Actions act on the primary."
        )
    behind = "an unknown time" if lag is None else f"{lag:,.1f} s"
    return messages.WARNING, (
        f"Read from the replica {read!r}, {behind} behind the primary{paused}: changes made "
        "since are not shown yet, and rows shown may be gone. Actions act on the primary, "
        "on the rows as it has them."
    )
