"""The COPY path of ``enqueue_many``: reserve lanes and ids in one call, then COPY the rows.

Only the Python producer uses this path, for batches of validated requests that run at once.
``awa.reserve_v1`` takes the lane locks (held until the caller's transaction ends), reserves
consecutive lane positions and job ids, and queues the NOTIFYs; the rows are then streamed with
one ``COPY`` into the ready ring. Everything happens in the caller's transaction.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from awa_django.sql import query
from awa_django.types import JobRequest

__all__ = ["copy_enqueue"]

# COPY text format: backslash is the escape character; tab, newline and carriage return separate
# fields and rows.
_COPY_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})
_NULL = "\\N"


def _copy_text(value: str) -> str:
    return value.translate(_COPY_ESCAPES)


def _copy_json(text: str) -> str:
    # Our JSON text never holds raw control characters (JSON escapes them), only backslashes.
    return text.replace("\\", "\\\\") if "\\" in text else text


def _copy_tags(tags: tuple[str, ...] | None) -> str:
    if not tags:
        return _NULL
    elements = ",".join('"' + t.replace("\\", "\\\\").replace('"', '\\"') + '"' for t in tags)
    return _copy_text("{" + elements + "}")


def copy_enqueue(cursor: Any, requests: Sequence[JobRequest]) -> list[int]:
    """Write immediate ``requests`` (no ``run_at``/``delay``) with COPY; return their job ids.

    Within each (queue, priority) the rows take consecutive lane positions in input order.
    """
    groups: dict[tuple[str, int], int] = {}
    for r in requests:
        key = (r.queue, r.priority)
        groups[key] = groups.get(key, 0) + 1
    keys = sorted(groups)
    cursor.execute(
        query("reserve"),
        [[q for q, _ in keys], [p for _, p in keys], [groups[k] for k in keys], len(requests)],
    )
    lane_ids, first_seqs, slot, generation, job_ids, db_now = cursor.fetchone()
    next_seq = {k: (lane_ids[i], first_seqs[i]) for i, k in enumerate(keys)}
    now = db_now.isoformat()
    head = f"{slot}\t{generation}\t"
    kinds: dict[str, str] = {}
    lines = []
    for r, job_id in zip(requests, job_ids, strict=True):
        key = (r.queue, r.priority)
        lane, seq = next_seq[key]
        next_seq[key] = (lane, seq + 1)
        kind = kinds.get(r.kind)
        if kind is None:
            kind = kinds[r.kind] = _copy_text(r.kind)
        lines.append(
            f"{head}{lane}\t{seq}\t{job_id}\t{r.priority}\t0\t{r.max_attempts}\t0\t{r.queue}\t"
            f"{kind}\t{_copy_json(r.args_json)}\t{now}\t{now}\t"
            f"{_NULL if r.deadline is None else repr(r.deadline)}\t"
            f"{_NULL if r.metadata_json is None else _copy_json(r.metadata_json)}\t"
            f"{_copy_tags(r.tags)}\n"
        )
    with cursor.copy(query("copy_ready")) as copy:
        copy.write("".join(lines))
    return list(job_ids)
