"""Periodic jobs on a real database, in process: sync, the exactly-once compare-and-set of
awa.cron_fire_v1, catch-up, DST end to end, broken schedules, and the operator's pause, resume
and trigger through the API, ``manage.py awa_cron`` and the admin."""

from __future__ import annotations

import asyncio
import logging
import threading
from datetime import UTC, datetime, timedelta
from io import StringIO
from typing import Any
from zoneinfo import ZoneInfo

import psycopg
import pytest
from django.conf import settings
from django.contrib.admin.models import LogEntry
from django.core.management import CommandError, call_command
from django.test import override_settings

from awa_django.maintenance.cron import CronFirer, sync_schedules
from awa_django.operator import schedule_pause, schedule_trigger, schedules
from tests.support.admin_client import buttons, changelist, confirmed, messages_of, post_action
from tests.support.database import conninfo, pg
from tests.support.factories import staff
from tests.support.polling import wait_for

pytestmark = [pytest.mark.usefixtures("clean_awa"), pytest.mark.storage]

EVERY_MINUTE = {"job": "tests.jobs.common.noop", "cron": "* * * * *", "queue": "cron"}


def periodic(**entries: Any) -> Any:
    return override_settings(AWA={**settings.AWA, "PERIODIC": entries})


def run(fn: Any) -> Any:
    async def go() -> Any:
        async with await psycopg.AsyncConnection.connect(conninfo(), autocommit=True) as conn:
            return await fn(conn)

    return asyncio.run(go())


def sync() -> None:
    run(sync_schedules)


def evaluate(firer: CronFirer | None = None) -> int:
    return int(run((firer or CronFirer()).evaluate))


def rows(sql: str, *params: Any) -> list[tuple[Any, ...]]:
    with pg() as conn:
        return conn.execute(sql, list(params)).fetchall()


def fired(name: str) -> list[str]:
    """The cron_fire_time of every job the schedule enqueued, oldest job first."""
    return [
        r[0]
        for r in rows(
            "SELECT metadata->>'cron_fire_time' FROM awa.jobs WHERE metadata->>'cron_name' = %s "
            "ORDER BY id",
            name,
        )
    ]


def set_fire_after(name: str, at: datetime) -> None:
    with pg() as conn:
        conn.execute("UPDATE awa.cron_schedules SET fire_after = %s WHERE name = %s", [at, name])


def db_now() -> datetime:
    value = rows("SELECT now()")[0][0]
    assert isinstance(value, datetime)
    return value


def early_in_a_minute() -> datetime:
    """The database's now, once it is 2 to 40 s into a minute: a test that counts the fires due
    "now" must not see the minute turn under it (a loaded machine takes seconds)."""

    def early() -> datetime | None:
        now = db_now()
        return now if 2 <= now.second < 40 else None

    return wait_for(
        early, timeout=30, interval=0.5, message="the start of a minute on the database clock"
    )


def z(at: datetime) -> str:
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# Sync ---------------------------------------------------------------------------------------


def test_sync_creates_updates_removes_and_leaves_unchanged_rows_alone() -> None:
    with periodic(a=EVERY_MINUTE, b={**EVERY_MINUTE, "cron": "0 * * * *"}):
        sync()
    before = rows("SELECT name, xmin::text, fire_after FROM awa.cron_schedules ORDER BY name")
    assert [r[0] for r in before] == ["a", "b"]
    # The same declarations again write nothing (no dead tuple per process start).
    with periodic(a=EVERY_MINUTE, b={**EVERY_MINUTE, "cron": "0 * * * *"}):
        sync()
    assert rows("SELECT name, xmin::text, fire_after FROM awa.cron_schedules ORDER BY name") == (
        before
    )
    set_fire_after("a", datetime(2020, 1, 1, tzinfo=UTC))
    # b is removed from code; a's priority changes (its place is kept), not its expression.
    with periodic(a={**EVERY_MINUTE, "priority": 3}):
        sync()
    assert rows("SELECT name, priority, fire_after FROM awa.cron_schedules") == [
        ("a", 3, datetime(2020, 1, 1, tzinfo=UTC))
    ]
    # A new expression starts again from now: no fires computed across two definitions.
    with periodic(a={**EVERY_MINUTE, "priority": 3, "cron": "*/2 * * * *"}):
        sync()
    [(after,)] = rows("SELECT fire_after FROM awa.cron_schedules")
    assert after > datetime(2020, 1, 2, tzinfo=UTC)


