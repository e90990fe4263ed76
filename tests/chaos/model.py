"""The chaos checker's model: what a run recorded, loaded once (tests/chaos/check.py ``load``),
and what the driver saw at the end. Pure data: the invariants are functions of ``(Data,
EndFacts)`` in check.py, check_flow.py and check_features.py.
"""

from __future__ import annotations

import collections
import dataclasses
from datetime import datetime, timedelta
from typing import Any

__all__ = [
    "Call",
    "CronFire",
    "Data",
    "EndFacts",
    "Exec",
    "Fault",
    "Features",
    "LimitChange",
    "Options",
    "Park",
    "Schedule",
    "ScheduleAction",
    "Terminal",
    "UniqueEnqueue",
    "UniqueRollback",
    "Violation",
]

TERMINAL = ("completed", "failed", "cancelled")
RESCUED = "awa_django.Rescued"
STALE = "heartbeat stale"
FAR_FUTURE = datetime.max.replace(tzinfo=datetime.now().astimezone().tzinfo)
# How long after a server restart ends a worker may still be reconnecting (its backoff grows
# 50 ms -> 5 s), and how long before a rescue its cause may have started.
RESTART_TAIL = timedelta(seconds=8)
CAUSE_LEAD = timedelta(seconds=3)
WIND_DOWN = timedelta(seconds=10)
PID_FAULTS = ("stop_worker", "stop_leader", "kill_worker", "term_worker", "terminate_backends")


@dataclasses.dataclass(frozen=True)
class Violation:
    """One broken invariant, with the jobs concerned and what shows it."""

    invariant: str
    job_ids: tuple[int, ...]
    evidence: str

    def __str__(self) -> str:
        ids = ", ".join(map(str, self.job_ids[:10])) + (" ..." if len(self.job_ids) > 10 else "")
        return f"[{self.invariant}] jobs {ids or '-'}: {self.evidence}"


@dataclasses.dataclass(frozen=True)
class Exec:
    """One row of chaos.exec."""

    job_id: int
    run_lease: int | None
    attempt: int
    pid: int
    behaviour: str
    token: str | None
    action: str | None
    started_at: datetime
    finished_at: datetime | None
    # Copied from awa's tables by the handler's start row (NULL when not found).
    claimed_at: datetime | None = None
    run_at: datetime | None = None
    queue: str | None = None
    kind: str | None = None
    last_error: dict[str, Any] | None = None
    prev_outcome: str | None = None
    weight: int | None = None
    serial_key: str | None = None
    worker_id: str | None = None

    def describe(self) -> str:
        end = self.finished_at.isoformat(timespec="milliseconds") if self.finished_at else "-"
        return (
            f"lease {self.run_lease} attempt {self.attempt} pid {self.pid} {self.behaviour} "
            f"{self.action or 'unfinished'} {self.started_at.isoformat(timespec='milliseconds')}"
            f"..{end}"
        )


@dataclasses.dataclass(frozen=True)
class Fault:
    kind: str
    pid: int | None
    detail: str
    started_at: datetime
    ended_at: datetime


@dataclasses.dataclass
class EndFacts:
    """What the driver saw at the end of the run (processes, logs, rings, bounds)."""

    heartbeat_staleness: float
    terminal_bound: float
    #: How long a leader elected after an outage holds back its rescues (docs/maintenance.md).
    outage_hold_back: float = 0.0
    terminal_wait_timed_out: bool = False
    workers_alive: list[int] = dataclasses.field(default_factory=list)
    workers_dead_at_end: list[int] = dataclasses.field(default_factory=list)
    workers_fresh: set[int] = dataclasses.field(default_factory=set)
    own_exits: list[tuple[int, str, str]] = dataclasses.field(default_factory=list)
    log_findings: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    stop_codes: dict[int, int | None] = dataclasses.field(default_factory=dict)
    ring_peak: int = 0
    ring_final: int | None = None
    ring_threshold: int = 0
    ring_bound: float = 0.0
    api_errors: list[str] = dataclasses.field(default_factory=list)
    retry_backoff_base: float = 0.01
    retry_after_seconds: float = 0.05
    cron_eval_interval: float = 0.2


