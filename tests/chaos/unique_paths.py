"""The producers' unique-job paths (docs/unique-jobs.md).

``enqueue_unique``: unique jobs enqueued one by one, in one transaction or each in autocommit,
with keys shared by every producer so that they race. Every answer (a new job, or the holder of
the key) goes to ``chaos.unique_enqueues`` with a database time after the key was taken; new
jobs are committed jobs like any other.

``rollback_race``: a producer enqueues a unique job with a fresh key in a transaction, a helper
thread (another producer, with its own connection) enqueues the same key meanwhile, which waits
for the first transaction; the first rolls back. The second must then take the key: a duplicate
answer would mean that a rolled-back holder kept its key (``chaos.unique_rollbacks``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from django.db import connection, transaction

from awa_django.types import EnqueuedJob
from tests.chaos.db import statement
from tests.chaos.sabotage import broken
from tests.chaos.specs import JobSpec

if TYPE_CHECKING:
    from tests.chaos.producers import Producer

__all__ = ["enqueue_unique", "rollback_race"]

Execute = Callable[[str, list[Any]], object]


class _Rollback(Exception):
    """Raised inside the holder's atomic block to roll it back on purpose."""


def _record(producer: Producer, spec: JobSpec, handle: EnqueuedJob, execute: Execute) -> None:
    """The answer to one unique enqueue, and the job when it is a new one."""
    assert spec.unique_key is not None
    row = [spec.token, spec.unique_key, spec.kind, handle.id, handle.duplicate]
    execute("unique_enqueue_insert", row)
    if not handle.duplicate:
        execute("committed_insert", spec.ledger_row(handle.id, "unique"))


def enqueue_unique(producer: Producer, specs: list[JobSpec], *, atomic: bool) -> None:
    """Enqueue ``specs`` (unique) in one transaction, or each in autocommit."""
    if not atomic:
        for spec in specs:
            try:
                handle = spec.enqueue_handle()
            except Exception as exc:
                producer.failed("unique", [spec], [], True, exc)
                continue
            _record(producer, spec, handle, producer.ledger.execute)
            if not handle.duplicate:
                producer.committed([(spec, handle.id)])
        return
    sent: list[tuple[JobSpec, EnqueuedJob]] = []
    at_commit = False
    try:
        with transaction.atomic(), connection.cursor() as cursor:

            def execute(name: str, params: list[Any]) -> None:
                cursor.execute(statement(name), params)

            for spec in specs:
                handle = spec.enqueue_handle()
                sent.append((spec, handle))
                _record(producer, spec, handle, execute)
            at_commit = True
    except Exception as exc:
        # Tokens that were duplicates wrote nothing; the rest rolled back (or are unknown).
        duplicates = {spec.token for spec, h in sent if h.duplicate}
        fresh = [(spec, h.id) for spec, h in sent if not h.duplicate]
        left = [spec for spec in specs if spec.token not in duplicates]
        producer.failed("unique", left, fresh, at_commit, exc)
        return
    producer.committed([(spec, h.id) for spec, h in sent if not h.duplicate])


def rollback_race(producer: Producer, holder: JobSpec, other: JobSpec, pause: float) -> None:
    """Hold ``holder``'s key in a transaction for ``pause`` seconds while a helper thread
    enqueues ``other`` (the same key), then roll back; record what the helper got."""
    result: dict[str, Any] = {}

    def enqueue_other() -> None:
        try:
            result["handle"] = other.enqueue_handle()
        except Exception as exc:
            result["error"] = exc
        finally:
            connection.close()

    helper = threading.Thread(target=enqueue_other, name=f"unique-other-{producer.index}")
    holder_id: int | None = None
    try:
        with transaction.atomic():
            holder_id = holder.enqueue()
            helper.start()
            producer.stop.wait(pause)
            if not broken("unique_rollback"):
                raise _Rollback
    except _Rollback:
        pass
    except Exception as exc:  # a connection error: the transaction rolled back all the same
        producer.closed_after(exc)
    if helper.ident is None:
        helper.start()
    helper.join(120)
    producer.record("rolled_back_insert", "unique_rollback", [(holder, holder_id)])
    producer.run.add("rolled_back", 1)
    handle: EnqueuedJob | None = result.get("handle")
    error = result.get("error")
    if handle is None:
        text = f"{type(error).__name__}: {error}" if error is not None else "did not return"
        if error is not None:
            producer.closed_after(error)
        producer.record("indeterminate_insert", "unique_rollback", [(other, None)])
        producer.run.add("indeterminate", 1)
        row = [holder.unique_key, holder.token, other.token, None, None, text]
    else:
        _record(producer, other, handle, producer.ledger.execute)
        if not handle.duplicate:
            producer.committed([(other, handle.id)])
        row = [holder.unique_key, holder.token, other.token, handle.id, handle.duplicate, None]
    producer.ledger.execute("unique_rollback_insert", row)