def test_a_removed_schedule_stops_firing_and_the_others_go_on() -> None:
    with periodic(keep=EVERY_MINUTE, drop=EVERY_MINUTE):
        sync()
    start = db_now() - timedelta(minutes=3)
    set_fire_after("keep", start)
    set_fire_after("drop", start)
    with periodic(keep=EVERY_MINUTE):
        sync()
    assert evaluate() == 1
    assert len(fired("keep")) == 1 and fired("drop") == []


# Firing: exactly once -------------------------------------------------------------------------


def test_catch_up_latest_fires_only_the_latest_missed_instance() -> None:
    with periodic(tick=EVERY_MINUTE):
        sync()
    now = early_in_a_minute()
    set_fire_after("tick", now - timedelta(minutes=10))
    assert evaluate() == 1
    latest = now.replace(second=0, microsecond=0)
    assert fired("tick") == [z(latest)]
    assert rows("SELECT fire_after, last_fire_at FROM awa.cron_schedules") == [(latest, latest)]
    assert evaluate() == 0  # nothing more is due until the next minute


def test_catch_up_n_fires_each_missed_instance_up_to_the_bound_oldest_first() -> None:
    with periodic(few={**EVERY_MINUTE, "catch_up": 3}, all={**EVERY_MINUTE, "catch_up": 100}):
        sync()
    now = early_in_a_minute()
    set_fire_after("few", now - timedelta(minutes=10, seconds=1))
    set_fire_after("all", now - timedelta(minutes=10, seconds=1))
    assert evaluate() == 13
    minute = now.replace(second=0, microsecond=0)
    assert fired("few") == [z(minute - timedelta(minutes=m)) for m in (2, 1, 0)]
    assert fired("all") == [z(minute - timedelta(minutes=m)) for m in range(9, -1, -1)]
    assert evaluate() == 0


def test_dst_end_to_end_daily_0230_in_paris_over_both_changes() -> None:
    spring = {"job": "tests.jobs.common.noop", "cron": "30 2 * 3 *", "timezone": "Europe/Paris"}
    autumn = {**spring, "cron": "30 2 * 10 *"}
    with periodic(spring={**spring, "catch_up": 10000}, autumn={**autumn, "catch_up": 10000}):
        sync()
    set_fire_after("spring", datetime(2025, 3, 28, 12, tzinfo=UTC))
    set_fire_after("autumn", datetime(2025, 10, 24, 12, tzinfo=UTC))
    evaluate()
    paris = ZoneInfo("Europe/Paris")

    def local(name: str, first: int) -> list[str]:
        times = [datetime.fromisoformat(t).astimezone(paris) for t in fired(name)[:first]]
        return [t.strftime("%m-%d %H:%M %Z") for t in times]

    # March 30 has no 02:30: it fires once, at 03:00 CEST.
    assert local("spring", 3) == ["03-29 02:30 CET", "03-30 03:00 CEST", "03-31 02:30 CEST"]
    # October 26 has two: it fires once, at the first.
    assert local("autumn", 4) == [
        "10-25 02:30 CEST",
        "10-26 02:30 CEST",
        "10-27 02:30 CET",
        "10-28 02:30 CET",
    ]
    for name in ("spring", "autumn"):
        times = fired(name)
        assert len(times) == len(set(times))  # never twice


def cas(conn: psycopg.Connection[Any], after: datetime, at: datetime) -> Any:
    row = conn.execute("SELECT awa.cron_fire_v1('tick', %s, %s)", [after, at]).fetchone()
    return None if row is None else row[0]