@dataclasses.dataclass
class WorkflowRecords:
    """What awa holds of the run's workflows at the end (their records outlive the run:
    ``WORKFLOW_RETENTION`` is a day)."""

    #: step job id -> (workflow id, on_failure)
    steps: dict[int, tuple[int, str]] = dataclasses.field(default_factory=dict)
    #: downstream job id -> its dependencies' job ids
    upstream: dict[int, list[int]] = dataclasses.field(default_factory=dict)
    waiting: set[int] = dataclasses.field(default_factory=set)
    in_dlq: set[int] = dataclasses.field(default_factory=set)
    #: workflow id -> (steps, completed, failed, cancelled, skipped, finished)
    flows: dict[int, tuple[int, int, int, int, int, bool]] = dataclasses.field(default_factory=dict)
    #: step job id -> its latest history row's (state, last error type)
    history: dict[int, tuple[str, str | None]] = dataclasses.field(default_factory=dict)
    #: steps with more than one first emission in the ready ring
    released_twice: list[int] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Data:
    """Everything the checks read, loaded once."""

    committed: dict[int, tuple[str, str, str, str]]
    rolled_back: list[tuple[str, int | None, str]]
    indeterminate: list[tuple[str, int | None, str]]
    execs: dict[int, list[Exec]]
    exec_tokens: dict[str, int]
    job_tokens: dict[str, int]
    terminal_seen: dict[int, list[tuple[str, bool, int, int, list[dict[str, Any]]]]]
    current: dict[int, list[tuple[str, bool, int, int, list[dict[str, Any]]]]]
    duplicates: dict[int, tuple[int, str]]
    dlq_retries: collections.Counter[int]
    last_dlq_retry: dict[int, datetime]
    last_terminal: dict[int, datetime]
    deaths: dict[int, datetime]
    slow_deaths: set[int]
    faults: list[Fault]
    features: Features = dataclasses.field(default_factory=lambda: Features())
    #: Every terminal write (state, in_dlq, run_lease), recorded by triggers: exact, where
    #: ``terminal_seen`` is sampled.
    terminal_written: dict[int, list[tuple[str, bool, int]]] = dataclasses.field(
        default_factory=dict
    )
    #: When each of those writes committed's transaction wrote it (the database clock).
    terminal_written_at: dict[int, list[datetime]] = dataclasses.field(default_factory=dict)
    #: The run's workflows and batches as awa holds them at the end.
    workflows: WorkflowRecords = dataclasses.field(default_factory=lambda: WorkflowRecords())

    def token_job(self, token: str) -> int | None:
        """The job carrying a producer's token (its first argument), if one was ever seen."""
        return self.exec_tokens.get(token, self.job_tokens.get(token))

    def errors(self, job_id: int) -> list[dict[str, Any]]:
        """The longest error list seen for a job (errors only grow, DLQ retries keep them)."""
        lists = [row[4] for row in self.terminal_seen.get(job_id, [])]
        lists += [row[4] for row in self.current.get(job_id, [])]
        return max(lists, key=len, default=[])

    def snapshot(self, job_id: int) -> str:
        now = (
            ", ".join(
                f"{s}{'(dlq)' if d else ''}@lease{lease}"
                for s, d, lease, _, _ in self.current.get(job_id, [])
            )
            or "absent"
        )
        seen = (
            ", ".join(
                f"{s}{'(dlq)' if d else ''}@lease{lease}"
                for s, d, lease, _, _ in self.terminal_seen.get(job_id, [])
            )
            or "never"
        )
        return f"awa.jobs now: {now}; terminal seen: {seen}"

    def exec_summary(self, job_id: int, limit: int = 6) -> str:
        rows = self.execs.get(job_id, [])
        text = "; ".join(e.describe() for e in rows[:limit])
        return f"{len(rows)} execution(s)" + (f": {text}" if text else "")


