"""Invariants of unique jobs, periodic schedules, retry policies and callback waits.

- ``unique_one_holder`` (docs/unique-jobs.md): two committed jobs with one unique key never
  hold it at the same time. A job holds its key from its enqueue until its first terminal fact
  (and again from each DLQ retry to the next); the ledger bounds both ends safely: the enqueue's
  recorded time is after the key was taken, a terminal fact's ``finalized_at`` before the key
  was released. The observer's samples of two live jobs with one key count too, and a duplicate
  answer must name a job with the same key.
- ``unique_rollback_releases``: a producer that waited for a holder which then rolled back got
  the key (a new job), never a duplicate.
- ``periodic_fires`` (docs/periodic.md): one job per schedule and fire time; none before its
  fire time or while its schedule is paused; and no fire missed beyond the catch-up policy:
  a fire time with no job is allowed only inside a pause, or when the catch-up policy drops it
  (more than ``catch_up`` later fire times were due before the schedule next fired) while the
  maintenance leader was disrupted (a fault on the leader's process, a server restart, the
  machine stalling).
- ``retry_delays`` (docs/retries.md): a retry's wait, on the database clock (its ready row's
  ``run_at`` minus the time its error was recorded), is the explicit ``RetryAfter`` delay, or
  within the job's retry policy (the producer's, else the default backoff):
  ``min(base * f(attempt), cap) <= wait <= min(base * f(attempt) * (1 + jitter), cap)``.
- ``callback_outcomes`` (docs/callbacks.md): every closed attempt that registered a callback
  has exactly one outcome (completed, an error of its attempt, cancelled); at most one
  resolution request acts on a callback; a request the API answered ``stale``, ``conflict`` or
  ``unknown`` never decides the attempt; and a request answered ``resolved`` over HTTP (applied
  at once) does.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from cronsim import CronSim

from tests.chaos.model import CronFire, Data, EndFacts, Exec, Park, ScheduleAction, Violation

__all__ = [
    "FEATURE_CHECKS",
    "callback_outcomes",
    "periodic_fires",
    "retry_delays",
    "unique_one_holder",
    "unique_rollback_releases",
]

FOREVER = datetime.max.replace(tzinfo=UTC)
RETRY_TOLERANCE = 5e-6  # seconds: run_at and the error's time are rounded to microseconds
# How late a fire may be created while the leader is healthy, and how long around a leader
# fault the leader may be missing (re-election, reconnect backoff, its first evaluation).
FIRE_LATENESS = timedelta(seconds=3)
LEADER_TAIL = timedelta(seconds=8)
LEADER_FAULTS = ("kill_worker", "term_worker", "stop_worker", "stop_leader", "terminate_backends")
ACTED = ("resolved", "accepted")


def _at(value: object) -> datetime | None:
    if isinstance(value, datetime):
        return value
    if isinstance(value, str):
        try:
            return datetime.fromisoformat(value)
        except ValueError:
            return None
    return None


# -- unique jobs ----------------------------------------------------------------------------------


def _holds(data: Data, job_id: int, took: datetime) -> list[tuple[datetime, datetime]]:
    """When ``job_id`` certainly held its key: from ``took`` (and each DLQ retry) to the next
    terminal write (sampled ``finalized_at``, or the trigger's exact record), or the end of
    time. ``took`` is when the producer recorded its commit: a job may have run and finished
    before that (a producer stalled between its commit and its record), and then it held the
    key at no moment the record can place: an empty hold."""
    ends = sorted(
        [t.finalized_at for t in data.features.terminals.get(job_id, []) if t.finalized_at]
        + data.terminal_written_at.get(job_id, [])
    )
    holds = [(took, next((e for e in ends if e > took), took if ends else FOREVER))]
    for start in data.features.dlq_retried_at.get(job_id, []):
        holds.append((start, next((e for e in ends if e > start), FOREVER)))
    return holds


def unique_one_holder(data: Data, facts: EndFacts) -> list[Violation]:
    out = []
    keys: dict[tuple[str, str], list[tuple[datetime, datetime, int]]] = collections.defaultdict(
        list
    )
    for u in data.features.unique_enqueues:
        if u.duplicate:
            holder = data.features.options.get(u.job_id)
            if holder is not None and (holder.kind, holder.unique_key) != (u.kind, u.key):
                out.append(
                    Violation(
                        "unique_one_holder",
                        (u.job_id,),
                        f"enqueue {u.token} with key {u.key!r} was told job {u.job_id} holds "
                        f"it, but that job has key {holder.unique_key!r} ({holder.kind})",
                    )
                )
            continue
        if u.job_id not in data.committed:
            continue
        for start, end in _holds(data, u.job_id, u.at):
            keys[(u.kind, u.key)].append((start, end, u.job_id))
    for (kind, key), holds in sorted(keys.items()):
        holds.sort()
        for i, (start, end, job_id) in enumerate(holds):
            for other_start, other_end, other in holds[i + 1 :]:
                if other_start >= end:
                    break
                if other != job_id and other_end > start:
                    out.append(
                        Violation(
                            "unique_one_holder",
                            (job_id, other),
                            f"{kind} key {key!r}: job {other} took it at "
                            f"{other_start.isoformat(timespec='milliseconds')} while job "
                            f"{job_id} held it (from {start.isoformat(timespec='milliseconds')}"
                            f", first released at {end.isoformat(timespec='milliseconds')})",
                        )
                    )
    for key, ids, states in data.features.unique_overlaps:
        out.append(
            Violation("unique_one_holder", tuple(ids), f"key {key!r} live twice at once: {states}")
        )
    return out


def unique_rollback_releases(data: Data, facts: EndFacts) -> list[Violation]:
    out = []
    for r in data.features.unique_rollbacks:
        if r.second_duplicate:
            ids = (r.second_job_id,) if r.second_job_id is not None else ()
            out.append(
                Violation(
                    "unique_rollback_releases",
                    ids,
                    f"key {r.key!r}: the holder ({r.rolled_token}) rolled back, yet the producer "
                    f"that waited for it ({r.second_token}) was told job {r.second_job_id} "
                    "holds the key",
                )
            )
    return out


# -- periodic schedules ---------------------------------------------------------------------------


def _fire_times(cron: str, timezone: str, after: datetime, until: datetime) -> list[datetime]:
    times = []
    for fire in CronSim(cron, after.astimezone(ZoneInfo(timezone))):
        if fire > until:
            break
        times.append(fire.astimezone(UTC))
    return times


def _pauses(data: Data, name: str) -> list[tuple[ScheduleAction, ScheduleAction | None]]:
    """Each pause of ``name`` with the resume after it (None: never resumed)."""
    pairs: list[tuple[ScheduleAction, ScheduleAction | None]] = []
    pause = None
    for action in data.features.schedule_actions:
        if action.name != name:
            continue
        if action.action == "pause" and pause is None:
            pause = action
        elif action.action == "resume" and pause is not None:
            pairs.append((pause, action))
            pause = None
    if pause is not None:
        pairs.append((pause, None))
    return pairs


def _end_of_window(data: Data, name: str) -> datetime | None:
    """By when every fire of ``name`` had to be made: a little before the final pause (made
    once the faults stopped and the schedule caught up)."""
    actions = [a for a in data.features.schedule_actions if a.name == name]
    if not actions or actions[-1].action != "pause":
        return None
    return actions[-1].began - FIRE_LATENESS


def _leader_disrupted(data: Data, start: datetime, end: datetime) -> bool:
    """Whether the maintenance leader may have been missing at some moment of [start, end]."""
    lo, hi = start - LEADER_TAIL, end
    leaders = {
        pid for at, pid in data.features.leaders if lo - LEADER_TAIL <= at <= hi + LEADER_TAIL
    }
    if None in leaders or len(leaders) > 1:  # none, or leadership moved
        return True
    for f in data.faults:
        if f.started_at > hi or f.ended_at + LEADER_TAIL < lo:
            continue
        if f.kind.startswith("restart") or f.kind == "stall":
            return True
        if f.kind in LEADER_FAULTS and (f.pid is None or f.pid in leaders):
            return True
    return False


def periodic_fires(data: Data, facts: EndFacts) -> list[Violation]:
    out = []
    fires: dict[str, list[CronFire]] = collections.defaultdict(list)
    for fire in data.features.cron_fires:
        if not fire.manual:
            fires[fire.name].append(fire)
    for name, found in sorted(fires.items()):
        by_time: dict[datetime, set[int]] = collections.defaultdict(set)
        pauses = _pauses(data, name)
        for fire in found:
            by_time[fire.fire_time].add(fire.job_id)
            when = f"{fire.fire_time.isoformat()} enqueued at {_ms(fire.created_at)}"
            if fire.created_at < fire.fire_time:
                out.append(Violation("periodic_fires", (fire.job_id,), f"{name}: {when}: early"))
            for pause, resume in pauses:
                # Paused from the pause's commit (before its record ended) to the resume's start.
                resumed = resume.began if resume is not None else FOREVER
                if pause.certain and pause.ended < fire.created_at < resumed:
                    why = f"paused by {_ms(pause.ended)}"
                    out.append(
                        Violation("periodic_fires", (fire.job_id,), f"{name}: {when}: {why}")
                    )
        for at, ids in sorted(by_time.items()):
            if len(ids) > 1:
                text = f"{name}: {len(ids)} jobs for the fire time {at.isoformat()}"
                out.append(Violation("periodic_fires", tuple(sorted(ids)), text))
        out.extend(_missed(data, name, found, pauses))
    return out


def _ms(at: datetime) -> str:
    return at.isoformat(timespec="milliseconds")


def _missed(
    data: Data,
    name: str,
    found: list[CronFire],
    pauses: list[tuple[ScheduleAction, ScheduleAction | None]],
) -> list[Violation]:
    schedule = data.features.schedules.get(name)
    until = _end_of_window(data, name)
    if schedule is None or until is None or not found:
        return []
    made = sorted((f.fire_time, f.created_at) for f in found)
    have = {t for t, _ in made}
    expected = _fire_times(schedule.cron, schedule.timezone, made[0][0], until)
    out = []
    for due in expected:
        if due in have:
            continue
        if any(
            p.began - FIRE_LATENESS <= due <= (r.ended if r is not None else FOREVER)
            for p, r in pauses
        ):
            continue
        # When the schedule next fired, and how many later fire times were due by then: the
        # catch-up policy drops `due` only when at least catch_up of them were, which needs the
        # leader to have been missing while they came due.
        nxt = next((c for t, c in made if t > due), until)
        newer = _fire_times(schedule.cron, schedule.timezone, due, nxt)
        dropped = len(newer) >= schedule.catch_up
        if dropped and _leader_disrupted(data, due, newer[schedule.catch_up - 1]):
            continue
        why = (
            "the catch-up policy dropped it, but no fault disrupted the leader meanwhile"
            if dropped
            else f"{len(newer)} later fire time(s) were due when it next fired, at {_ms(nxt)}, "
            f"and catch_up is {schedule.catch_up}"
        )
        out.append(Violation("periodic_fires", (), f"{name}: fire {due.isoformat()} missed: {why}"))
    return out


# -- retry policies -------------------------------------------------------------------------------


def _bounds(policy: dict[str, object], attempt: int, default_base: float) -> tuple[float, float]:
    """The shortest and longest wait awa._backoff_v2 may give after ``attempt`` failed."""
    base = policy.get("base")
    base = float(base) if isinstance(base, int | float) else default_base
    backoff = policy.get("backoff", "exponential")
    if backoff == "constant":
        factor = 1.0
    elif backoff == "linear":
        factor = float(max(attempt, 0))
    else:
        factor = float(2 ** min(max(attempt, 0), 40))
    jitter = policy.get("jitter", 0.25)
    jitter = float(jitter) if isinstance(jitter, int | float) else 0.25
    cap = policy.get("cap", 86400.0)
    cap = float(cap) if isinstance(cap, int | float) else 86400.0
    return min(base * factor, cap), min(base * factor * (1 + jitter), cap)


def _retry_wait(e: Exec) -> tuple[dict[str, object], float] | None:
    """The error that made ``e``'s attempt and the wait before it, for a retry's emission."""
    err = e.last_error
    if (
        e.attempt < 2
        or e.run_at is None
        or not isinstance(err, dict)
        or err.get("attempt") != e.attempt - 1
        or e.prev_outcome not in ("retry", "rescued")
    ):
        return None
    at = _at(err.get("at"))
    return None if at is None else (err, (e.run_at - at).total_seconds())


def retry_delays(data: Data, facts: EndFacts) -> list[Violation]:
    out = []
    for job_id, rows in sorted(data.execs.items()):
        options = data.features.options.get(job_id)
        policy = options.retry if options and options.retry else {}
        for e in rows:
            found = _retry_wait(e)
            if found is None:
                continue
            err, wait = found
            if err.get("type") == "awa_django.RetryAfter":
                low = high = facts.retry_after_seconds
                what = "RetryAfter"
            else:
                low, high = _bounds(policy, e.attempt - 1, facts.retry_backoff_base)
                what = f"policy {policy or 'default'}"
            if not low - RETRY_TOLERANCE <= wait <= high + RETRY_TOLERANCE:
                out.append(
                    Violation(
                        "retry_delays",
                        (job_id,),
                        f"attempt {e.attempt} (lease {e.run_lease}) ran {wait:.6f} s after "
                        f"attempt {e.attempt - 1} failed ({err.get('type')}), but {what} "
                        f"allows {low:.6f}..{high:.6f} s",
                    )
                )
    return out


# -- callback waits -------------------------------------------------------------------------------


def _request_of(err: dict[str, object]) -> str | None:
    if err.get("type") != "awa_django.CallbackError":
        return None
    words = str(err.get("message", "")).split()
    return words[-1] if words else None


def _outcomes(data: Data, park: Park) -> list[tuple[str, str | None]]:
    """What ended ``park``'s attempt: (what, the request it names, if any). Every ending but a
    completion appends an error of the attempt's number; a ``Cancelled`` after another one is
    the job cancelled later (while it waited for its retry), not a second ending."""
    found: list[tuple[str, str | None]] = []
    for err in data.errors(park.job_id):
        if err.get("attempt") != park.attempt or (found and err.get("type") == "Cancelled"):
            continue
        found.append((str(err.get("type")), _request_of(err)))
    for t in data.features.terminals.get(park.job_id, []):
        if t.run_lease == park.run_lease and t.state == "completed":
            by = t.result.get("by") if isinstance(t.result, dict) else None
            found.append(("completed", str(by) if by else None))
    return found


def _closed(data: Data, park: Park) -> bool:
    later = any((e.run_lease or 0) > park.run_lease for e in data.execs.get(park.job_id, []))
    live = any(
        row[0] not in ("completed", "failed", "cancelled")
        for row in data.current.get(park.job_id, [])
    )
    return later or (park.job_id in data.terminal_seen and not live)


def callback_outcomes(data: Data, facts: EndFacts) -> list[Violation]:
    out = []
    calls = collections.defaultdict(list)
    for call in data.features.calls:
        calls[call.callback_id].append(call)
    for park in data.features.parks:
        if data.dlq_retries[park.job_id] or not _closed(data, park):
            continue
        mine = calls.get(park.callback_id, [])

        def bad(text: str, park: Park = park, mine: list = mine) -> None:
            answers = ", ".join(f"{c.via} {c.body} {c.request_id[:8]}: {c.outcome}" for c in mine)
            out.append(
                Violation(
                    "callback_outcomes",
                    (park.job_id,),
                    f"callback {park.callback_id} ({park.mode}) of lease {park.run_lease}: {text}"
                    f" (calls: {answers or 'none'}; {data.snapshot(park.job_id)})",
                )
            )

        acted = {c.request_id for c in mine if c.outcome in ACTED and not c.replayed}
        if len(acted) > 1:
            bad(f"{len(acted)} resolutions acted")
        outcomes = _outcomes(data, park)
        if len(outcomes) != 1:
            bad(f"{len(outcomes)} outcomes for one attempt: {outcomes}")
        for what, request in outcomes:
            if request is None:
                continue
            answers = [c.outcome for c in mine if c.request_id == request]
            if not answers:
                bad(f"ended by {what} of request {request}, which was never sent for it")
            elif not any(a in ACTED or a == "error" for a in answers):
                bad(f"ended by {what} of request {request[:8]}, which was answered {answers}")
        applied = {c.request_id for c in mine if c.via == "http" and c.outcome == "resolved"}
        for request in applied - {r for _, r in outcomes}:
            bad(f"request {request[:8]} was answered resolved (applied) but did not end it")
    return out


FEATURE_CHECKS: tuple[Callable[[Data, EndFacts], list[Violation]], ...] = (
    unique_one_holder,
    unique_rollback_releases,
    periodic_fires,
    retry_delays,
    callback_outcomes,
)