def test_the_compare_and_set_refuses_stale_repeated_future_and_paused_fires() -> None:
    with periodic(tick=EVERY_MINUTE):
        sync()
    now = db_now()
    after = now - timedelta(minutes=5)
    set_fire_after("tick", after)
    fire = now.replace(second=0, microsecond=0) - timedelta(minutes=2)
    with pg() as conn:
        assert cas(conn, after, now + timedelta(minutes=1)) is None  # not due on the db clock
        assert cas(conn, after, after) is None  # not above fire_after
        job = cas(conn, after, fire)
        assert job is not None
        assert cas(conn, after, fire) is None  # the same fire again: stale expectation
        assert cas(conn, fire, fire) is None  # a clock stepped back: never a fired time again
        assert cas(conn, fire, fire - timedelta(minutes=1)) is None
        conn.execute("SELECT awa.cron_pause_v1('tick', true)")
        assert cas(conn, fire, fire + timedelta(minutes=1)) is None  # paused
    assert fired("tick") == [z(fire)]


def test_two_racing_fires_of_one_time_enqueue_one_job() -> None:
    with periodic(tick=EVERY_MINUTE):
        sync()
    now = db_now()
    after = now - timedelta(minutes=5)
    set_fire_after("tick", after)
    fire = now.replace(second=0, microsecond=0)
    results: list[Any] = []
    with pg(autocommit=False) as first, pg() as probe:
        assert cas(first, after, fire) is not None  # holds the row, not committed yet
        # The second skips the held row (SKIP LOCKED): nothing fired, nobody waits.
        second = threading.Thread(target=lambda: results.append(cas_in_own(after, fire)))
        second.start()
        second.join(20)
        assert results == [None]
        first.commit()
    assert cas_in_own(after, fire) is None  # and after the commit, fire_after has moved
    assert fired("tick") == [z(fire)]
    _ = probe


def cas_in_own(after: datetime, at: datetime) -> Any:
    with pg() as conn:
        return cas(conn, after, at)


def test_a_fire_needs_read_committed() -> None:
    with periodic(tick=EVERY_MINUTE):
        sync()
    with (
        pg(autocommit=False) as conn,
        pytest.raises(psycopg.errors.InvalidTransactionState, match="READ COMMITTED"),
    ):
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        cas(conn, db_now() - timedelta(hours=1), db_now() - timedelta(minutes=1))


def test_one_broken_schedule_is_logged_and_the_others_fire(caplog: Any) -> None:
    with periodic(good=EVERY_MINUTE, expr=EVERY_MINUTE, zone=EVERY_MINUTE, refused=EVERY_MINUTE):
        sync()
    start = db_now() - timedelta(minutes=2)
    with pg() as conn:
        conn.execute("UPDATE awa.cron_schedules SET fire_after = %s", [start])
        # What only a raw SQL edit or another version could store: the leader must not care.
        conn.execute("UPDATE awa.cron_schedules SET cron_expr = 'often' WHERE name = 'expr'")
        conn.execute("UPDATE awa.cron_schedules SET timezone = 'Nowhere/X' WHERE name = 'zone'")
        conn.execute("UPDATE awa.cron_schedules SET args = '[]' WHERE name = 'refused'")
    firer = CronFirer()
    with caplog.at_level(logging.ERROR, logger="awa_django.maintenance"):
        assert evaluate(firer) == 1
        set_fire_after("good", start)  # rewound by hand: the same fire time is due again
        assert evaluate(firer) == 1  # the same problems are not logged again at once
    # ... and its unique key (schedule, fire time) refuses a second job for it.
    assert len(fired("good")) == 1
    assert fired("expr") == fired("zone") == fired("refused") == []
    problems = [r.getMessage() for r in caplog.records]
    assert len(problems) == 3, problems
    assert any("'expr' cannot compute its fire times" in p for p in problems)
    assert any("'zone' cannot compute" in p for p in problems)
    assert any("'refused' could not fire" in p and "args:" in p for p in problems)


# Operators --------------------------------------------------------------------------------------


def test_pause_skips_fires_and_resume_starts_from_now() -> None:
    with periodic(tick=EVERY_MINUTE):
        sync()
    set_fire_after("tick", db_now() - timedelta(minutes=5))
    assert schedule_pause("tick", True, by="ops")
    assert evaluate() == 0
    [status] = schedules()
    assert (status.enabled, status.paused_by, status.next_fire_at) == (False, "ops", None)
    assert schedule_pause("tick", False)
    assert evaluate() == 0  # the minutes missed while paused are skipped
    [status] = schedules()
    assert status.enabled and status.next_fire_at is not None
    assert status.next_fire_at > db_now() - timedelta(seconds=1)
    assert not schedule_pause("nope", True)


