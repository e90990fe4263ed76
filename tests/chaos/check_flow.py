"""Invariants of fleet-wide flow control (docs/flow.md), checked from the handlers' executions.

Each execution is known by its handler's interval: from its start row to its finish row (both
written by the handler itself, on the database clock), so it lies inside the time its attempt
held its permits or serial key (taken by the claim before the handler starts, handed back after
it returns). An execution whose end was not recorded counts until its worker was SIGKILLed, or
only at its start.

- ``flow_concurrency``: whenever a handler starts, the handlers of the queue (or kind) running
  then, each counted as ``min(weight, limit)``, add up to at most the limit in force. A lowered
  limit may be exceeded by attempts that were running when it was lowered, until they end, but no
  attempt may start until the running ones fit: so at each start the limit is that of the
  attempts running then (the largest any of their claims could have read: a claim reads the
  limits somewhere between its transaction's start, its ``claimed_at``, and its handler's start).
- ``flow_rate``: over the claims of a rate-limited queue made under one rate and burst, any
  ``n`` claims within ``t`` seconds satisfy ``n <= rate * t + burst`` (a GCRA on the database
  clock; ``claimed_at`` of a rate-limited queue is the clock its claim took the tokens at).
  Claims within ``RATE_READ_SLACK`` after a change may have read either limits and are left out.
- ``flow_serial``: two handlers of different jobs with the same serial key in one queue never run
  at the same time.

What the documentation allows is allowed: an attempt whose worker lost its database session
between its claim and its handler's end (a PostgreSQL restart, its connection terminated, the
worker frozen long enough to be reaped by the leader) may run beside the attempts that took its
permits or key meanwhile, until it ends; such executions are left out. The observer samples
the workers' sessions every second (``chaos.sessions``), so a lost session is known to within
a sample.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta

from tests.chaos.model import Data, EndFacts, Exec, LimitChange, Violation

__all__ = ["FLOW_CHECKS", "Limits", "flow_concurrency", "flow_rate", "flow_serial"]

RATE_READ_SLACK = timedelta(seconds=2)
RATE_TOLERANCE = 0.01  # jobs: rounding of the rate state to microseconds
CLAIM_LEAD = timedelta(seconds=5)  # when a claim's time is unknown: how long before its start
# Faults after which a worker's session (its permits and keys) may be gone.
SESSION_FAULTS = ("stop_worker", "stop_leader", "terminate_backends")


class Limits:
    """The flow limits of one scope over time, from its recorded changes."""

    def __init__(self, changes: Iterable[LimitChange]) -> None:
        self.changes = sorted(changes, key=lambda c: c.began)

    def plausible(self, start: datetime, end: datetime) -> list[LimitChange]:
        """Every change whose limits may have been in force at some moment of [start, end]:
        the last certain change committed by ``start``, and any change begun after it by
        ``end``."""
        settled = -1
        for i, change in enumerate(self.changes):
            if change.certain and change.ended <= start:
                settled = i
        found = [self.changes[settled]] if settled >= 0 else []
        return found + [c for c in self.changes[settled + 1 :] if c.began <= end]

    def max_running(self, start: datetime, end: datetime) -> int | None:
        """The highest concurrency limit plausible in [start, end]; None if none or unlimited."""
        values = [c.max_running for c in self.plausible(start, end)]
        if not values or any(v is None for v in values):
            return None
        return max(v for v in values if v is not None)

    def rate(self, start: datetime, end: datetime) -> tuple[float, int] | None:
        """The one (rate, burst) in force throughout [start, end]; None when unlimited or when
        it may have changed."""
        values = {(c.rate, c.burst) for c in self.plausible(start, end)}
        if len(values) != 1:
            return None
        [(rate, burst)] = values
        return None if rate is None or burst is None else (rate, burst)


@dataclasses.dataclass(frozen=True)
class Run:
    """One execution as flow control sees it."""

    exec: Exec
    start: datetime
    end: datetime
    weight: int
    claimed: datetime
    excused: bool

    def describe(self) -> str:
        e = self.exec
        return (
            f"job {e.job_id} lease {e.run_lease} weight {self.weight} pid {e.pid} "
            f"{self.start.isoformat(timespec='milliseconds')}.."
            f"{self.end.isoformat(timespec='milliseconds')}"
        )


def timelines(data: Data) -> dict[str, Limits]:
    """Each scope's limits (``queue:NAME``, ``kind:NAME``)."""
    by_scope: dict[str, list[LimitChange]] = collections.defaultdict(list)
    for change in data.features.limit_changes:
        by_scope[change.scope].append(change)
    return {scope: Limits(changes) for scope, changes in by_scope.items()}


