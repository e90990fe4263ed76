"""The queue charts' roll-up: ``awa.queue_minutes_record_v1`` (the maintenance leader's task)
and ``awa.queue_minutes_v2`` / ``operator.queue_minutes`` (what the admin's charts read).

A minute is rolled up once, about 10 s after it ends, with the outcomes of terminal history and
the DLQ, the queue wait and run time of the attempts that finished, and the queue's depth as it
was then; a catch-up reaches back an hour at most; rows older than 25 hours go.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest

from awa_django.db import storage
from awa_django.db.storage import Finalization
from awa_django.exceptions import InvalidOptionError
from awa_django.operator import queue_minutes
from tests.support.database import pg
from tests.support.factories import WORKER, enqueue_sql

pytestmark = [
    pytest.mark.storage,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("clean_awa"),
]

Conn = psycopg.Connection[Any]
ERROR = {"type": "Boom", "message": "x", "traceback": "x"}


@pytest.fixture
def conn() -> Iterator[Conn]:
    with pg() as c:
        yield c


def record(conn: Conn, at: datetime | None = None) -> int:
    """Run the roll-up as if the clock read ``at``; the minutes it rolled up."""
    [[n]] = conn.execute("SELECT awa.queue_minutes_record_v1(%s)", [at]).fetchall()
    return int(n)


def rows(conn: Conn, queue: str) -> list[dict[str, Any]]:
    cur = conn.execute("SELECT * FROM awa.queue_minutes WHERE queue = %s ORDER BY minute", [queue])
    assert cur.description is not None
    names = [d.name for d in cur.description]
    return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]


def finish(conn: Conn, queue: str, outcomes: list[str]) -> None:
    """Claim len(outcomes) jobs of ``queue`` and finalize each with its outcome."""
    claimed = storage.claim(conn, queue, len(outcomes), WORKER)
    assert len(claimed) == len(outcomes)
    storage.finalize(
        conn,
        [
            Finalization(
                c.job_id, c.run_lease, c.claim_slot, o, error=ERROR if o != "completed" else None
            )
            for c, o in zip(claimed, outcomes, strict=True)
        ],
    )


def finished_minutes(conn: Conn) -> list[datetime]:
    """The minutes (by the database clock) in which the test's jobs finished."""
    return [
        r[0]
        for r in conn.execute(
            "SELECT DISTINCT date_trunc('minute', t) FROM ("
            " SELECT finalized_at AS t FROM awa.done_entries"
            " UNION ALL SELECT dlq_at FROM awa.dlq_entries) x ORDER BY 1"
        ).fetchall()
    ]


def finished_earlier(conn: Conn, minutes: int) -> None:
    """Move every finish ``minutes`` minutes back, as if the jobs had finished then (a roll-up
    never runs ahead of the database clock)."""
    conn.execute(
        "UPDATE awa.done_entries SET finalized_at = finalized_at - make_interval(mins => %s)",
        [minutes],
    )
    conn.execute(
        "UPDATE awa.dlq_entries SET dlq_at = dlq_at - make_interval(mins => %s)", [minutes]
    )


def recounted(conn: Conn, minute: datetime) -> bool:
    [[done]] = conn.execute(
        "SELECT recounted FROM awa.queue_minutes WHERE queue = '' AND minute = %s", [minute]
    ).fetchall()
    return bool(done)


def claim_one(conn: Conn, queue: str, outcome: str, **options: Any) -> list[int]:
    [c] = storage.claim(conn, queue, 1, WORKER)
    storage.finalize(
        conn, [Finalization(c.job_id, c.run_lease, c.claim_slot, outcome, error=ERROR, **options)]
    )
    return [c.job_id]


