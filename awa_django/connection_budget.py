"""How many PostgreSQL connections worker processes hold at once.

One count, used by the ``awa.W002`` system check (``awa_django.checks``), the worker's start-up
warning (``awa_django.worker.runtime``) and docs/deployment.md ("Connection budget"). It lives
here, below both, so that the checks need nothing of the worker; ``awa_django.worker.config``
re-exports it.
"""

from __future__ import annotations

__all__ = ["OWN_CONNECTIONS", "connection_budget", "own_connections"]

#: Connections a worker process opens for itself, each one psycopg connection named
#: ``awa:worker:<instance id>``: the claim loop's, the finalization batcher's, the heartbeat
#: and control loop's, the sweep's (idle queues, queue discovery, the burst check), the LISTEN
#: connection (only with ``AWA["NOTIFY"]``), and the maintenance election's (held by every
#: process that competes, leader or not; none with ``--no-maintenance``).
OWN_CONNECTIONS = ("claim", "finalize", "heartbeat", "sweep", "listen", "leader")


def own_connections(*, listen: bool = True, maintenance: bool = True) -> int:
    """How many connections a worker process needs besides its handlers': the entries of
    :data:`OWN_CONNECTIONS` it opens, plus one Django connection for the single thread on which
    asgiref's ``sync_to_async`` (``thread_sensitive=True``, its default) runs the ORM calls of
    async handlers."""
    return len(OWN_CONNECTIONS) - (not listen) - (not maintenance) + 1


def connection_budget(
    processes: int, concurrency: int, *, listen: bool = True, maintenance: bool = True
) -> int:
    """The most PostgreSQL connections ``processes`` worker processes of ``concurrency``
    handler threads each hold at once: per process, one Django connection per handler thread
    (a thread opens it only if its sync handlers use the ORM, and keeps it for
    ``CONN_MAX_AGE``) plus :func:`own_connections`. The ``awa.W002`` check, the worker's
    start-up warning and docs/deployment.md all use this count; it assumes handlers open no
    connections of their own (other aliases, ``sync_to_async(thread_sensitive=False)``).
    ``processes`` must be an int of at least 1 and ``concurrency`` one of at least 0
    (``TypeError``, ``ValueError``)."""
    for name, value, least in (("processes", processes, 1), ("concurrency", concurrency, 0)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int, got {type(value).__name__}")
        if value < least:
            raise ValueError(f"{name} must be at least {least}, got {value}")
    return processes * (concurrency + own_connections(listen=listen, maintenance=maintenance))