def _end(e: Exec, data: Data) -> datetime:
    if e.finished_at is not None:
        return e.finished_at
    died = data.deaths.get(e.pid)
    if died is not None and e.pid not in data.slow_deaths and died >= e.started_at:
        return died  # SIGKILLed: the handler ran until then
    return e.started_at


def _session_lost(e: Exec, since: datetime, end: datetime, data: Data) -> bool:
    """Whether ``e``'s worker may have lost the session holding its permits and keys between
    ``since`` (the attempt's claim, which took them) and the handler's end: one of the worker's
    sessions ended meanwhile (the observer's samples), or, for a worker the samples do not
    name, a fault that can end it (a server restart, its connections terminated, the worker
    frozen, the machine stalling). A worker frozen between a claim and its handler's start
    finds, on waking, its permits reaped and taken; it runs the handler all the same (and says
    so in its log), as a worker that lost its session mid-run does."""
    if e.worker_id is not None:
        losses = data.features.session_losses.get(f"awa:worker:{e.worker_id}", [])
        if any(lo <= end and hi >= since for lo, hi in losses):
            return True
    for f in data.faults:
        if f.started_at > end or f.ended_at < since:
            continue
        if f.kind.startswith("restart"):
            return True
        if e.worker_id is None and (
            f.kind == "stall" or (f.kind in SESSION_FAULTS and f.pid in (None, e.pid))
        ):
            return True
    return False


def runs(data: Data, belongs: Callable[[Exec], bool]) -> list[Run]:
    """The executions that ``belongs`` selects, by start."""
    found = []
    for rows in data.execs.values():
        for e in rows:
            if e.run_lease is None or not belongs(e):
                continue
            options = data.features.options.get(e.job_id)
            weight = options.weight if options and options.weight else e.weight or 1
            end = _end(e, data)
            claimed = e.claimed_at or e.started_at - CLAIM_LEAD
            excused = _session_lost(e, claimed, end, data)
            found.append(Run(e, e.started_at, end, weight, claimed, excused))
    return sorted(found, key=lambda r: (r.start, r.exec.job_id))


def _member(scope: str, data: Data) -> Callable[[Exec], bool]:
    kind, name = scope.split(":", 1)

    def belongs(e: Exec) -> bool:
        options = data.features.options.get(e.job_id)
        if kind == "kind":
            return (e.kind or (options.kind if options else None)) == name
        return (e.queue or (options.queue if options else None)) == name

    return belongs


# -- the invariants --------------------------------------------------------------------------------


def flow_concurrency(data: Data, facts: EndFacts) -> list[Violation]:
    out = []
    for scope, limits in sorted(timelines(data).items()):
        if not any(c.max_running for c in limits.changes):
            continue
        active: list[tuple[Run, int | None]] = []
        for run in runs(data, _member(scope, data)):
            if run.excused:
                continue
            active = [(r, lim) for r, lim in active if r.end > run.start]
            group = [*active, (run, limits.max_running(run.claimed, run.start))]
            if any(lim is None for _, lim in group):
                active.append(group[-1])
                continue
            limit = max(lim for _, lim in group if lim is not None)
            total = sum(min(r.weight, limit) for r, _ in group)
            if total > limit:
                out.append(
                    Violation(
                        "flow_concurrency",
                        tuple(r.exec.job_id for r, _ in group),
                        f"{scope}: {total} units running at "
                        f"{run.start.isoformat(timespec='milliseconds')} under a limit of "
                        f"{limit}: " + "; ".join(r.describe() for r, _ in group),
                    )
                )
            active.append(group[-1])
    return out