def test_trigger_enqueues_now_even_when_paused_without_moving_fire_times() -> None:
    with periodic(tick=EVERY_MINUTE):
        sync()
    schedule_pause("tick", True)
    [(after,)] = rows("SELECT fire_after FROM awa.cron_schedules")
    job = schedule_trigger("tick")
    assert job is not None and schedule_trigger("nope") is None
    [(metadata, state)] = rows("SELECT metadata, state FROM awa.jobs WHERE id = %s", job)
    assert metadata["cron_name"] == "tick" and metadata["cron_trigger"] == "manual"
    assert state == "available"
    assert rows("SELECT fire_after, last_fire_at FROM awa.cron_schedules") == [(after, None)]
    [status] = schedules()
    assert (status.last_job_id, str(status.last_job_state)) == (job, "available")


def test_the_awa_cron_command_lists_pauses_resumes_and_triggers() -> None:
    with periodic(tick=EVERY_MINUTE, other={**EVERY_MINUTE, "timezone": "Europe/Paris"}):
        sync()
    out = StringIO()
    call_command("awa_cron", "pause", "tick", stdout=out)
    call_command("awa_cron", "trigger", "tick", stdout=out)
    listing = StringIO()
    call_command("awa_cron", "list", stdout=listing)
    lines = listing.getvalue().splitlines()
    assert lines[0].startswith("other\t* * * * * Europe/Paris\tenabled\tnext 20")
    assert lines[1].startswith("tick\t* * * * * UTC\tpaused by awa_cron")
    assert "job " in lines[1] and "(available)" in lines[1]
    call_command("awa_cron", "resume", "tick", stdout=out)
    assert "schedule tick paused" in out.getvalue() and "schedule tick resumed" in out.getvalue()
    assert "schedule tick: enqueued job" in out.getvalue()
    as_json = StringIO()
    call_command("awa_cron", "list", "--json", stdout=as_json)
    assert '"enabled": true' in as_json.getvalue()
    for argv, message in (
        (["trigger", "nope"], "unknown schedule 'nope'"),
        (["pause"], "needs a schedule name"),
        (["list", "tick"], "takes no schedule name"),
    ):
        with pytest.raises(CommandError, match=message):
            call_command("awa_cron", *argv)


def test_admin_lists_schedules_and_gates_pause_resume_trigger() -> None:
    with periodic(tick=EVERY_MINUTE):
        sync()
    viewer = staff()
    page = viewer.get(changelist("cronschedule"))
    assert page.status_code == 200
    text = page.content.decode()
    assert "tick" in text and "* * * * * (UTC)" in text
    # Without the permission the actions are not offered, and a forged POST changes nothing.
    assert "pause_schedules" not in text
    forged = post_action(viewer, "cronschedule", "pause_schedules", ["tick"])
    assert forged.status_code in (200, 302, 403)
    assert rows("SELECT paused_at FROM awa.cron_schedules") == [(None,)]
    assert staff(view=False).get(changelist("cronschedule")).status_code == 403

    operator = staff("manage_schedule")
    page, done = confirmed(operator, "cronschedule", "pause_schedules", ["tick"])
    assert "Pause schedules" in page.content.decode()
    assert messages_of(done) == ["Pause schedules: tick paused"]
    [(paused_by,)] = rows("SELECT paused_by FROM awa.cron_schedules")
    assert paused_by.startswith("admin (")
    _, done = confirmed(operator, "cronschedule", "trigger_schedules", ["tick"])
    [message] = messages_of(done)
    assert message.startswith("Trigger schedules: tick triggered: enqueued job ")
    _, done = confirmed(operator, "cronschedule", "resume_schedules", ["tick"])
    assert messages_of(done) == ["Resume schedules: tick resumed"]
    assert rows("SELECT paused_at FROM awa.cron_schedules") == [(None,)]
    logged = sorted(LogEntry.objects.values_list("change_message", flat=True))
    assert logged[0] == "paused" and logged[1] == "resumed"
    assert logged[2].startswith("triggered: enqueued job ")
    detail = operator.get(changelist("cronschedule") + "tick/change/")
    assert detail.status_code == 200 and "Next fire" in detail.content.decode()
    # Its own page offers what applies to it (running: Pause, not Resume), as buttons.
    assert {n: b[2] for n, b in buttons(detail).items()} == {
        "pause_schedules": "Pause",
        "trigger_schedules": "Trigger now",
    }
    assert buttons(viewer.get(changelist("cronschedule") + "tick/change/")) == {}


