"""The COPY path of ``enqueue_many``: reserve lanes and ids in one call, then COPY the rows.

Only the Python producer uses this path, for batches of validated requests that run at once.
``awa.reserve_v1`` takes the lane locks (held until the caller's transaction ends), reserves
consecutive lane positions and job ids, and queues the NOTIFYs; the rows are then streamed with
one binary ``COPY`` into the ready ring (psycopg's ``write_row``: no text escaping of ours).
Everything happens in the caller's transaction.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from psycopg import postgres
from psycopg.adapt import Buffer, Dumper
from psycopg.pq import Format

from awa_django.sql import query
from awa_django.types import JobRequest

__all__ = ["copy_enqueue"]

# The columns of the ``copy_ready`` statement, in order: binary COPY applies no casts, so each
# value is sent as exactly its column's type.
_READY_TYPES = (
    "int4",  # ready_slot
    "int8",  # ready_generation
    "int4",  # lane_id
    "int8",  # lane_seq
    "int8",  # job_id
    "int2",  # priority
    "int2",  # attempt
    "int2",  # max_attempts
    "int8",  # run_lease
    "text",  # queue
    "text",  # kind
    "jsonb",  # args
    "timestamptz",  # run_at
    "timestamptz",  # created_at
    "float8",  # deadline_secs
    "jsonb",  # metadata
    "text[]",  # tags
)


class _JsonTextBinaryDumper(Dumper):
    """jsonb in binary COPY from JSON text: requests hold their JSON already checked and encoded
    (``serialization.dumps``); jsonb's binary form is a version byte and that text."""

    format = Format.BINARY
    oid = postgres.types["jsonb"].oid

    def dump(self, obj: str) -> Buffer:
        return b"\x01" + obj.encode()


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
    # By oid only: used for the jsonb columns of set_types, never for the caller's parameters.
    cursor.adapters.register_dumper(None, _JsonTextBinaryDumper)
    with cursor.copy(query("copy_ready") + " (FORMAT BINARY)") as copy:
        copy.set_types(_READY_TYPES)
        write_row = copy.write_row
        for r, job_id in zip(requests, job_ids, strict=True):
            key = (r.queue, r.priority)
            lane, seq = next_seq[key]
            next_seq[key] = (lane, seq + 1)
            write_row(
                (
                    slot,
                    generation,
                    lane,
                    seq,
                    job_id,
                    r.priority,
                    0,
                    r.max_attempts,
                    0,
                    r.queue,
                    r.kind,
                    r.args_json,
                    db_now,
                    db_now,
                    r.deadline,
                    r.metadata_json,
                    list(r.tags) if r.tags else None,
                )
            )
    return list(job_ids)
