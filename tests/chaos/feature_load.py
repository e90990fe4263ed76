"""Loading the features' ledger (tests/chaos/ledger.sql) into ``model.Features``."""

from __future__ import annotations

import collections
import json
from collections.abc import Callable
from typing import Any

from tests.chaos.model import (
    Call,
    CronFire,
    Features,
    LimitChange,
    Options,
    Park,
    Schedule,
    ScheduleAction,
    Terminal,
    UniqueEnqueue,
    UniqueRollback,
)

__all__ = ["load_features"]

Rows = Callable[[str], list[tuple[Any, ...]]]


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


def load_features(rows: Rows) -> Features:
    """Every feature record of the run (``rows`` runs one query)."""
    features = Features()
    _options(rows, features)
    _flow_and_unique(rows, features)
    _terminals(rows, features)
    _schedules(rows, features)
    _callbacks(rows, features)
    _sessions(rows, features)
    return features


def _options(rows: Rows, features: Features) -> None:
    for job_id, kind, behaviour, queue, weight, serial, retry, unique in rows(
        "SELECT job_id, kind, behaviour, queue, weight, serial_key, retry, unique_key "
        "FROM chaos.committed"
    ):
        features.options[job_id] = Options(
            kind, behaviour, queue, weight, serial, _json(retry), unique
        )


def _flow_and_unique(rows: Rows, features: Features) -> None:
    features.limit_changes = [
        LimitChange(*r)
        for r in rows(
            "SELECT scope, max_running, rate, burst, began_at, ended_at, certain "
            "FROM chaos.limit_changes ORDER BY began_at, id"
        )
    ]
    features.unique_enqueues = [
        UniqueEnqueue(*r)
        for r in rows(
            "SELECT token, unique_key, kind, job_id, duplicate, enqueued_at "
            "FROM chaos.unique_enqueues ORDER BY enqueued_at"
        )
    ]
    features.unique_rollbacks = [
        UniqueRollback(*r)
        for r in rows(
            "SELECT unique_key, rolled_token, second_token, second_job_id, second_duplicate, "
            "second_error FROM chaos.unique_rollbacks ORDER BY unique_key"
        )
    ]
    features.unique_overlaps = [
        (key, list(ids), states)
        for key, ids, states in rows(
            "SELECT unique_key, job_ids, states FROM chaos.unique_overlaps ORDER BY seen_at"
        )
    ]


def _terminals(rows: Rows, features: Features) -> None:
    terminals: dict[int, list[Terminal]] = collections.defaultdict(list)
    for job_id, state, in_dlq, lease, attempt, finalized, result in rows(
        "SELECT job_id, state, in_dlq, run_lease, attempt, finalized_at, result "
        "FROM chaos.terminal_seen ORDER BY job_id, finalized_at NULLS LAST, seen_at"
    ):
        terminals[job_id].append(
            Terminal(job_id, state, in_dlq, lease, attempt, finalized, _json(result))
        )
    features.terminals = dict(terminals)
    retried: dict[int, list[Any]] = collections.defaultdict(list)
    for job_id, at in rows(
        "SELECT job_id, retried_at FROM chaos.dlq_retried WHERE certain ORDER BY retried_at"
    ):
        retried[job_id].append(at)
    features.dlq_retried_at = dict(retried)


def _schedules(rows: Rows, features: Features) -> None:
    features.cron_fires = [
        CronFire(*r)
        for r in rows(
            "SELECT job_id, name, fire_time, created_at, manual FROM chaos.cron_seen "
            "ORDER BY name, fire_time, job_id"
        )
    ]
    features.schedules = {
        r[0]: Schedule(*r)
        for r in rows("SELECT name, cron_expr, timezone, catch_up FROM awa.cron_schedules")
    }
    features.schedule_actions = [
        ScheduleAction(*r)
        for r in rows(
            "SELECT name, action, began_at, ended_at, certain FROM chaos.schedule_actions "
            "ORDER BY began_at, id"
        )
    ]
    features.leaders = [
        (at, pid) for at, pid in rows("SELECT sampled_at, pid FROM chaos.leaders ORDER BY 1")
    ]


def _callbacks(rows: Rows, features: Features) -> None:
    features.parks = [
        Park(str(r[0]), *r[1:])
        for r in rows(
            "SELECT callback_id, job_id, run_lease, attempt, mode, created_at "
            "FROM chaos.callbacks ORDER BY created_at"
        )
    ]
    features.calls = [
        Call(str(r[0]), str(r[1]), str(r[2]), *r[3:])
        for r in rows(
            "SELECT call_id, request_id, callback_id, via, body, outcome, replayed "
            "FROM chaos.callback_calls ORDER BY called_at"
        )
    ]


def _sessions(rows: Rows, features: Features) -> None:
    """When each worker session ended: between the last sample that saw it and the next."""
    losses: dict[str, list[Any]] = collections.defaultdict(list)
    for app, last_seen, gone in rows(
        "SELECT s.application_name, s.last_seen, "
        "(SELECT min(x.sampled_at) FROM chaos.session_samples x WHERE x.sampled_at > s.last_seen) "
        "FROM chaos.sessions s"
    ):
        if gone is not None:
            losses[app].append((last_seen, gone))
    features.session_losses = dict(losses)