def test_a_minute_is_counted_with_its_outcomes_times_and_depth_then_once_more(
    conn: Conn,
) -> None:
    body = {"kind": "k", "queue": "charts", "max_attempts": 1}
    enqueue_sql(conn, json.dumps([body] * 4))
    finish(conn, "charts", ["completed", "completed", "completed", "fail"])
    enqueue_sql(conn, json.dumps([{**body, "max_attempts": 5}]))
    claim_one(conn, "charts", "retry", delay=3600)  # attempts left: retryable for an hour
    enqueue_sql(conn, json.dumps([body]))
    late = claim_one(conn, "charts", "cancel")
    enqueue_sql(conn, json.dumps([body] * 2))  # left available
    finished_earlier(conn, 20)
    minutes = finished_minutes(conn)
    assert 1 <= len(minutes) <= 2  # the test may straddle a minute's end
    # A job whose transaction began in the minute and committed after the first count: left
    # out of the history until then.
    [(held,)] = conn.execute(
        "DELETE FROM awa.done_entries WHERE job_id = %s RETURNING row_to_json(done_entries)",
        late,
    ).fetchall()
    # The first roll-up takes the last minute that ended 10 s ago: here, the one before.
    assert record(conn, minutes[0] + timedelta(seconds=10)) == 1
    # A minute is not rolled up until it is 10 s over...
    record(conn, minutes[-1] + timedelta(seconds=69))
    assert minutes[-1] not in [r["minute"] for r in rows(conn, "charts")]
    # ...then it is.
    assert record(conn, minutes[-1] + timedelta(seconds=70)) == 1
    got = rows(conn, "charts")
    assert got[-1]["minute"] == minutes[-1]
    assert sum(r["cancelled"] for r in got) == 0  # not committed at the first count
    conn.execute(
        "INSERT INTO awa.done_entries SELECT * FROM json_populate_record("
        "NULL::awa.done_entries, %s::json)",
        [json.dumps(held)],
    )
    # Dead letters retried or purged since still went to the DLQ in that minute.
    [[dead]] = conn.execute("SELECT count(*) FROM awa.dlq_entries WHERE queue = 'charts'")
    conn.execute("DELETE FROM awa.dlq_entries")
    # The second count, 5 minutes after the minute ends, takes it in; no third.
    record(conn, minutes[-1] + timedelta(minutes=5, seconds=59))
    assert not recounted(conn, minutes[-1])
    assert sum(r["cancelled"] for r in rows(conn, "charts")) == 0
    record(conn, minutes[-1] + timedelta(minutes=6))
    assert recounted(conn, minutes[-1])
    got = rows(conn, "charts")
    [states] = conn.execute(
        "SELECT count(*) FILTER (WHERE state = 'completed'),"
        " count(*) FILTER (WHERE state = 'failed'), count(*) FILTER (WHERE state = 'cancelled')"
        " FROM awa.done_entries WHERE queue = 'charts'"
    ).fetchall()
    assert states[0] == 3 and states[2] == 1 and states[1] + dead == 1
    assert [sum(r[k] for r in got) for k in ("completed", "failed", "cancelled")] == list(states)
    assert sum(r["dead_lettered"] for r in got) == dead
    for r in got:
        if r["completed"] + r["failed"]:
            assert 0 <= r["wait_p50"] <= r["wait_p95"] < 60
            assert 0 <= r["run_p50"] <= r["run_p95"] < 60
    # The newest minute of the first count carries the queue as it was then: 2 available, 1
    # retryable; the second count leaves it.
    newest = next(r for r in got if r["minute"] == minutes[-1])
    assert (newest["available"], newest["retryable"]) == (2, 1)
    assert newest["oldest_seconds"] >= 0
    # Once: a run at the same time counts nothing more, and one that finds the minutes' marks
    # gone writes nothing new over the rows.
    assert record(conn, minutes[-1] + timedelta(minutes=6)) == 0
    conn.execute("DELETE FROM awa.queue_minutes WHERE queue = ''")
    record(conn, minutes[-1] + timedelta(seconds=70))
    assert rows(conn, "charts") == got


