"""What an operator changes while the run goes on, recorded so that the checker knows what was
in force when: flow limits (``chaos.limit_changes``) and periodic schedules
(``chaos.schedule_actions``).

Each change is recorded with the database clock read just before its transaction began
(``began_at``, on the ledger's own connection) and just after it committed (``ended_at``, the
ledger row's default): the change took effect somewhere in between. A change whose commit
raised a connection error is recorded with ``certain = false``: it may or may not have taken
effect. The limits recorded are those the change returned as now in force (for a clear: the
settings), the burst as the claim applies it.
"""

from __future__ import annotations

import random
from datetime import UTC, datetime
from typing import Any

from django.db import connection, transaction

from awa_django.operator import (
    clear_kind_limits,
    clear_queue_limits,
    schedule_pause,
    schedule_trigger,
    set_kind_limits,
    set_queue_limits,
)
from tests.chaos.common import DJANGO_CONNECTION_ERRORS
from tests.chaos.db import LedgerConn
from tests.chaos.jobs import KIND_LIMIT
from tests.chaos.sabotage import broken
from tests.chaos.specs import LIMIT_QUEUE, RATE_QUEUE

__all__ = [
    "EVERY_SECOND",
    "LATEST",
    "SCHEDULES",
    "change_limits",
    "draw_change",
    "pause_schedules",
    "record_settings_limits",
    "restore_limits",
    "schedule_action",
]

EVERY_SECOND = "chaos-every-second"
LATEST = "chaos-every-2s-latest"
SCHEDULES = (EVERY_SECOND, LATEST)
LIMITED_KIND = "chaos.limited"
ACTOR = "chaos operator"
# The limits of tests/chaos/settings.py, recorded as in force from the start.
SETTINGS_LIMITS: dict[str, tuple[int | None, float | None, int | None]] = {
    f"queue:{LIMIT_QUEUE}": (4, None, None),
    f"queue:{RATE_QUEUE}": (None, 12.0, 4),
    f"kind:{LIMITED_KIND}": (KIND_LIMIT, None, None),
}

# When the settings' limits are recorded to have taken effect: before anything ran.
SINCE_START = datetime(2000, 1, 1, tzinfo=UTC)

Change = tuple[str, bool, int | None, float | None, int | None]


def draw_change(rng: random.Random) -> Change:
    """The next limit change: (scope, clear, global_concurrency, rate, burst)."""
    scope = rng.choice(sorted(SETTINGS_LIMITS))
    clear = rng.random() < 0.2
    if scope == f"queue:{RATE_QUEUE}":
        return scope, clear, None, rng.choice((8.0, 12.0, 25.0)), rng.randint(3, 8)
    if scope == f"queue:{LIMIT_QUEUE}":
        return scope, clear, rng.choice((2, 3, 4, 6, 8)), None, None
    return scope, clear, rng.choice((1, 2, 3, 5)), None, None


def change_limits(
    ledger: LedgerConn,
    scope: str,
    clear: bool,
    concurrency: int | None,
    rate: float | None,
    burst: int | None,
) -> None:
    """Set (or clear) the limits of ``scope`` and record what is in force."""
    kind, name = scope.split(":", 1)
    [(began,)] = ledger.execute("clock")
    args: dict[str, Any] = {
        "global_concurrency": concurrency,
        "rate_limit": rate,
        "rate_burst": burst,
        "actor": ACTOR,
    }
    try:
        with transaction.atomic():
            if kind == "queue":
                now = (
                    clear_queue_limits(name, actor=ACTOR)
                    if clear
                    else set_queue_limits(name, **args)
                )
            else:
                now = (
                    clear_kind_limits(name, actor=ACTOR) if clear else set_kind_limits(name, **args)
                )
    except DJANGO_CONNECTION_ERRORS:
        connection.close()
        values = SETTINGS_LIMITS[scope] if clear else (concurrency, rate, burst)
        _record(ledger, scope, values, began, False, "clear" if clear else "set")
        return
    values = (
        (None, None, None)
        if now is None
        else (now.global_concurrency, now.rate_limit, now.burst_in_force)
    )
    _record(ledger, scope, values, began, True, "clear" if clear else "set")


def _record(
    ledger: LedgerConn,
    scope: str,
    values: tuple[int | None, float | None, int | None],
    began: object,
    certain: bool,
    note: str,
) -> None:
    concurrency, rate, burst = values
    # The sabotage records stricter limits than awa_django enforces, as if it had ignored them.
    if concurrency is not None and broken("limit"):
        concurrency = max(1, concurrency - 3)
    if rate is not None and burst is not None and broken("rate"):
        rate, burst = rate / 4, max(1, burst - 2)
    row = [scope, concurrency, rate, burst, began, certain, note]
    ledger.execute("limit_change_insert", row)


def record_settings_limits(ledger: LedgerConn) -> None:
    """The limits of the settings, in force from the start (the workers write them)."""
    for scope, values in SETTINGS_LIMITS.items():
        ledger.execute("limit_change_insert", [scope, *values, SINCE_START, True, "settings"])


def schedule_action(ledger: LedgerConn, name: str, action: str) -> None:
    """Pause, resume or trigger schedule ``name`` and record it (connection errors propagate
    after an uncertain record)."""
    [(began,)] = ledger.execute("clock")
    try:
        with transaction.atomic():
            if action == "trigger":
                schedule_trigger(name)
            else:
                schedule_pause(name, action == "pause", by=ACTOR)
    except DJANGO_CONNECTION_ERRORS:
        connection.close()
        ledger.execute("schedule_action_insert", [name, action, began, False])
        raise
    ledger.execute("schedule_action_insert", [name, action, began, True])


def restore_limits(ledger: LedgerConn) -> None:
    """Once the faults stop: every limit back to the settings (recorded)."""
    for scope in SETTINGS_LIMITS:
        change_limits(ledger, scope, True, None, None, None)


def pause_schedules(ledger: LedgerConn) -> None:
    """Before the run settles: every schedule paused (recorded), so that nothing fires while
    the driver waits for every job to end."""
    for name in SCHEDULES:
        schedule_action(ledger, name, "pause")


# -- the sabotage (AWA_CHAOS_BREAK=cron) ----------------------------------------------------------


def sabotage_cron(ledger: LedgerConn, pick: float) -> bool:
    """Forge a second job for a recent fire, and pause the every-second schedule without
    recording it; True when it paused (the caller resumes it 2 s later)."""
    if not broken("cron"):
        return False
    from tests.chaos.jobs import tick_job

    rows = ledger.execute("recent_fire")
    if rows:
        name, fire = rows[0]
        metadata = {"cron_name": name, "cron_fire_time": fire.isoformat()}
        tick_job.using(metadata=metadata).enqueue(name)
    if pick < 0.5:
        return False
    schedule_pause(EVERY_SECOND, True, by="sabotage")
    return True


def sabotage_cron_resume() -> None:
    schedule_pause(EVERY_SECOND, False, by="sabotage")
