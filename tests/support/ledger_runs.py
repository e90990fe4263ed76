"""Who ran when, read from the Ledger rows that the handlers of tests/jobs/common.py write at
their start and end (database clock), never from job states, which finish in batches."""

from __future__ import annotations

import itertools
from collections import defaultdict
from datetime import datetime
from typing import Any

from tests.support.database import count
from tests.testapp.models import Ledger

__all__ = [
    "Run",
    "assert_one_at_a_time",
    "completed",
    "max_overlap",
    "overlapping_pairs",
    "running_now",
    "runs_by_key",
]


Run = tuple[datetime, datetime, int, int]  # start, end, job id, run lease


def max_overlap(
    killed_at: dict[tuple[int, int], Any] | None = None, queue: str | None = None
) -> int:
    """The most permits in use at once, from the ledger: +weight at each start, -weight at the
    attempt's end (an attempt whose process was killed ends at the kill)."""
    ledger = Ledger.objects.all() if queue is None else Ledger.objects.filter(queue=queue)
    rows = list(ledger.values_list("job_id", "run_lease", "note", "created_at"))
    weights = {(j, lease): int(n.split(":")[1]) for j, lease, n, _ in rows if n.startswith("start")}
    events = []
    ended = set()
    for job_id, lease, note, at in rows:
        key = (job_id, lease)
        if note.startswith("start"):
            events.append((at, 1, weights[key]))
        elif note == "end":
            events.append((at, 0, -weights[key]))
            ended.add(key)
    for key, at in (killed_at or {}).items():
        if key in weights and key not in ended:
            events.append((at, 0, -weights[key]))
    running = peak = 0
    for _, _, delta in sorted(events):  # at equal times, ends (0) before starts (1)
        running += delta
        peak = max(peak, running)
    return peak


def running_now() -> int:
    starts = Ledger.objects.filter(note__startswith="start").count()
    return starts - Ledger.objects.filter(note="end").count()


def completed(queue: str) -> int:
    return count("SELECT count(*) FROM awa.jobs WHERE queue = %s AND state = 'completed'", queue)


def runs_by_key(killed_at: datetime | None = None) -> dict[str, list[Run]]:
    """Every handler run of each key, by start: an attempt without an end row ended at
    ``killed_at`` (its process was killed)."""
    starts: dict[tuple[int, int], tuple[datetime, str]] = {}
    ends: dict[tuple[int, int], datetime] = {}
    for job_id, lease, note, at in Ledger.objects.values_list(
        "job_id", "run_lease", "note", "created_at"
    ):
        if note.startswith("start:"):
            starts[(job_id, lease)] = (at, note.split(":", 1)[1])
        elif note == "end":
            ends[(job_id, lease)] = at
    runs: dict[str, list[Run]] = defaultdict(list)
    for (job_id, lease), (at, key) in starts.items():
        end = ends.get((job_id, lease), killed_at)
        assert end is not None, f"job {job_id} lease {lease} never ended"
        runs[key].append((at, end, job_id, lease))
    for key_runs in runs.values():
        key_runs.sort()
    return runs


def assert_one_at_a_time(runs: list[Run]) -> None:
    for before, after in itertools.pairwise(runs):
        assert after[0] >= before[1], f"job {after[2]} started before job {before[2]} ended"


def overlapping_pairs(runs: dict[str, list[Run]], keys: list[str]) -> int:
    """How many pairs of runs of different keys overlapped in time."""
    pairs = 0
    for i, a in enumerate(keys):
        for b in keys[i + 1 :]:
            for start_a, end_a, _, _ in runs[a]:
                for start_b, end_b, _, _ in runs[b]:
                    if start_a < end_b and start_b < end_a:
                        pairs += 1
    return pairs
