"""A handler run inside the test's transaction, as a worker would run it on a connection of
its own (``drain()``, immediate mode).

The test's transaction is never the handler's (awa_django.db.transactions): a savepoint is set
in it first, and what the handler leaves broken is undone back to it. Around the handler:

* ``connection.close()`` and ``close_old_connections()`` do nothing on a connection that holds
  the test's transaction (in a worker they would drop a connection nobody else uses; here they
  would end the test's transaction);
* ``transaction.set_rollback(True)`` outside a block of the handler's own rolls back what the
  handler did and fails the job with ``TransactionManagementError``, as in a worker;
* ``transaction.on_commit()`` callbacks the handler registered run when it returns, as they
  would at its commit in a worker (not when its writes are rolled back).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, cast

from asgiref.sync import async_to_sync
from django.db.transaction import TransactionManagementError

from awa_django.db.transactions import (
    OpenTransaction,
    mark_open_transactions,
    release_thread_connections,
)
from awa_django.exceptions import TransactionLeftOpen
from awa_django.worker.prepared import PreparedAttempt

__all__ = ["call_handler"]

log = logging.getLogger("awa_django.testing")

_MISSING = object()


def call_handler(attempt: PreparedAttempt) -> tuple[Any, BaseException | None]:
    """Run the attempt's handler: what it returns, or what it raised (``KeyboardInterrupt``
    included: the caller writes the outcome, then raises it again)."""
    kept = mark_open_transactions()  # the test's transaction: it stays open
    value: Any = None
    exc: BaseException | None = None
    handle = attempt.handle
    assert handle is not None
    with _closing_kept(kept):
        try:
            func = handle.func
            value = (async_to_sync(func) if handle.is_async else func)(
                *attempt.call_args(), **attempt.kwargs
            )
        except BaseException as error:  # SystemExit, CancelledError, Ctrl-C...: the job fails
            exc = error
    flagged = [
        alias
        for alias, mark in kept.items()
        if mark.wrapper.needs_rollback
        and not mark.needs_rollback
        and len(mark.wrapper.atomic_blocks) == mark.atomic_blocks
    ]
    aborted = [alias for alias, mark in kept.items() if _aborted(mark)]
    callbacks = _new_callbacks(kept)
    leaked = release_thread_connections(kept)
    if leaked and exc is None:
        exc = TransactionLeftOpen(
            f"the handler left a transaction open on database(s) {', '.join(leaked)}; it "
            "was rolled back (exit every transaction.atomic() block it enters)"
        )
    if flagged and exc is None:
        exc = TransactionManagementError(
            "The rollback flag doesn't work outside of an 'atomic' block: the handler's "
            f"writes on {', '.join(flagged)} were rolled back"
        )
    if not (leaked or flagged or aborted):  # the handler's writes stay: so do its callbacks
        for callback in callbacks:
            try:
                callback()
            except Exception as error:
                if exc is None:
                    exc = error
    return value, exc


def _aborted(mark: OpenTransaction) -> bool:
    """Whether a statement of the handler failed in the kept transaction (PostgreSQL then
    refuses the rest of it)."""
    raw = mark.wrapper.connection
    try:
        return raw is not None and raw.info.transaction_status == 3  # INERROR
    except Exception:
        return True


def _new_callbacks(kept: dict[str, OpenTransaction]) -> list[Callable[[], Any]]:
    """The ``on_commit`` callbacks the handler registered in the kept transactions, taken out
    of them (robust ones log what they raise instead of raising it)."""
    taken: list[Callable[[], Any]] = []
    for mark in kept.values():
        conn = mark.wrapper
        added = conn.run_on_commit[mark.on_commit :]
        del conn.run_on_commit[mark.on_commit :]
        for _, func, robust in cast(list[tuple[Any, Callable[[], Any], bool]], added):
            taken.append(_robust(func) if robust else func)
    return taken


def _robust(func: Callable[[], Any]) -> Callable[[], Any]:
    def call() -> None:
        try:
            func()
        except Exception:
            log.exception("awa testing: an on_commit() callback of a handler raised")

    return call


@contextmanager
def _closing_kept(kept: dict[str, OpenTransaction]) -> Iterator[None]:
    """``close()`` and ``close_if_unusable_or_obsolete()`` of the kept connections do nothing
    while the handler runs."""
    saved = []
    for mark in kept.values():
        conn = mark.wrapper
        for name in ("close", "close_if_unusable_or_obsolete"):
            saved.append((conn, name, conn.__dict__.get(name, _MISSING)))
            setattr(conn, name, _keep_open)
    try:
        yield
    finally:
        for conn, name, before in reversed(saved):
            if before is _MISSING:
                conn.__dict__.pop(name, None)
            else:
                setattr(conn, name, before)


def _keep_open() -> None:
    """A close of the test's connection: it holds the test's transaction, so it stays."""
