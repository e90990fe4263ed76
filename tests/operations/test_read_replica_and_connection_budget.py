"""The read replica (AWA["READ_DATABASE_ALIAS"]) and the connection budget under faults and odd
input, written from the docs (docs/deployment.md) only. Each test states the documented promise it
checks."""

from __future__ import annotations

import signal
from collections.abc import Callable
from typing import Any

import pytest

from awa_django.worker.config import connection_budget
from tests.jobs import common as testjobs
from tests.support.database import pg
from tests.support.polling import wait_for
from tests.support.processes import ManagedProcess

Start = Callable[..., ManagedProcess]

_OTHERS = """
SELECT pid FROM pg_stat_activity
WHERE datname = current_database() AND backend_type = 'client backend'
"""


def _worker_connections(before: set[int]) -> int:
    with pg() as conn:
        pids = {row[0] for row in conn.execute(_OTHERS).fetchall()}
        mine = conn.execute("SELECT pg_backend_pid()").fetchone()
    assert mine is not None
    return len(pids - before - {mine[0]})


def _peak_connections(
    manage_py: Start, job: Any, concurrency: int, seconds: float = 4.0, processes: int = 1
) -> tuple[int, ManagedProcess]:
    with pg() as conn:
        before = {row[0] for row in conn.execute(_OTHERS).fetchall()}
    ids = [job.enqueue(seconds).id for _ in range(concurrency * processes)]
    proc = manage_py(
        "awa_worker",
        "--queue",
        "slow",
        "--concurrency",
        str(concurrency),
        "--processes",
        str(processes),
    )
    peak = 0

    def all_running() -> bool:
        nonlocal peak
        peak = max(peak, _worker_connections(before))
        with pg() as conn:
            row = conn.execute(
                "SELECT count(*) FROM awa.jobs WHERE id = ANY(%s) AND state = 'running'", [ids]
            ).fetchone()
        return row is not None and row[0] == concurrency * processes

    wait_for(all_running, timeout=60, message=lambda: proc.output())
    # Every handler is inside its sleep, each holding the ORM connection it opened.
    wait_for(lambda: _worker_connections(before) >= 0, timeout=5)
    for _ in range(20):
        peak = max(peak, _worker_connections(before))
    proc.send_signal(signal.SIGTERM)
    return peak, proc


@pytest.mark.django_db(transaction=True)
def test_budget_formula_bounds_sync_orm_worker(manage_py: Start, clean_awa: None) -> None:
    """docs/deployment.md: every worker process holds at most CONCURRENCY + 7 connections."""
    concurrency = 6
    peak, proc = _peak_connections(manage_py, testjobs.overlap_sync, concurrency)
    print("PEAK", peak, connection_budget(1, concurrency))
    assert peak <= connection_budget(1, concurrency), (peak, proc.output())


@pytest.mark.django_db(transaction=True)
def test_budget_formula_bounds_async_orm_worker(manage_py: Start, clean_awa: None) -> None:
    """docs/deployment.md: async handlers' sync_to_async ORM calls add one connection."""
    concurrency = 6
    with pg() as conn:
        before = {row[0] for row in conn.execute(_OTHERS).fetchall()}
    ids = [testjobs.ledger_async.enqueue(i).id for i in range(300)]
    proc = manage_py("awa_worker", "--queue", "work-async", "--concurrency", str(concurrency))
    peak = 0

    def done() -> bool:
        nonlocal peak
        peak = max(peak, _worker_connections(before))
        with pg() as conn:
            row = conn.execute(
                "SELECT count(*) FROM awa.jobs WHERE id = ANY(%s) AND state = 'completed'", [ids]
            ).fetchone()
        return row is not None and row[0] == len(ids)

    wait_for(done, timeout=120, message=lambda: proc.output())
    proc.send_signal(signal.SIGTERM)
    print("PEAK", peak, connection_budget(1, concurrency))
    assert peak <= connection_budget(1, concurrency), (peak, proc.output())


# --- The read alias on a server that is down, or on a database without the awa schema --------


ALIAS = "atk_replica"


def _register_alias() -> None:
    """The alias exists from collection on (a TEST MIRROR of default: nothing is created or
    flushed on it), so that a test may name it in ``databases``; each test points it
    elsewhere."""
    from django.conf import settings
    from django.db import connections

    if ALIAS not in settings.DATABASES:
        entry = {**settings.DATABASES["default"], "TEST": {"MIRROR": "default"}}
        settings.DATABASES[ALIAS] = entry
        connections.settings[ALIAS] = connections.configure_settings(
            {"default": dict(settings.DATABASES["default"]), ALIAS: entry}
        )[ALIAS]