# Locked rows, long catch-ups, fire labels, failing schedules, new queues --------------------------


def test_a_locked_schedule_row_is_skipped_not_waited_for() -> None:
    with periodic(held=EVERY_MINUTE, free=EVERY_MINUTE):
        sync()
    start = db_now() - timedelta(minutes=1, seconds=30)
    with pg() as conn:
        conn.execute("UPDATE awa.cron_schedules SET fire_after = %s", [start])
    with pg(autocommit=False) as holder:
        holder.execute("SELECT 1 FROM awa.cron_schedules WHERE name = 'held' FOR UPDATE")
        started = datetime.now(UTC)
        assert evaluate() == 1  # 'free' fires; 'held' is left for the next pass
        assert datetime.now(UTC) - started < timedelta(seconds=2)  # nobody waited
        holder.rollback()
    assert len(fired("free")) == 1 and fired("held") == []
    assert evaluate() == 1 and len(fired("held")) == 1


def test_a_long_catch_up_is_spread_over_passes() -> None:
    from awa_django.maintenance.cron import FIRES_PER_PASS

    every_second = {**EVERY_MINUTE, "cron": "* * * * * *", "catch_up": 10_000}
    with periodic(flood=every_second):
        sync()
    set_fire_after("flood", db_now() - timedelta(seconds=FIRES_PER_PASS + 100))
    assert evaluate() == FIRES_PER_PASS
    assert evaluate() >= 100  # the rest on the next pass, oldest first, none twice
    times = fired("flood")
    assert len(times) == len(set(times)) >= FIRES_PER_PASS + 100 and times == sorted(times)


def test_scheduled_fires_are_never_labelled_manual() -> None:
    with periodic(labelled={**EVERY_MINUTE, "metadata": {"cron_trigger": "manual", "k": 1}}):
        sync()
    set_fire_after("labelled", db_now() - timedelta(minutes=1, seconds=30))
    assert evaluate() == 1
    [(metadata,)] = rows("SELECT metadata FROM awa.jobs WHERE metadata->>'cron_name' = 'labelled'")
    assert "cron_trigger" not in metadata and metadata["k"] == 1


def test_a_failing_schedule_is_logged_once_a_minute_whatever_its_fire_time(caplog: Any) -> None:
    firer = CronFirer()
    with caplog.at_level(logging.ERROR, logger="awa_django.maintenance"):
        for second in range(3):
            firer._problem("s", "could not fire: boom", detail=f" (at 00:00:0{second})")
    assert len(caplog.records) == 1


def test_a_fire_into_a_new_queue_makes_the_configured_number_of_lanes() -> None:
    """The leader's connections carry AWA["ENQUEUE_SHARDS"] (awa.enqueue_shards): a periodic
    fire into a queue without lanes makes that many, as a producer would (it made 4, whatever
    the setting). A session without it, or with a value that is not a shard count, gets 4."""
    from awa_django.db.connection import connect_async

    entry = {**EVERY_MINUTE, "queue": "cron-shards"}
    with override_settings(
        AWA={**settings.AWA, "PERIODIC": {"sharded": entry}, "ENQUEUE_SHARDS": 2}
    ):
        sync()
        set_fire_after("sharded", db_now() - timedelta(minutes=2))

        async def fire() -> int:
            conn = await connect_async("default", application_name="awa:test")
            async with conn:
                return int(await CronFirer().evaluate(conn))

        assert asyncio.run(fire()) >= 1
    assert rows("SELECT count(*) FROM awa.queue_lanes WHERE queue = 'cron-shards'") == [(2,)]
    with pg() as conn:
        conn.execute("SELECT set_config('awa.enqueue_shards', 'lots', false)")
        conn.execute("SELECT awa.ensure_lanes_v1('odd-shards', 0)")
        assert conn.execute(
            "SELECT count(*) FROM awa.queue_lanes WHERE queue = 'odd-shards'"
        ).fetchone() == (4,)