def test_a_minute_counts_the_retries_it_scheduled_whether_run_since_or_waiting(
    conn: Conn,
) -> None:
    body = {"kind": "k", "queue": "retries", "max_attempts": 5}
    enqueue_sql(conn, json.dumps([body] * 4 + [{**body, "max_attempts": 1}]))
    claimed = storage.claim(conn, "retries", 5, WORKER)
    storage.finalize(
        conn,
        [
            Finalization(c.job_id, c.run_lease, c.claim_slot, "retry", error=ERROR, delay=d)
            for c, d in zip(claimed, [0, 0, 3600, 3600, 0], strict=True)
        ],
    )  # four retries, and one out of attempts: to the DLQ, not a retry
    conn.execute("SELECT awa.promote_v1()")  # two are back in the queue, two wait an hour
    for sql in (
        "UPDATE awa.deferred_jobs SET deferred_at = deferred_at - interval '20 minutes'",
        "UPDATE awa.queue_minute_retries SET minute = minute - interval '20 minutes'",
    ):
        conn.execute(sql)
    finished_earlier(conn, 20)
    [minute] = finished_minutes(conn)
    [[waiting]] = conn.execute("SELECT count(*) FROM awa.deferred_jobs").fetchall()
    assert waiting == 2
    record(conn, minute + timedelta(seconds=70))
    [row] = [r for r in rows(conn, "retries") if r["minute"] == minute]
    assert (row["retried"], row["dead_lettered"], row["failed"]) == (4, 1, 0)
    # The two waiting run later: the minute they failed in still counts them, once.
    conn.execute("UPDATE awa.deferred_jobs SET run_at = now()")
    conn.execute("SELECT awa.promote_v1()")
    [[tally]] = conn.execute("SELECT sum(retries) FROM awa.queue_minute_retries").fetchall()
    assert tally == 4
    record(conn, minute + timedelta(minutes=6))
    assert recounted(conn, minute)
    [shown] = [m for m in queue_minutes("retries", 60) if m.minute == minute]
    assert shown.retried == 4


def test_a_retry_cancelled_while_it_waits_still_counts_in_its_minute(conn: Conn) -> None:
    enqueue_sql(conn, json.dumps([{"kind": "k", "queue": "cancels", "max_attempts": 5}] * 2))
    first, second = storage.claim(conn, "cancels", 2, WORKER)
    storage.finalize(
        conn,
        [
            Finalization(c.job_id, c.run_lease, c.claim_slot, "retry", error=ERROR, delay=3600)
            for c in (first, second)
        ],
    )
    conn.execute("SELECT awa.cancel_v1(%s, 'operator')", [first.job_id])
    conn.execute("SELECT awa.queue_drain_v2('cancels', 100)")
    [[waiting, tally]] = conn.execute(
        "SELECT (SELECT count(*) FROM awa.deferred_jobs),"
        " (SELECT sum(retries) FROM awa.queue_minute_retries)"
    ).fetchall()
    assert (waiting, tally) == (0, 2)


def test_a_catch_up_reaches_back_an_hour_and_rows_older_than_a_day_go(conn: Conn) -> None:
    enqueue_sql(conn, json.dumps([{"kind": "k", "queue": "idle"}]))  # depth 1, no outcome
    [[now, last]] = conn.execute(
        "SELECT now(), date_trunc('minute', now() - interval '70 s')"
    ).fetchall()
    conn.execute(
        "INSERT INTO awa.queue_minutes (queue, minute, completed, failed, cancelled,"
        " dead_lettered, recounted) VALUES ('idle', %s, 1, 0, 0, 0, true),"
        " ('', %s, 0, 0, 0, 0, true)",
        [last - timedelta(hours=26), last - timedelta(hours=3)],
    )
    counted = record(conn, now)
    # The old row is gone; of the hour caught up, only the newest minute has something to show
    # (the depth, read now): the others had no outcome and are not written.
    assert [(r["minute"], r["available"], r["completed"]) for r in rows(conn, "idle")] == [
        (last, 1, 0)
    ]
    [[marks, depth_read, recounted]] = conn.execute(
        "SELECT count(*), count(available), count(*) FILTER (WHERE recounted)"
        " FROM awa.queue_minutes WHERE queue = ''"
    ).fetchall()
    assert (marks, depth_read) == (61, 1)  # the hour caught up, and the mark three hours back
    assert counted == 60 + recounted - 1 and recounted >= 50  # and the second counts due
    assert record(conn, now) == 0


