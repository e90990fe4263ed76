"""The checker: awa_django's contract as functions over the ledger and awa's own tables.

``check_all(conn, facts)`` loads what the run recorded (``chaos.*``) and what the queue holds
(``awa.jobs``) and returns every violation, each with the job ids and the evidence. Each
invariant is one function of ``(Data, EndFacts)``:

- ``committed_terminal``: every committed job (and every indeterminate one that exists) appears
  exactly once in awa.jobs, reaches a terminal state within the bound, and reaches exactly one
  terminal state (one more per DLQ retry);
- ``rolled_back_invisible``: nothing from a rolled-back transaction ever existed or ran;
- ``attempt_once``: no ``(job_id, run_lease)`` ran twice;
- ``executions_explained``: executions <= 1 + errors + snoozes + DLQ retries;
- ``overlap_rescued``: two executions of one job overlap only if the earlier one was rescued;
- ``nothing_left_live``: no job is available/running/waiting/scheduled/retryable at the end;
- ``rings_shrink``: claim and lease ring rows drop back once pins and locks are gone;
- ``workers_alive``: every worker alive with a fresh runtime row, clean logs, no worker that
  exited on its own, a clean SIGTERM stop;
- ``api_calls_work``: producer, operator and resolver calls into awa_django fail only with
  connection errors (a refusal or a SQL error is a bug);
- ``rescues_explained``: a "heartbeat stale" rescue happens only around a fault that can stop
  heartbeats (the worker killed or stopped, its connection terminated, a server restart, or
  the machine itself stalling).

The features' invariants are in tests/chaos/check_flow.py (``flow_concurrency``,
``flow_rate``, ``flow_serial``), tests/chaos/check_features.py (``unique_one_holder``,
``unique_rollback_releases``, ``periodic_fires``, ``retry_delays``, ``callback_outcomes``) and
tests/chaos/check_workflows.py (``workflow_order``, ``workflow_released_once``,
``workflow_not_stuck``);
``CHECKS`` runs them all. The data they read is described in tests/chaos/model.py.
"""

from __future__ import annotations

import collections
import json
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from typing import Any

import psycopg

from tests.chaos.check_features import FEATURE_CHECKS
from tests.chaos.check_flow import FLOW_CHECKS
from tests.chaos.check_workflows import WORKFLOW_CHECKS, held_steps, load_workflows
from tests.chaos.feature_load import load_features
from tests.chaos.model import (
    CAUSE_LEAD,
    FAR_FUTURE,
    PID_FAULTS,
    RESCUED,
    RESTART_TAIL,
    STALE,
    TERMINAL,
    WIND_DOWN,
    Data,
    EndFacts,
    Exec,
    Fault,
    Violation,
)

__all__ = ["CHECKS", "Data", "EndFacts", "Violation", "check_all", "load"]


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


