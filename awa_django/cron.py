"""Periodic schedules: how they are declared and validated, and when they fire. No I/O.

A schedule is a name, a job kind, a cron expression evaluated in a time zone, the job's
arguments and options, and a catch-up policy. Schedules come from two places:

* ``@job(cron="*/5 * * * *", timezone="Europe/Paris", args=[...], kwargs={...})``: one schedule
  named after the job's kind (the derived name is the kind itself, so it is stable as long as
  the kind is);
* ``AWA["PERIODIC"] = {"name": {"job": "app.jobs.kind", "cron": "...", ...}}``: any number of
  named schedules, several per kind allowed.

Expressions are 5-field cron (minute hour day month weekday) or 6-field with seconds first,
evaluated by `cronsim <https://github.com/cuu508/cronsim>`_ in the schedule's IANA time zone,
with Debian cron's rules for daylight saving time: in a 5-field expression with a fixed minute
and hour, a time that does not exist (spring forward) fires at the first minute after the gap,
and a time that happens twice (fall back) fires once, at its first occurrence. Fire times are
computed here, in Python; the database only checks and records them (``awa.cron_fire_v1``).

Nothing here raises on a bad declaration: :func:`declared` returns the problems, which
``manage.py check`` reports as ``awa.E007`` and workers log and skip.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import re
import zoneinfo
from collections import deque
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime, timedelta, tzinfo
from typing import Any, Final
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from awa_django.exceptions import JobValidationError
from awa_django.limits import check_text

__all__ = [
    "CATCH_UP_LATEST",
    "ENTRY_KEYS",
    "MAX_CATCH_UP",
    "Schedule",
    "declare",
    "declared",
    "due_fires",
    "expression_error",
    "forget",
    "next_fire",
    "timezone_error",
    "zone",
]

#: The catch-up policy that fires only the latest missed instance (``catch_up="latest"``).
CATCH_UP_LATEST: Final = "latest"

#: The most missed instances one schedule fires after downtime (``catch_up=N``).
MAX_CATCH_UP: Final = 10_000

#: The keys of one ``AWA["PERIODIC"]`` entry.
ENTRY_KEYS: Final = (
    "job",
    "cron",
    "timezone",
    "args",
    "kwargs",
    "catch_up",
    "queue",
    "priority",
    "max_attempts",
    "deadline",
    "tags",
    "metadata",
)

#: Options of an ``AWA["PERIODIC"]`` entry that override the job's own (``Job.using``).
OPTION_KEYS: Final = ("queue", "priority", "max_attempts", "deadline", "tags", "metadata")

#: Fire times scanned forward before the scan restarts just below now (a per-second schedule
#: after a month of downtime would otherwise mean millions of steps).
_SCAN: Final = 2_000

_NAME_MAX: Final = 200

#: A schedule name: 1-200 characters, no comma (the admin carries selections as comma-separated
#: names) and no control character.
_NAME_RE: Final = re.compile(r"[^,\x00-\x1f\x7f-\x9f]{1,200}")

#: The longest expression and time zone name (what awa.cron_schedules stores).
_TEXT_MAX: Final = 255


@dataclasses.dataclass(frozen=True, slots=True)
class Schedule:
    """One declared schedule, as written in code (not yet validated: see :func:`declared`).

    ``catch_up`` is ``"latest"`` (after downtime, fire only the latest missed instance) or an
    int N (fire each missed instance, oldest first, at most the N latest). ``options`` override
    the job's own options (queue, priority, max_attempts, deadline, tags, metadata).
    """

    # The fields below are as written in code (Any): declared() returns only schedules whose
    # cron and timezone are str, args a list or tuple, kwargs a mapping, catch_up valid.
    name: str
    kind: str
    cron: Any
    timezone: Any = "UTC"
    args: Any = ()
    kwargs: Any = dataclasses.field(default_factory=dict)
    catch_up: Any = CATCH_UP_LATEST
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def catch_up_limit(self) -> int:
        """How many missed instances fire at most (1 for ``"latest"``)."""
        return 1 if self.catch_up == CATCH_UP_LATEST else int(self.catch_up)


#: Schedules declared by ``@job(cron=...)``, by name (the job's kind).
_declared: dict[str, Schedule] = {}


def declare(schedule: Schedule) -> None:
    """Record a schedule declared by ``@job(cron=...)`` (replacing one of the same name)."""
    _declared[schedule.name] = schedule


def forget(name: str) -> None:
    """Drop a schedule declared by ``@job(cron=...)`` (for tests)."""
    _declared.pop(name, None)


def zone(name: str) -> tzinfo:
    """The time zone called ``name`` (``UTC`` is Python's own)."""
    return UTC if name == "UTC" else ZoneInfo(name)


def timezone_error(name: object) -> str | None:
    """Why ``name`` is not an IANA time zone, or None."""
    if not isinstance(name, str) or not name or len(name) > _TEXT_MAX:
        return f"timezone: must be an IANA time zone name such as 'Europe/Paris', got {name!r}"
    try:
        zone(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        return f"timezone: {name!r} is not a known IANA time zone (such as 'Europe/Paris')"
    if name != "UTC" and (name not in _iana_names() or name in _HOST_ZONES):
        # ZoneInfo also loads files that are not IANA names ('localtime': each host's own).
        return f"timezone: {name!r} is not a known IANA time zone (such as 'Europe/Paris')"
    return None


#: Files of the zone database that are not IANA zones: each host's own zone, POSIX rules.
_HOST_ZONES: Final = frozenset({"localtime", "posixrules", "Factory"})


@functools.cache
def _iana_names() -> frozenset[str]:
    return frozenset(zoneinfo.available_timezones())


def expression_error(expression: object) -> str | None:
    """Why ``expression`` is not a cron expression cronsim accepts, or None."""
    if not isinstance(expression, str) or not expression.strip():
        return f"cron: must be a cron expression such as '*/5 * * * *', got {expression!r}"
    if len(expression) > _TEXT_MAX:
        return f"cron: {len(expression)} characters exceeds the limit of {_TEXT_MAX}"
    fields = len(expression.split())
    if fields not in (5, 6):
        return (
            f"cron: {expression!r} has {fields} field(s); give 5 (minute hour day month "
            "weekday) or 6 (seconds first)"
        )
    try:
        next(CronSim(expression, datetime(2000, 1, 1, tzinfo=UTC)))
    except CronSimError as exc:
        return f"cron: {expression!r} is not valid: {exc}"
    except StopIteration:
        return f"cron: {expression!r} never fires"
    return None


def _catch_up_error(value: object) -> str | None:
    if value == CATCH_UP_LATEST and isinstance(value, str):
        return None
    if type(value) is int and 1 <= value <= MAX_CATCH_UP:
        return None
    return f"catch_up: must be 'latest' or an int from 1 to {MAX_CATCH_UP}, got {value!r}"


def _errors(schedule: Schedule) -> list[str]:
    """What is wrong with one schedule (its expression, zone, policy, name), or nothing."""
    errors = [
        error
        for error in (
            expression_error(schedule.cron),
            timezone_error(schedule.timezone),
            _catch_up_error(schedule.catch_up),
        )
        if error is not None
    ]
    try:
        check_text("name", schedule.name, max_length=_NAME_MAX)
        if _NAME_RE.fullmatch(schedule.name) is None:
            errors.append(
                f"name: {schedule.name!r} must be 1-200 characters, without commas or control "
                "characters (C0 or C1)"
            )
    except JobValidationError as exc:
        errors.append(str(exc))
    if not isinstance(schedule.args, list | tuple):
        errors.append(f"args: must be a list, got {type(schedule.args).__name__}")
    if not isinstance(schedule.kwargs, Mapping):
        errors.append(f"kwargs: must be a dict, got {type(schedule.kwargs).__name__}")
    return errors


def _from_entry(name: object, entry: object) -> tuple[Schedule | None, list[str]]:
    """One ``AWA["PERIODIC"]`` entry as a Schedule, or the problems that prevent it."""
    if not isinstance(name, str):
        return None, [f"names must be str, got {name!r}"]
    if not isinstance(entry, Mapping):
        return None, [f"must be a dict, got {type(entry).__name__}"]
    errors = []
    for key in entry:
        if key not in ENTRY_KEYS:
            close = difflib.get_close_matches(str(key), ENTRY_KEYS, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            errors.append(f"unknown key {key!r}.{hint} Known keys: {', '.join(ENTRY_KEYS)}")
    kind = entry.get("job")
    if not isinstance(kind, str) or not kind:
        errors.append(f"job: must be the kind of a registered job (a str), got {kind!r}")
    if "cron" not in entry:
        errors.append("cron: is required")
    if errors:
        return None, errors
    schedule = Schedule(
        name=name,
        kind=str(kind),
        cron=entry["cron"],
        timezone=entry.get("timezone", "UTC"),
        args=entry.get("args", ()),
        kwargs=entry.get("kwargs", {}),
        catch_up=entry.get("catch_up", CATCH_UP_LATEST),
        options={k: entry[k] for k in OPTION_KEYS if k in entry},
    )
    return schedule, []


def declared(periodic: Mapping[Any, Any]) -> tuple[list[Schedule], list[str]]:
    """Every declared schedule that is valid, by name, and the problems of the others.

    ``periodic`` is ``AWA["PERIODIC"]``; the ``@job(cron=...)`` schedules are added. A name
    used twice (two entries can't share one, but an entry can take a decorated kind's derived
    name) is a problem, and neither schedule is returned. Each problem names its schedule.
    """
    problems: list[str] = []
    candidates: list[tuple[str, Schedule]] = []
    for name, schedule in sorted(_declared.items()):
        candidates.append((f"@job(cron=...) of {name!r}", schedule))
    for name, entry in periodic.items():
        where = f"AWA['PERIODIC'][{name!r}]"
        parsed, errors = _from_entry(name, entry)
        problems.extend(f"{where}: {error}" for error in errors)
        if parsed is not None:
            candidates.append((where, parsed))
    by_name: dict[str, list[str]] = {}
    for where, schedule in candidates:
        by_name.setdefault(schedule.name, []).append(where)
    valid = []
    for where, schedule in candidates:
        places = by_name[schedule.name]
        if len(places) > 1:
            if where == places[0]:
                problems.append(
                    f"schedule {schedule.name!r} is declared twice: {' and '.join(places)}"
                )
            continue
        errors = _errors(schedule)
        problems.extend(f"{where}: {error}" for error in errors)
        if not errors:
            valid.append(schedule)
    return sorted(valid, key=lambda s: s.name), problems


def _fires(expression: str, timezone: str, after: datetime) -> Iterator[datetime]:
    """The fire times strictly after ``after``, as aware UTC datetimes, in order."""
    for fire in CronSim(expression, after.astimezone(zone(timezone))):
        yield fire.astimezone(UTC)


def due_fires(
    expression: str, timezone: str, after: datetime, now: datetime, limit: int
) -> list[datetime]:
    """The fire times in ``(after, now]``, oldest first, at most the ``limit`` latest.

    ``after`` is the schedule's ``fire_after`` and ``now`` the database clock's time; both
    aware. Cheap after any downtime: at most a few thousand steps forward, then a restart from
    just below ``now``.
    """
    kept: deque[datetime] = deque(maxlen=limit)
    for steps, fire in enumerate(_fires(expression, timezone, after), start=1):
        if fire > now:
            return list(kept)
        kept.append(fire)
        if steps >= _SCAN + limit:
            break
    else:
        return list(kept)
    # Far behind: find the limit-th latest fire time at or before now going backwards, then
    # walk forward from just before it (so DST handling is the forward walk's, as above).
    start = after
    top = now.replace(microsecond=0) + timedelta(seconds=1)  # reversing yields times below it
    reverse = CronSim(expression, top.astimezone(zone(timezone)), reverse=True)
    earliest = None
    for _ in range(limit):
        try:
            earliest = next(reverse).astimezone(UTC)
        except StopIteration:
            break
    if earliest is not None:
        start = max(after, earliest - timedelta(seconds=2))
    kept.clear()
    for fire in _fires(expression, timezone, start):
        if fire > now:
            break
        kept.append(fire)
    return list(kept)


def next_fire(expression: str, timezone: str, after: datetime) -> datetime | None:
    """The first fire time strictly after ``after`` (aware, UTC), or None if there is none."""
    return next(_fires(expression, timezone, after), None)