def flow_rate(data: Data, facts: EndFacts) -> list[Violation]:
    out = []
    for scope, limits in sorted(timelines(data).items()):
        if not any(c.rate for c in limits.changes):
            continue
        claims = sorted(
            {
                (r.exec.claimed_at, r.exec.job_id, r.exec.run_lease)
                for r in runs(data, _member(scope, data))
                if r.exec.claimed_at is not None
            }
        )
        segment: list[tuple[datetime, int, int | None]] = []
        regime: tuple[float, int] | None = None
        for claim in [*claims, None]:
            now = None if claim is None else limits.rate(claim[0] - RATE_READ_SLACK, claim[0])
            if now != regime or now is None:
                if regime is not None:
                    out.extend(_rate_segment(scope, regime, segment))
                segment, regime = [], now
            if claim is not None and now is not None:
                segment.append(claim)
    return out


def _rate_segment(
    scope: str, regime: tuple[float, int], claims: list[tuple[datetime, int, int | None]]
) -> list[Violation]:
    """The worst window of ``claims`` (all under ``regime``): n claims over t seconds must be
    at most rate * t + burst."""
    rate, burst = regime
    if not claims:
        return []
    origin = claims[0][0]
    best_i, best_low = 0, 0.0  # the i minimising i - rate * t_i so far
    worst = (0.0, 0, 0)
    for j, (at, _, _) in enumerate(claims):
        t = (at - origin).total_seconds()
        low = j - rate * t
        if low < best_low or j == 0:
            best_i, best_low = j, low
        excess = (low - best_low) + 1 - burst
        if excess > worst[0]:
            worst = (excess, best_i, j)
    excess, i, j = worst
    if excess <= RATE_TOLERANCE:
        return []
    span = (claims[j][0] - claims[i][0]).total_seconds()
    return [
        Violation(
            "flow_rate",
            tuple(c[1] for c in claims[i : j + 1]),
            f"{scope}: {j - i + 1} jobs started in {span:.3f} s from "
            f"{claims[i][0].isoformat(timespec='milliseconds')}, but rate {rate:g}/s with burst "
            f"{burst} allows {rate * span + burst:.2f}",
        )
    ]


def flow_serial(data: Data, facts: EndFacts) -> list[Violation]:
    groups: dict[tuple[str, str], list[Run]] = collections.defaultdict(list)

    def key_of(e: Exec) -> tuple[str, str] | None:
        options = data.features.options.get(e.job_id)
        key = options.serial_key if options and options.serial_key else e.serial_key
        queue = e.queue or (options.queue if options else None)
        return None if key is None or queue is None else (queue, key)

    for run in runs(data, lambda e: key_of(e) is not None):
        key = key_of(run.exec)
        assert key is not None
        groups[key].append(run)
    out = []
    for (queue, key), members in sorted(groups.items()):
        active: list[Run] = []
        for run in members:
            active = [r for r in active if r.end > run.start]
            for other in active:
                if other.exec.job_id == run.exec.job_id or other.excused or run.excused:
                    continue
                out.append(
                    Violation(
                        "flow_serial",
                        (other.exec.job_id, run.exec.job_id),
                        f"queue {queue} serial key {key!r}: two jobs ran at once: "
                        f"{other.describe()} / {run.describe()}",
                    )
                )
            active.append(run)
    return out


FLOW_CHECKS: tuple[Callable[[Data, EndFacts], list[Violation]], ...] = (
    flow_concurrency,
    flow_rate,
    flow_serial,
)
