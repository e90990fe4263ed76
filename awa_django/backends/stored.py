"""How a django.tasks task is kept in a job row, and read back.

* **The task document**, stored beside the arguments (``{"args", "kwargs", "task": {...}}``):
  the backend alias, and the options the task was enqueued with (``priority``,
  ``queue_name``, ``run_after``), so that the worker and ``get_result`` rebuild the very task
  that was enqueued, as django-tasks-db does from its columns.
* **Arguments and return values** are normalised as Django normalises a ``TaskResult``'s
  (``normalize_json``: mappings become dicts, sequences lists, ``str``/``int`` subclasses such as
  ``TextChoices`` members pass), then as JSON stores them (keys become strings, subclasses
  plain values). Whatever Django refuses stays refused, and so does what JSON cannot hold
  (NaN, infinities).
* **Worker ids.** Each attempt records the ids of the workers of every attempt so far: in the
  job's progress while it runs or after it failed (a task's code never sees its progress), and
  in the stored result when it completes (``{"value": ..., "worker_ids": [...]}``, which
  ``get_result`` unwraps). They outlive the claim ring, where the database keeps its own
  record of each claim's worker for a while.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from awa_django.backends.compat import normalize_json
from awa_django.limits import PRIORITY_RANGE

__all__ = [
    "UNKNOWN_WORKER",
    "StoredTask",
    "attempt_worker_ids",
    "plain_json",
    "read_document",
    "recorded_worker_ids",
    "task_document",
    "unwrap_result",
    "wrap_result",
]

#: The worker id of an attempt whose worker left no record that survived (see docs/tasks.md).
UNKNOWN_WORKER = "unknown"

_RESULT_KEYS = frozenset({"value", "worker_ids"})


@dataclasses.dataclass(frozen=True, slots=True)
class StoredTask:
    """The task document of a job, checked: ``None`` where it holds no valid value."""

    backend: str
    priority: int | None = None
    queue_name: str | None = None
    run_after: datetime | None = None


def task_document(task: Any, alias: str) -> dict[str, Any]:
    """The task document for ``task`` enqueued on backend ``alias``: JSON, ready to store."""
    document: dict[str, Any] = {
        "backend": alias,
        "priority": task.priority,
        "queue_name": task.queue_name,
    }
    if task.run_after is not None:
        document["run_after"] = task.run_after.isoformat()
    return document


def read_document(document: Any) -> StoredTask | None:
    """The checked task document, or None when it names no backend (refuse the job)."""
    if type(document) is not dict:
        return None
    backend = document.get("backend")
    if type(backend) is not str or not backend:
        return None
    priority = document.get("priority")
    queue_name = document.get("queue_name")
    run_after: datetime | None = None
    text = document.get("run_after")
    if type(text) is str:
        try:
            run_after = datetime.fromisoformat(text)
        except ValueError:
            run_after = None
    return StoredTask(
        backend=backend,
        priority=priority
        if type(priority) is int and PRIORITY_RANGE[0] <= priority <= PRIORITY_RANGE[1]
        else None,
        queue_name=queue_name if type(queue_name) is str and queue_name else None,
        run_after=run_after,
    )


def plain_json(value: Any) -> Any:
    """``value`` normalised as Django normalises task arguments and results, then as JSON
    stores it (plain dicts, lists, str, int, float, bool and None; keys strings).

    Raises ``TypeError`` or ``ValueError`` for what Django or JSON refuses, and for keys that
    JSON would merge (``{1: "a", "1": "b"}``).
    """
    try:
        normal = normalize_json(value)
        text = json.dumps(normal, ensure_ascii=False, allow_nan=False)
        return json.loads(text, object_pairs_hook=_distinct_keys)
    except RecursionError:
        raise ValueError("nested too deeply") from None


def _distinct_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # Keys that JSON turns into the same string ({1: "a", "1": "b"}) would lose a value.
    found = dict(pairs)
    if len(found) != len(pairs):
        seen: set[str] = set()
        twice = next(key for key, _ in pairs if key in seen or seen.add(key))  # type: ignore[func-returns-value]
        raise ValueError(f"two keys of one mapping are both {twice!r} in JSON")
    return found


def wrap_result(value: Any, worker_ids: Sequence[str]) -> dict[str, Any]:
    """The stored result of a completed task: its return value and the attempts' workers."""
    return {"value": value, "worker_ids": list(worker_ids)}


def unwrap_result(stored: Any) -> tuple[Any, list[str]]:
    """(return value, recorded worker ids) of a stored result (a bare value: no ids)."""
    if type(stored) is dict and stored.keys() == _RESULT_KEYS:
        return stored["value"], _strings(stored["worker_ids"])
    return stored, []


def recorded_worker_ids(progress: Any) -> list[str]:
    """The worker ids a task's attempts recorded in its progress (``[]`` when none)."""
    if type(progress) is dict:
        metadata = progress.get("metadata")
        if type(metadata) is dict:
            return _strings(metadata.get("worker_ids"))
    return []


def attempt_worker_ids(
    attempts: int, claims: Iterable[Sequence[Any]] | None, recorded: Sequence[str]
) -> list[str]:
    """The worker id of each of ``attempts`` attempts: from the claims (``[attempt,
    worker_id]`` in claim order; a later claim of one attempt number, after a snooze, wins),
    else as recorded, else ``UNKNOWN_WORKER``."""
    claimed: dict[int, str] = {}
    for claim in claims or ():
        if len(claim) == 2 and type(claim[0]) is int and claim[1] is not None:
            claimed[claim[0]] = str(claim[1])
    return [
        claimed.get(n)
        or (recorded[n - 1] if n <= len(recorded) and recorded[n - 1] else UNKNOWN_WORKER)
        for n in range(1, max(attempts, 0) + 1)
    ]


def _strings(value: Any) -> list[str]:
    if type(value) is not list:
        return []
    return [item if type(item) is str else UNKNOWN_WORKER for item in value]