def load(conn: psycopg.Connection[Any]) -> Data:
    """Read the ledger and awa.jobs (the run is over; nothing changes any more)."""

    def rows(query: str) -> list[tuple[Any, ...]]:
        return conn.execute(query).fetchall()

    execs: dict[int, list[Exec]] = collections.defaultdict(list)
    tokens: dict[str, int] = {}
    for row in rows(
        "SELECT job_id, run_lease, attempt, pid, behaviour, token, action, started_at, "
        "finished_at, claimed_at, run_at, queue, kind, last_error, prev_outcome, weight, "
        "serial_key, worker_id::text FROM chaos.exec "
        "ORDER BY job_id, run_lease NULLS LAST, started_at"
    ):
        e = Exec(*row[:13], _json(row[13]), *row[14:])
        execs[e.job_id].append(e)
        if e.token:
            tokens[e.token] = e.job_id
    job_tokens: dict[str, int] = {}
    seen: dict[int, list[Any]] = collections.defaultdict(list)
    last_terminal: dict[int, datetime] = {}
    for job_id, state, in_dlq, lease, attempt, errors, token, seen_at in rows(
        "SELECT job_id, state, in_dlq, run_lease, attempt, errors, token, seen_at "
        "FROM chaos.terminal_seen ORDER BY job_id, seen_at"
    ):
        seen[job_id].append((state, in_dlq, lease, attempt, _json(errors) or []))
        job_tokens[token] = job_id
        last_terminal[job_id] = seen_at
    written: dict[int, list[tuple[str, bool, int]]] = collections.defaultdict(list)
    written_at_of: dict[int, list[datetime]] = collections.defaultdict(list)
    for job_id, state, in_dlq, lease, written_at in rows(
        "SELECT job_id, state, in_dlq, run_lease, written_at "
        "FROM chaos.terminal_written ORDER BY job_id, written_at"
    ):
        written[job_id].append((state, in_dlq, lease))
        written_at_of[job_id].append(written_at)
        last_terminal[job_id] = max(written_at, last_terminal.get(job_id, written_at))
    current: dict[int, list[Any]] = collections.defaultdict(list)
    for job_id, state, in_dlq, lease, attempt, errors, token in rows(
        "SELECT id, state, in_dlq, run_lease, attempt, errors, args -> 'args' ->> 0 FROM awa.jobs"
    ):
        current[job_id].append((state, in_dlq, lease, attempt, _json(errors) or []))
        job_tokens[token] = job_id
    deaths = rows("SELECT pid, died_at, cause FROM chaos.worker_deaths")
    return Data(
        committed={
            r[0]: (r[1], r[2], r[3], r[4])
            for r in rows("SELECT job_id, token, path, kind, behaviour FROM chaos.committed")
        },
        rolled_back=[tuple(r) for r in rows("SELECT token, job_id, path FROM chaos.rolled_back")],
        indeterminate=[
            tuple(r) for r in rows("SELECT token, job_id, path FROM chaos.indeterminate")
        ],
        execs=dict(execs),
        exec_tokens=tokens,
        job_tokens=job_tokens,
        terminal_seen=dict(seen),
        current=dict(current),
        duplicates={
            r[0]: (r[1], r[2]) for r in rows("SELECT job_id, copies, states FROM chaos.duplicates")
        },
        dlq_retries=collections.Counter(r[0] for r in rows("SELECT job_id FROM chaos.dlq_retried")),
        last_dlq_retry=dict(
            rows("SELECT job_id, max(retried_at) FROM chaos.dlq_retried GROUP BY job_id")
        ),
        last_terminal=last_terminal,
        deaths={pid: died for pid, died, _ in deaths},
        slow_deaths={pid for pid, _, cause in deaths if not cause.startswith("sigkill")},
        faults=[
            Fault(*r)
            for r in rows("SELECT kind, pid, detail, started_at, ended_at FROM chaos.faults")
        ],
        features=load_features(rows),
        terminal_written=dict(written),
        terminal_written_at=dict(written_at_of),
        workflows=load_workflows(rows),
    )


# -- the invariants --------------------------------------------------------------------------------


def tracked_jobs(data: Data) -> dict[int, str]:
    """Committed jobs, jobs that periodic schedules fired, plus indeterminate ones that turned
    out to exist: id -> how we know."""
    jobs = {job_id: f"committed via {path}" for job_id, (_, path, _, _) in data.committed.items()}
    for fire in data.features.cron_fires:
        jobs.setdefault(fire.job_id, f"fired by {fire.name}")
    for token, job_id, path in data.indeterminate:
        found = job_id if job_id is not None else data.token_job(token)
        if found is None or found in jobs:
            continue
        if (
            found in data.current
            or found in data.terminal_seen
            or found in data.terminal_written
            or found in data.execs
        ):
            jobs[found] = f"indeterminate via {path}, exists"
    return jobs