_register_alias()
DB = pytest.mark.django_db(transaction=True, databases=["default", ALIAS])


@pytest.fixture
def read_alias(settings: Any) -> Any:
    """Point ALIAS at ``changes`` (over the test database's settings) and make it
    AWA["READ_DATABASE_ALIAS"]."""
    from django.db import connections

    saved = dict(connections[ALIAS].settings_dict)

    def make(**changes: Any) -> str:
        connections[ALIAS].close()
        connections[ALIAS].settings_dict.update(
            {**connections["default"].settings_dict, "TEST": saved.get("TEST", {}), **changes}
        )
        settings.AWA = {**settings.AWA, "READ_DATABASE_ALIAS": ALIAS}
        return ALIAS

    yield make
    connections[ALIAS].close()
    connections[ALIAS].settings_dict.clear()
    connections[ALIAS].settings_dict.update(saved)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


@DB
def test_admin_list_with_replica_down_is_not_a_500(
    read_alias: Callable[..., str], clean_awa: None
) -> None:
    """A replica that is down: the admin's job list says so, not a bare 500."""
    from django.test import Client

    from tests.support.admin_client import changelist
    from tests.support.factories import staff

    read_alias(HOST="127.0.0.1", PORT=str(_free_port()))
    client: Client = staff()
    client.raise_request_exception = False
    response = client.get(changelist("livejob"))
    assert response.status_code != 500, response.content[:500]


@DB
def test_awa_status_with_replica_down_says_why(
    read_alias: Callable[..., str], clean_awa: None
) -> None:
    """awa_status (and --json) with the replica down: a CommandError naming the alias, no
    traceback."""
    from django.core.management import CommandError, call_command

    read_alias(HOST="127.0.0.1", PORT=str(_free_port()))
    for args in ([], ["--json"]):
        with pytest.raises(CommandError) as info:
            call_command("awa_status", *args)
        assert "replica" in str(info.value), str(info.value)


@DB
def test_admin_list_on_unmigrated_read_database_is_not_a_500(
    read_alias: Callable[..., str], clean_awa: None
) -> None:
    """READ_DATABASE_ALIAS pointing at a database without the awa schema (a replica of the
    wrong cluster, a typo in NAME): a clear message, not a 500."""
    from django.test import Client

    from tests.support.admin_client import changelist
    from tests.support.factories import staff

    read_alias(NAME="postgres")
    client: Client = staff()
    client.raise_request_exception = False
    response = client.get(changelist("livejob"))
    assert response.status_code != 500, response.content[:500]


@DB
def test_awa_status_on_unmigrated_read_database_says_why(
    read_alias: Callable[..., str], clean_awa: None
) -> None:
    from django.core.management import CommandError, call_command

    read_alias(NAME="postgres")
    for args in ([], ["--json"]):
        with pytest.raises(CommandError) as info:
            call_command("awa_status", *args)
        assert "replica" in str(info.value), str(info.value)


# --- A real hot standby: stale rows, actions, select-all over a filtered list --------------


@pytest.fixture(scope="module")
def standby(django_db_setup: None, django_db_blocker: Any) -> Any:
    """A hot standby of the test server (its test database included), made after the test
    database exists."""
    import pgserver
    from django.db import connections

    port = int(connections["default"].settings_dict["PORT"])
    server = pgserver.start_standby(port, "/tmp/pg-atk19b-standby")
    yield server
    server.stop()


def _on_standby(server: Any, sql: str) -> Any:
    import psycopg
    from django.db import connections

    name = connections["default"].settings_dict["NAME"]
    with psycopg.connect(
        host="127.0.0.1", port=server.port, user="postgres", dbname=name, autocommit=True
    ) as conn:
        return conn.execute(sql).fetchall()


def _caught_up(server: Any) -> None:
    with pg() as conn:
        # The insert position: with synchronous_commit off (the test server's), the last
        # commit may still be in WAL buffers, past pg_current_wal_lsn().
        row = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
    assert row is not None
    lsn = row[0]
    wait_for(
        lambda: _on_standby(server, f"SELECT pg_last_wal_replay_lsn() >= '{lsn}'::pg_lsn")[0][0],
        timeout=30,
    )