def test_the_read_tells_a_quiet_minute_from_one_not_rolled_up(conn: Conn) -> None:
    enqueue_sql(conn, json.dumps([{"kind": "k", "queue": "read"}] * 2))
    finish(conn, "read", ["completed"])
    finished_earlier(conn, 5)  # so that the read (up to the last minute that ended) shows it
    [minute] = finished_minutes(conn)
    before = queue_minutes("read", 5)
    assert len(before) == 5 and not any(m.recorded for m in before)
    assert all(m.completed is None and m.available is None for m in before)
    record(conn, minute + timedelta(seconds=10))  # the minute before: quiet, but for the depth
    record(conn, minute + timedelta(seconds=70))
    enqueue_sql(conn, json.dumps([{"kind": "k", "queue": "other"}]))
    shown = {m.minute: m for m in queue_minutes("read", 1440)}
    assert len(shown) == 1440
    assert shown[minute].recorded and shown[minute].completed == 1
    assert shown[minute].run_p50 is not None and shown[minute].available == 1
    quiet = shown[minute - timedelta(minutes=1)]
    assert quiet.recorded and quiet.completed == 0 and quiet.run_p50 is None
    assert not shown[minute - timedelta(minutes=2)].recorded
    # A queue with no row in a minute whose depth was read: zero deep, not a gap.
    other = {m.minute: m for m in queue_minutes("other", 10)}
    assert other[minute].available == 0 and other[minute].completed == 0
    # The markers are no queue's: asking for the queue '' is refused before any read.
    with pytest.raises(InvalidOptionError):
        queue_minutes("")
    with pytest.raises(psycopg.errors.InvalidParameterValue):
        conn.execute("SELECT * FROM awa.queue_minutes_v2('', 60)")
    with pytest.raises(psycopg.errors.InvalidParameterValue):
        conn.execute("SELECT * FROM awa.queue_minutes_v2('read', 1441)")


@pytest.mark.parametrize("minutes", [0, 1441, -1, True, 1.5, "60", None])
def test_a_bad_span_is_refused_before_any_read(minutes: Any) -> None:
    with pytest.raises(InvalidOptionError, match="minutes"):
        queue_minutes("q", minutes)


@pytest.mark.parametrize("queue", ["", "A", "x" * 64, "a/b", None, "q\x00"])
def test_a_bad_queue_name_is_refused_before_any_read(queue: Any) -> None:
    with pytest.raises(InvalidOptionError, match="queue"):
        queue_minutes(queue)


def test_a_roll_up_ahead_of_the_clock_or_past_a_day_is_refused(conn: Conn) -> None:
    for when in (
        "now() + interval '1 s'",
        "now() - interval '26 hours'",
        "'infinity'",
        "'-infinity'",
    ):
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="ahead of the clock"):
            conn.execute(f"SELECT awa.queue_minutes_record_v1({when})")
    [[n]] = conn.execute("SELECT count(*) FROM awa.queue_minutes").fetchall()
    assert n == 0
    # The clock itself is not ahead of the clock (inside a transaction, now() is its start).
    with conn.transaction():
        conn.execute("SELECT pg_sleep(0.05)")
        assert record(conn, conn.execute("SELECT clock_timestamp()").fetchone()[0]) == 1  # type: ignore[index]


def test_a_roll_up_waits_for_a_lock_at_most_briefly(conn: Conn) -> None:
    """Whatever the session's lock_timeout (none here), the roll-up gives up on a held lock
    after its own 200 ms: the leader goes on to promotion and tries again next turn."""
    with pg() as holder:
        holder.execute("BEGIN")
        holder.execute("LOCK TABLE awa.queue_minutes IN ACCESS EXCLUSIVE MODE")
        conn.execute("SET lock_timeout = 0")
        with pytest.raises(psycopg.errors.LockNotAvailable):
            record(conn)
        holder.execute("ROLLBACK")
    assert record(conn) == 1