def committed_terminal(data: Data, facts: EndFacts) -> list[Violation]:
    out = []
    held = held_steps(data)
    for job_id, how in sorted(tracked_jobs(data).items()):
        now = data.current.get(job_id, [])
        live = [row[0] for row in now if row[0] not in TERMINAL and job_id not in held]
        if live:
            out.append(
                Violation(
                    "committed_terminal",
                    (job_id,),
                    f"{how}: not terminal {facts.terminal_bound:.0f} s after the faults stopped "
                    f"({data.snapshot(job_id)}; {data.exec_summary(job_id)})",
                )
            )
        elif job_id not in data.terminal_seen and job_id not in data.terminal_written and not now:
            # Every terminal write is recorded by a trigger (tests/chaos/ledger.sql), so a job
            # whose history was pruned before any sample is not taken for lost.
            out.append(
                Violation(
                    "committed_terminal",
                    (job_id,),
                    f"{how}: lost: never written in a terminal state and absent from awa.jobs "
                    f"({data.exec_summary(job_id)})",
                )
            )
        retried = data.last_dlq_retry.get(job_id)
        if not now and retried is not None and retried > data.last_terminal.get(job_id, retried):
            out.append(
                Violation(
                    "committed_terminal",
                    (job_id,),
                    f"{how}: lost after a DLQ retry at {retried.isoformat(timespec='milliseconds')}"
                    f": absent from awa.jobs and never terminal since ({data.snapshot(job_id)}; "
                    f"{data.exec_summary(job_id)})",
                )
            )
        finals = {(s, d, lease) for s, d, lease, _, _ in data.terminal_seen.get(job_id, [])}
        finals |= set(data.terminal_written.get(job_id, []))
        if len(finals) > 1 + data.dlq_retries[job_id]:
            out.append(
                Violation(
                    "committed_terminal",
                    (job_id,),
                    f"{how}: {len(finals)} different terminal states with "
                    f"{data.dlq_retries[job_id]} DLQ retr(y/ies) ({data.snapshot(job_id)})",
                )
            )
    for job_id, (copies, states) in sorted(data.duplicates.items()):
        out.append(
            Violation(
                "committed_terminal",
                (job_id,),
                f"shown {copies} times at once in awa.jobs ({states})",
            )
        )
    return out


def rolled_back_invisible(data: Data, facts: EndFacts) -> list[Violation]:
    out = []
    for token, job_id, path in data.rolled_back:
        where = []
        if job_id is not None and _id_reused(data, job_id, token):
            # PostgreSQL may hand out a sequence value again after a crash when the transaction
            # that drew it never committed (its WAL was not flushed): this id now names another
            # job. Only the token can tell whether the rolled-back job itself ever appeared.
            job_id = None
        if job_id is not None:
            if job_id in data.committed:
                where.append("in chaos.committed")
            if job_id in data.current:
                where.append(f"in awa.jobs ({data.snapshot(job_id)})")
            elif job_id in data.terminal_seen:
                where.append(f"seen terminal ({data.snapshot(job_id)})")
            if job_id in data.execs:
                where.append(f"ran: {data.exec_summary(job_id)}")
        ran = data.token_job(token)
        if ran is not None and ran != job_id:
            where.append(
                f"its token {token} exists as job {ran}: {data.snapshot(ran)}; "
                f"{data.exec_summary(ran)}"
            )
        if where:
            ids = tuple(i for i in (job_id, ran) if i is not None)
            out.append(
                Violation(
                    "rolled_back_invisible", ids, f"rolled back via {path}: " + "; ".join(where)
                )
            )
    return out


def _id_reused(data: Data, job_id: int, token: str) -> bool:
    """Whether ``job_id`` belongs to a job with another token (an id drawn again)."""
    owner = data.committed[job_id][0] if job_id in data.committed else None
    if owner is None:
        owner = next((e.token for e in data.execs.get(job_id, ()) if e.token), None)
    return owner is not None and owner != token


def attempt_once(data: Data, facts: EndFacts) -> list[Violation]:
    out = []
    for job_id, rows in sorted(data.execs.items()):
        by_lease = collections.Counter(e.run_lease for e in rows if e.run_lease is not None)
        twice = sorted(lease for lease, n in by_lease.items() if n > 1)
        if not data.dlq_retries[job_id]:
            by_attempt = collections.Counter(e.attempt for e in rows if e.run_lease is None)
            twice += [f"attempt {a}" for a, n in by_attempt.items() if n > 1]  # type: ignore[misc]
        if twice:
            out.append(
                Violation(
                    "attempt_once",
                    (job_id,),
                    f"run lease(s) {twice} ran more than once ({data.exec_summary(job_id)})",
                )
            )
    return out


