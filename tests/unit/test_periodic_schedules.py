"""Periodic schedules without a database: fire times (time zones, DST, catch-up bounds),
declarations and the system checks that refuse bad ones (awa.E007, awa.E008)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from awa_django import cron, job
from awa_django.checks import check_schedules
from awa_django.periodic import check_schedule_jobs, schedule_rows

PARIS = ZoneInfo("Europe/Paris")


def periodic(**entries: Any) -> Any:
    return override_settings(AWA={**settings.AWA, "PERIODIC": entries})


def paris(fires: list[datetime]) -> list[str]:
    return [f.astimezone(PARIS).strftime("%m-%d %H:%M %Z") for f in fires]


# Fire times ---------------------------------------------------------------------------------


def test_spring_forward_a_time_that_does_not_exist_fires_once_after_the_gap() -> None:
    # 2025-03-30 02:00 CET jumps to 03:00 CEST: 02:30 does not exist that day.
    fires = cron.due_fires(
        "30 2 * * *",
        "Europe/Paris",
        datetime(2025, 3, 28, 12, tzinfo=UTC),
        datetime(2025, 4, 1, 12, tzinfo=UTC),
        100,
    )
    assert paris(fires) == [
        "03-29 02:30 CET",
        "03-30 03:00 CEST",
        "03-31 02:30 CEST",
        "04-01 02:30 CEST",
    ]


def test_fall_back_a_time_that_happens_twice_fires_once() -> None:
    # 2025-10-26 03:00 CEST falls back to 02:00 CET: 02:30 happens twice that day.
    fires = cron.due_fires(
        "30 2 * * *",
        "Europe/Paris",
        datetime(2025, 10, 24, 12, tzinfo=UTC),
        datetime(2025, 10, 28, 12, tzinfo=UTC),
        100,
    )
    assert paris(fires) == [
        "10-25 02:30 CEST",
        "10-26 02:30 CEST",
        "10-27 02:30 CET",
        "10-28 02:30 CET",
    ]
    assert [f.hour for f in fires] == [0, 0, 1, 1]  # in UTC: the offset changed, once


def test_an_hourly_schedule_keeps_real_hours_across_both_changes() -> None:
    fires = cron.due_fires(
        "0 * * * *",
        "Europe/Paris",
        datetime(2025, 10, 25, 23, 30, tzinfo=UTC),
        datetime(2025, 10, 26, 3, 30, tzinfo=UTC),
        100,
    )
    # Every real hour fires once, including both 02:00s of the fall-back night.
    assert fires == [datetime(2025, 10, 26, h, tzinfo=UTC) for h in range(4)]


def test_catch_up_keeps_the_latest_fires_oldest_first() -> None:
    after = datetime(2025, 1, 1, 10, 0, 30, tzinfo=UTC)
    now = datetime(2025, 1, 1, 10, 10, 5, tzinfo=UTC)
    latest = cron.due_fires("* * * * *", "UTC", after, now, 1)
    assert latest == [datetime(2025, 1, 1, 10, 10, tzinfo=UTC)]
    three = cron.due_fires("* * * * *", "UTC", after, now, 3)
    assert three == [datetime(2025, 1, 1, 10, m, tzinfo=UTC) for m in (8, 9, 10)]
    every = cron.due_fires("* * * * *", "UTC", after, now, 100)
    assert every == [datetime(2025, 1, 1, 10, m, tzinfo=UTC) for m in range(1, 11)]
    assert cron.due_fires("* * * * *", "UTC", now, now, 100) == []


def test_a_long_downtime_is_bounded_work_and_exact() -> None:
    now = datetime(2025, 6, 1, 12, 0, 0, 500_000, tzinfo=UTC)
    # A per-second schedule 30 days behind: 2.6 million fire times, only the latest 5 kept.
    fires = cron.due_fires("* * * * * *", "UTC", now - timedelta(days=30), now, 5)
    noon = datetime(2025, 6, 1, 12, tzinfo=UTC)
    assert fires == [noon - timedelta(seconds=4 - i) for i in range(5)]
    # In a time zone with DST in between, too.
    daily = cron.due_fires("30 2 * * *", "Europe/Paris", now - timedelta(days=3650), now, 2)
    assert paris(daily) == ["05-31 02:30 CEST", "06-01 02:30 CEST"]


def test_a_fire_time_in_the_future_or_at_the_bound_is_never_due() -> None:
    at = datetime(2025, 1, 1, 10, 0, tzinfo=UTC)
    # Strictly after fire_after: a clock stepped back never makes a fired time due again.
    assert cron.due_fires("* * * * *", "UTC", at, at + timedelta(seconds=59), 10) == []
    assert cron.due_fires("* * * * *", "UTC", at + timedelta(hours=1), at, 10) == []
    assert cron.next_fire("*/5 * * * *", "Europe/Paris", at) == at + timedelta(minutes=5)


# Declarations and checks ----------------------------------------------------------------------


def test_valid_declarations_from_settings_are_resolved_to_rows() -> None:
    with periodic(
        nightly={
            "job": "tests.jobs.common.send_email",
            "cron": "0 3 * * *",
            "timezone": "Europe/Paris",
            "args": ["ops@example.com"],
            "kwargs": {"subject": "nightly"},
            "catch_up": 5,
            "priority": 7,
        },
        hourly={"job": "tests.jobs.common.send_email", "cron": "0 * * * *", "args": ["a@b.c"]},
    ):
        rows, problems = schedule_rows()
        assert problems == []
        assert check_schedules(None) == [] and check_schedule_jobs(None) == []
    by_name = {r["name"]: r for r in rows}
    assert set(by_name) == {"nightly", "hourly"}  # several schedules per kind
    nightly = by_name["nightly"]
    assert nightly["args"] == {"args": ["ops@example.com"], "kwargs": {"subject": "nightly"}}
    # The job's own options (queue, max_attempts, tags) under the schedule's overrides.
    assert (nightly["queue"], nightly["priority"], nightly["max_attempts"]) == ("emails", 7, 3)
    assert nightly["tags"] == ["mail"] and nightly["catch_up"] == 5
    assert by_name["hourly"]["catch_up"] == 1  # "latest" by default


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"cron": "61 * * * *"}, "cron: '61 * * * *' is not valid: Bad minute"),
        ({"cron": "* * *"}, "has 3 field(s)"),
        ({"cron": "0 0 30 2 *"}, "is not valid"),
        ({"cron": 5}, "cron: must be a cron expression"),
        ({"cron": "* * * * *", "timezone": "Mars/Olympus"}, "'Mars/Olympus' is not a known IANA"),
        ({"cron": "* * * * *", "timezone": "../../etc/passwd"}, "is not a known IANA"),
        # The host's own zone is not an IANA name; what the table cannot
        # store is refused here, not by a failing sync.
        ({"cron": "* * * * *", "timezone": "localtime"}, "is not a known IANA"),
        ({"cron": " ".join([",".join(map(str, range(60)))] * 2) + " * * * *"}, "limit of 255"),
        ({"cron": "* * * * *", "catch_up": "all"}, "catch_up: must be 'latest' or an int"),
        ({"cron": "* * * * *", "catch_up": 0}, "catch_up: must be 'latest' or an int"),
        ({"cron": "* * * * *", "cron_tz": "UTC"}, "unknown key 'cron_tz'"),
        ({"cron": "* * * * *", "args": "x"}, "args: must be a list"),
        ({}, "cron: is required"),
    ],
)
def test_a_bad_schedule_is_a_system_check_error_naming_it(entry: Any, message: str) -> None:
    with periodic(
        broken={"job": "tests.jobs.common.noop", **entry},
        fine={"job": "tests.jobs.common.noop", "cron": "* * * * *"},
    ):
        errors = check_schedules(None)
        rows, _ = schedule_rows()
    assert [e.id for e in errors] == ["awa.E007"], errors
    assert "AWA['PERIODIC']['broken']" in errors[0].msg and message in errors[0].msg
    assert [r["name"] for r in rows] == ["fine"]  # the bad one is left out; the others stay


def test_an_unknown_kind_or_bad_arguments_are_awa_e008() -> None:
    with periodic(
        ghost={"job": "tests.jobs.common.nope", "cron": "* * * * *"},
        unjson={"job": "tests.jobs.common.noop", "cron": "* * * * *", "args": [{1, 2}]},
        badqueue={"job": "tests.jobs.common.noop", "cron": "* * * * *", "queue": "No Spaces"},
    ):
        errors = check_schedule_jobs(None)
    assert {e.id for e in errors} == {"awa.E008"}
    text = "\n".join(e.msg for e in errors)
    assert "'ghost'" in text and "tests.jobs.common.nope" in text
    assert "'unjson'" in text and "'badqueue'" in text


@pytest.fixture
def declared_jobs() -> Iterator[list[str]]:
    names: list[str] = []
    yield names
    from awa_django.jobs import _registry

    for name in names:
        cron.forget(name)
        _registry.pop(name, None)


def test_the_decorator_declares_a_schedule_named_after_the_kind(declared_jobs: list[str]) -> None:
    @job(name="tests.periodic.report", cron="*/5 * * * *", timezone="Europe/Paris", args=[1])
    def report(n: int) -> int:
        return n

    declared_jobs.append("tests.periodic.report")
    rows, problems = schedule_rows()
    assert problems == []
    [row] = [r for r in rows if r["name"] == "tests.periodic.report"]
    assert row["kind"] == "tests.periodic.report" and row["timezone"] == "Europe/Paris"
    assert row["args"] == {"args": [1], "kwargs": {}}
    # A settings entry may not take a decorated schedule's name.
    with periodic(
        **{"tests.periodic.report": {"job": "tests.jobs.common.noop", "cron": "* * * * *"}}
    ):
        errors = check_schedules(None)
    assert [e.id for e in errors] == ["awa.E007"] and "declared twice" in errors[0].msg


def test_a_bad_decorator_schedule_is_a_check_error_not_an_import_error(
    declared_jobs: list[str],
) -> None:
    @job(name="tests.periodic.bad", cron="every day", timezone="Nowhere/Land")
    def bad() -> None: ...

    declared_jobs.append("tests.periodic.bad")
    messages = [e.msg for e in check_schedules(None)]
    assert any("tests.periodic.bad" in m and "cron:" in m for m in messages), messages
    assert any("'Nowhere/Land' is not a known IANA" in m for m in messages), messages
    with pytest.raises(ImproperlyConfigured, match="need cron="):
        job(name="tests.periodic.nocron", args=[1])