# -- the features' records ------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Options:
    """What a producer asked for a committed job (None: the kind's default)."""

    kind: str
    behaviour: str
    queue: str | None = None
    weight: int | None = None
    serial_key: str | None = None
    retry: dict[str, Any] | None = None
    unique_key: str | None = None


@dataclasses.dataclass(frozen=True)
class LimitChange:
    """A change of the flow limits of ``scope`` (``queue:NAME``, ``kind:NAME``), in force from
    somewhere in ``[began, ended]`` (``certain`` False: perhaps never)."""

    scope: str
    max_running: int | None
    rate: float | None
    burst: int | None
    began: datetime
    ended: datetime
    certain: bool = True


@dataclasses.dataclass(frozen=True)
class UniqueEnqueue:
    """One unique enqueue's answer; ``at`` is a database time after the key was taken."""

    token: str
    key: str
    kind: str
    job_id: int
    duplicate: bool
    at: datetime


@dataclasses.dataclass(frozen=True)
class UniqueRollback:
    """A holder rolled back while another producer waited for its key: what that one got."""

    key: str
    rolled_token: str
    second_token: str
    second_job_id: int | None
    second_duplicate: bool | None
    second_error: str | None


@dataclasses.dataclass(frozen=True)
class Terminal:
    """A terminal fact the observer saw (DLQ entries have their dlq_at as finalized_at)."""

    job_id: int
    state: str
    in_dlq: bool
    run_lease: int
    attempt: int
    finalized_at: datetime | None
    result: Any = None


@dataclasses.dataclass(frozen=True)
class CronFire:
    """A job a schedule fired (``manual``: triggered by an operator, not a fire)."""

    job_id: int
    name: str
    fire_time: datetime
    created_at: datetime
    manual: bool = False


@dataclasses.dataclass(frozen=True)
class Schedule:
    name: str
    cron: str
    timezone: str
    catch_up: int


@dataclasses.dataclass(frozen=True)
class ScheduleAction:
    """An operator's pause, resume or trigger of a schedule, done within ``[began, ended]``."""

    name: str
    action: str
    began: datetime
    ended: datetime
    certain: bool = True


@dataclasses.dataclass(frozen=True)
class Park:
    """A callback an attempt registered (and meant to park on), and how it is resolved."""

    callback_id: str
    job_id: int
    run_lease: int
    attempt: int
    mode: str
    created_at: datetime


@dataclasses.dataclass(frozen=True)
class Call:
    """One resolution call (or HTTP delivery) of a callback and what it answered."""

    call_id: str
    request_id: str
    callback_id: str
    via: str
    body: str
    outcome: str
    replayed: bool = False


@dataclasses.dataclass
class Features:
    """The ledger of the features: options asked for, limits and schedules changed, unique
    answers, fires, callback resolutions, and terminal facts with their times and results."""

    options: dict[int, Options] = dataclasses.field(default_factory=dict)
    limit_changes: list[LimitChange] = dataclasses.field(default_factory=list)
    unique_enqueues: list[UniqueEnqueue] = dataclasses.field(default_factory=list)
    unique_rollbacks: list[UniqueRollback] = dataclasses.field(default_factory=list)
    unique_overlaps: list[tuple[str, list[int], str]] = dataclasses.field(default_factory=list)
    terminals: dict[int, list[Terminal]] = dataclasses.field(default_factory=dict)
    dlq_retried_at: dict[int, list[datetime]] = dataclasses.field(default_factory=dict)
    cron_fires: list[CronFire] = dataclasses.field(default_factory=list)
    schedules: dict[str, Schedule] = dataclasses.field(default_factory=dict)
    schedule_actions: list[ScheduleAction] = dataclasses.field(default_factory=list)
    leaders: list[tuple[datetime, int | None]] = dataclasses.field(default_factory=list)
    parks: list[Park] = dataclasses.field(default_factory=list)
    calls: list[Call] = dataclasses.field(default_factory=list)
    # Per worker connection name (awa:worker:<instance id>): when one of its database sessions
    # ended, as (last seen, first sample without it).
    session_losses: dict[str, list[tuple[datetime, datetime]]] = dataclasses.field(
        default_factory=dict
    )