def executions_explained(data: Data, facts: EndFacts) -> list[Violation]:
    out = []
    for job_id, rows in sorted(data.execs.items()):
        errors = data.errors(job_id)
        snoozes = sum(1 for e in rows if e.action == "snooze")
        allowed = 1 + len(errors) + snoozes + data.dlq_retries[job_id]
        if len(rows) > allowed:
            kinds = collections.Counter(str(err.get("type")) for err in errors)
            out.append(
                Violation(
                    "executions_explained",
                    (job_id,),
                    f"{len(rows)} executions but only {allowed} explained (errors {dict(kinds)}, "
                    f"{snoozes} snooze(s), {data.dlq_retries[job_id]} DLQ retr(y/ies)); "
                    f"{data.snapshot(job_id)}; {data.exec_summary(job_id)}",
                )
            )
    return out


def overlap_rescued(data: Data, facts: EndFacts) -> list[Violation]:
    out = []
    for job_id, rows in sorted(data.execs.items()):
        leased = sorted(
            (e for e in rows if e.run_lease is not None), key=lambda e: e.run_lease or 0
        )
        rescued = collections.Counter(
            err.get("attempt") for err in data.errors(job_id) if err.get("type") == RESCUED
        )
        for i, first in enumerate(leased):
            end = first.finished_at or data.deaths.get(first.pid, FAR_FUTURE)
            for later in leased[i + 1 :]:
                if later.run_lease == first.run_lease or later.started_at >= end:
                    continue
                if rescued[first.attempt]:
                    continue
                out.append(
                    Violation(
                        "overlap_rescued",
                        (job_id,),
                        f"lease {later.run_lease} started while lease {first.run_lease} was still "
                        f"running, and attempt {first.attempt} has no {RESCUED} error "
                        f"({first.describe()} / {later.describe()}; {data.snapshot(job_id)})",
                    )
                )
                break
    return out


def nothing_left_live(data: Data, facts: EndFacts) -> list[Violation]:
    # A workflow step held behind a dead-lettered dependency waits by design.
    held = held_steps(data)
    live = sorted(
        (job_id, row[0])
        for job_id, rows in data.current.items()
        for row in rows
        if row[0] not in TERMINAL and job_id not in held
    )
    if not live:
        return []
    states = collections.Counter(state for _, state in live)
    return [
        Violation(
            "nothing_left_live",
            tuple(job_id for job_id, _ in live),
            f"{len(live)} job(s) still live {facts.terminal_bound:.0f} s after the faults stopped: "
            f"{dict(states)}",
        )
    ]


def rings_shrink(data: Data, facts: EndFacts) -> list[Violation]:
    if facts.ring_final is None:
        return [Violation("rings_shrink", (), "the rings could not be read at the end")]
    if facts.ring_final <= facts.ring_threshold:
        return []
    return [
        Violation(
            "rings_shrink",
            (),
            f"claim+lease rings still hold {facts.ring_final} rows {facts.ring_bound:.0f} s after "
            f"the last pin and lock were released (peak {facts.ring_peak}, allowed "
            f"{facts.ring_threshold})",
        )
    ]


def workers_alive(data: Data, facts: EndFacts) -> list[Violation]:
    out = []
    for pid in facts.workers_dead_at_end:
        out.append(Violation("workers_alive", (), f"worker pid {pid} is dead at the end"))
    for pid in facts.workers_alive:
        if pid not in facts.workers_fresh:
            out.append(
                Violation(
                    "workers_alive",
                    (),
                    f"worker pid {pid} is half-alive: the process runs but has no fresh row in "
                    "awa.runtime_instances",
                )
            )
    for pid, cause, tail in facts.own_exits:
        out.append(
            Violation("workers_alive", (), f"worker pid {pid} {cause}; its log ends: {tail}")
        )
    for path, line in facts.log_findings:
        out.append(Violation("workers_alive", (), f"{path}: {line}"))
    for pid, code in sorted(facts.stop_codes.items()):
        if code != 0:
            what = "did not exit after SIGTERM" if code is None else f"exited {code}"
            out.append(
                Violation(
                    "workers_alive", (), f"worker pid {pid} {what} on a graceful stop at the end"
                )
            )
    return out