@pytest.fixture
def paused_replica(standby: Any, read_alias: Any, clean_awa: None) -> Any:
    """Point the read alias at the standby; returns ``pause()``, which waits until the standby
    has replayed everything so far and then pauses its replay (resumed at teardown)."""
    read_alias(HOST="127.0.0.1", PORT=str(standby.port))

    def pause() -> None:
        _caught_up(standby)
        _on_standby(standby, "SELECT pg_wal_replay_pause()")

    yield pause
    _on_standby(standby, "SELECT pg_wal_replay_resume()")


@DB
def test_dlq_retry_twice_from_a_stale_replica_retries_once(paused_replica: Any) -> None:
    from tests.support.admin_client import changelist, confirmed, messages_of
    from tests.support.factories import dead_letter, staff

    [job_id] = dead_letter(1, queue="atkq")
    paused_replica()
    client = staff("retry_dlq")
    _, first = confirmed(client, "deadletter", "retry_jobs", [job_id])
    assert first.status_code == 302, first
    # The replica still lists the entry; the user retries it again.
    listed = client.get(changelist("deadletter"))
    assert str(job_id) in listed.content.decode()
    page = client.post(
        changelist("deadletter"),
        {"action": "retry_jobs", "index": "0", "_selected_action": [str(job_id)]},
        follow=True,
    )
    assert page.status_code == 200
    with pg() as conn:
        count = conn.execute(
            "SELECT count(*) FROM awa.jobs WHERE queue = 'atkq' AND state <> 'failed'"
        ).fetchone()
    assert count == (1,), (count, messages_of(page))


@DB
def test_select_all_over_filtered_replica_list_names_only_rows_seen(
    paused_replica: Any,
) -> None:
    """ "Select all N" over a filtered list that reads from a lagging replica: the user saw N
    rows; the action must not take in rows the replica never showed without saying so."""
    from tests.support.admin_client import changelist, form_fields, post_action
    from tests.support.factories import dead_letter, staff

    seen = dead_letter(2, queue="atksel")
    paused_replica()
    unseen = dead_letter(3, queue="atksel")  # on the primary only
    client = staff("retry_dlq")
    query = "?queue=atksel"
    listed = client.get(changelist("deadletter") + query)
    assert listed.status_code == 200
    page = post_action(client, "deadletter", "retry_jobs", seen, query, select_across="1")
    assert page.status_code == 200, page
    named = {int(n) for n in form_fields(page)["awa_selected"].split(",")}
    text = page.content.decode()
    # Either only the rows the user saw, or the page says others are included.
    assert named == set(seen) or "replica" in text, (named, seen, unseen)


@DB
def test_purge_of_dlq_entry_retried_meanwhile_leaves_the_live_job(paused_replica: Any) -> None:
    """The replica still shows a DLQ entry that was retried on the primary; purging it must
    not delete the job now back at work."""
    from awa_django.operator import dlq_retry
    from tests.support.admin_client import confirmed, messages_of
    from tests.support.factories import dead_letter, staff

    [job_id] = dead_letter(1, queue="atkpurge")
    paused_replica()
    dlq_retry([job_id])
    client = staff("purge_dlq")
    page = client.post(
        "/admin/awa_django/deadletter/",
        {"action": "purge_jobs", "index": "0", "_selected_action": [str(job_id)]},
        follow=True,
    )
    assert page.status_code == 200
    if "awa_selected" in page.content.decode():
        confirmed(client, "deadletter", "purge_jobs", [job_id])
    with pg() as conn:
        row = conn.execute("SELECT state FROM awa.jobs WHERE id = %s", [job_id]).fetchone()
    assert row is not None and row[0] == "available", (row, messages_of(page))


@DB
def test_cancel_of_job_finished_meanwhile_changes_nothing(paused_replica: Any) -> None:
    from tests.support.admin_client import messages_of, post_action
    from tests.support.factories import staff

    job_id = testjobs.noop.using(queue="atkcancel").enqueue().id
    paused_replica()
    with pg() as conn:
        from tests.support.factories import claim_and_finish

        claim_and_finish(conn, "atkcancel", 1, "completed")
        before = conn.execute("SELECT state FROM awa.jobs WHERE id = %s", [job_id]).fetchone()
    client = staff("cancel_job")
    page = post_action(client, "livejob", "cancel_jobs", [job_id])
    assert page.status_code in (200, 302)
    msgs = messages_of(page)
    with pg() as conn:
        after = conn.execute("SELECT state FROM awa.jobs WHERE id = %s", [job_id]).fetchone()
    assert before == after, (before, after, msgs)
    assert any("no longer" in m or "None of the selected" in m for m in msgs), msgs