def rescues_explained(data: Data, facts: EndFacts) -> list[Violation]:
    out = []
    staleness = timedelta(seconds=facts.heartbeat_staleness)
    for job_id in sorted(set(data.current) | set(data.terminal_seen)):
        for err in data.errors(job_id):
            if err.get("type") != RESCUED or not str(err.get("message", "")).startswith(STALE):
                continue
            at = datetime.fromisoformat(str(err["at"]))
            runs = [
                e
                for e in data.execs.get(job_id, [])
                if e.attempt == err.get("attempt") and e.started_at <= at
            ]
            pid = runs[-1].pid if runs else None
            if runs and runs[-1].action == "snooze" and runs[-1].finished_at is not None:
                # A snooze gives its attempt back: the next claim carries the same attempt number
                # and may be the rescued one, claimed by a worker that died before its handler
                # wrote a row. Any worker's fault can explain it.
                pid = None
            start = at - staleness - CAUSE_LEAD
            if _after_outage(data, at, facts):
                # A leader elected after an outage rescues nothing stale until its hold-back
                # ends (docs/maintenance.md): the cause may be that much older.
                start -= timedelta(seconds=facts.outage_hold_back) + RESTART_TAIL
            if not _stale_cause(data, pid, start, at):
                where = runs[-1].describe() if runs else "its handler never started"
                out.append(
                    Violation(
                        "rescues_explained",
                        (job_id,),
                        f"attempt {err.get('attempt')} rescued as stale at "
                        f"{at.isoformat(timespec='milliseconds')} with no fault that could stop "
                        f"its heartbeats ({where}; {data.snapshot(job_id)})",
                    )
                )
    return out


def _after_outage(data: Data, at: datetime, facts: EndFacts) -> bool:
    """Whether ``at`` falls within a leader's hold-back after a fault that cuts the leader off
    (a server restart, terminated backends): its election comes up to ``RESTART_TAIL`` after
    the fault, the hold-back that long after."""
    hold = timedelta(seconds=facts.outage_hold_back) + RESTART_TAIL + CAUSE_LEAD
    return any(
        (f.kind.startswith("restart") or f.kind == "terminate_backends")
        and f.started_at <= at <= f.ended_at + hold
        for f in data.faults
    )


def _stale_cause(data: Data, pid: int | None, start: datetime, end: datetime) -> bool:
    """Whether a fault that can silence ``pid``'s heartbeats overlaps ``[start, end]``."""
    died = data.deaths.get(pid) if pid is not None else None
    # A process that exits (after SIGTERM, or on its own) may stop heartbeating well before the
    # supervisor sees it gone; a SIGKILL is dated exactly.
    lead = WIND_DOWN if pid in data.slow_deaths else timedelta(0)
    if died is not None and died <= end + lead:
        return True
    for f in data.faults:
        tail = (
            RESTART_TAIL
            if f.kind.startswith("restart") or f.kind == "terminate_backends"
            else timedelta(0)
        )
        if f.started_at > end or f.ended_at + tail < start:
            continue
        if f.kind.startswith("restart") or f.kind == "stall":
            return True
        if f.kind in PID_FAULTS and (pid is None or f.pid == pid):
            return True
    return pid is None and any(start <= died <= end for died in data.deaths.values())


def api_calls_work(data: Data, facts: EndFacts) -> list[Violation]:
    return [Violation("api_calls_work", (), error) for error in facts.api_errors]


CORE_CHECKS: tuple[Callable[[Data, EndFacts], list[Violation]], ...] = (
    committed_terminal,
    rolled_back_invisible,
    attempt_once,
    executions_explained,
    overlap_rescued,
    nothing_left_live,
    rings_shrink,
    workers_alive,
    rescues_explained,
    api_calls_work,
)
CHECKS = CORE_CHECKS + FLOW_CHECKS + FEATURE_CHECKS + WORKFLOW_CHECKS


def check_all(conn: psycopg.Connection[Any], facts: EndFacts) -> list[Violation]:
    """Every violation of every invariant."""
    data = load(conn)
    return [v for check in CHECKS for v in check(data, facts)]


def rescues(data: Data) -> int:
    """Rescued attempts recorded in job errors (for the summary)."""
    return sum(
        1
        for job_id in set(data.current) | set(data.terminal_seen)
        for err in data.errors(job_id)
        if err.get("type") == RESCUED
    )


def executions(data: Data) -> int:
    return sum(len(rows) for rows in data.execs.values())


def by_invariant(violations: Iterable[Violation]) -> dict[str, int]:
    return dict(collections.Counter(v.invariant for v in violations))