@DB
def test_banner_and_status_with_replay_paused(paused_replica: Any) -> None:
    """A paused replica: the list warns, awa_status --json says replay_paused and a lag."""
    import json
    from io import StringIO

    from django.core.management import call_command

    from tests.support.admin_client import changelist, messages_of
    from tests.support.factories import staff

    paused_replica()
    testjobs.noop.enqueue()  # WAL the standby receives but does not replay
    client = staff()
    page = client.get(changelist("livejob"))
    assert page.status_code == 200
    msgs = messages_of(page)
    assert any("paused" in m for m in msgs), msgs
    out = StringIO()
    call_command("awa_status", "--json", stdout=out)
    read_from = json.loads(out.getvalue())["read_from"]
    assert read_from["replica"] is True and read_from["replay_paused"] is True, read_from


# --- The connection budget's checks -------------------------------------------------------


def _server_numbers() -> tuple[int, int, int]:
    """max_connections, the reserved slots, and the client backends open now (all databases)."""
    with pg() as conn:
        row = conn.execute(
            "SELECT current_setting('max_connections')::int,"
            " current_setting('superuser_reserved_connections')::int"
            " + coalesce(current_setting('reserved_connections', true)::int, 0),"
            " (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend')"
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1]), int(row[2]) - 1  # not this probe's own connection


@DB
def test_worker_start_warning_not_raised_when_the_fleet_fits(
    manage_py: Start, clean_awa: None
) -> None:
    """The worker warns "when it exceeds the connections the server has left": a worker whose
    whole budget fits in what is left (reserved slots and a margin of 2 kept aside) must not
    warn. pg_stat_activity also lists background processes (checkpointer, walwriter, ...) and
    the worker's own connections already open, which are not "left" to lose."""
    maximum, reserved, in_use = _server_numbers()
    concurrency = maximum - reserved - in_use - 2 - 6
    assert concurrency > 0
    proc = manage_py("awa_worker", "--queue", "atkbudget", "--concurrency", str(concurrency))
    wait_for(
        lambda: "may need" in proc.output() or _registered(),
        timeout=60,
        message=lambda: proc.output(),
    )
    wait_for(lambda: _registered(), timeout=60, message=lambda: proc.output())
    proc.send_signal(signal.SIGTERM)
    assert "may need" not in proc.output(), (maximum, reserved, in_use, proc.output())


def _registered() -> bool:
    with pg() as conn:
        row = conn.execute("SELECT count(*) FROM awa.runtime_instances").fetchone()
    return row is not None and row[0] > 0


@pytest.mark.django_db
def test_w002_counts_the_reserved_connection_slots(settings: Any) -> None:
    """awa.W002: the slots reserved for superusers (superuser_reserved_connections,
    reserved_connections) are not available to the workers' role; a fleet that needs
    max_connections - 1 connections cannot connect as an ordinary role."""
    from django.db import connections

    from awa_django.checks import connection_budget_warnings
    from awa_django.conf import get_awa_settings

    maximum, reserved, _ = _server_numbers()
    assert reserved > 0
    settings.AWA = {**settings.AWA, "PROCESSES": 1, "CONCURRENCY": maximum - 1 - 6}
    warnings = connection_budget_warnings("default", connections, get_awa_settings())
    assert [w.id for w in warnings] == ["awa.W002"], (maximum, reserved)


def test_connection_budget_rejects_nonsense() -> None:
    """A public function: negative, zero-process or non-int counts are a clear error, not a
    negative budget or a repeated string."""
    for args in [(-1, 5), (1, -10), ("2", 3), (1.5, 2)]:
        with pytest.raises((TypeError, ValueError)):
            connection_budget(*args)


@pytest.mark.django_db(transaction=True)
def test_budget_formula_bounds_a_supervised_fleet(manage_py: Start, clean_awa: None) -> None:
    """docs/deployment.md: a supervisor (--processes) holds none of its own."""
    peak, proc = _peak_connections(manage_py, testjobs.overlap_sync, 3, processes=2)
    print("PEAK", peak, connection_budget(2, 3))
    assert peak <= connection_budget(2, 3), (peak, proc.output())
