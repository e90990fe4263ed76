"""Health probes (docs/observability.md, "Health probes"): ``awa_health`` exit codes and its one
line, and the health view's status codes, with a live worker, a frozen (SIGSTOP) one, a
SIGKILLed one, no leader, and a lagging queue. Workers are real subprocesses."""

from __future__ import annotations

import io
import json
import signal
import socket
from collections.abc import Callable
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.test import Client

import awa_django
from awa_django.exceptions import InvalidOptionError
from awa_django.operator import queue_pause
from awa_django.telemetry.health import LagThresholds, check_health, parse_lag_thresholds
from tests.jobs import observability as obsjobs
from tests.jobs import worker_env
from tests.support.polling import wait_for
from tests.support.processes import ManagedProcess

pytestmark = [pytest.mark.usefixtures("clean_awa")]

Start = Callable[..., ManagedProcess]
HOST = socket.gethostname()


def health(*args: str) -> tuple[int, str, str]:
    """``awa_health`` in this process: (exit status, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    try:
        call_command("awa_health", *args, stdout=out, stderr=err)
    except SystemExit as exc:
        return int(exc.code or 0), out.getvalue(), err.getvalue()
    return 0, out.getvalue(), err.getvalue()


def worker(start: Start, *args: str) -> ManagedProcess:
    env = worker_env(obsjobs)
    return start("awa_worker", "--queue", "obs", *args, extra_env=env)


def view(client: Client, query: str = "") -> tuple[int, dict[str, Any]]:
    response = client.get(f"/awa/health/{query}")
    return response.status_code, response.json()


def test_lag_thresholds_parse_and_refuse_bad_values() -> None:
    assert parse_lag_thresholds([]) == LagThresholds()
    assert not parse_lag_thresholds([])
    parsed = parse_lag_thresholds(["60", "emails=300", "a.b-c_d=0.5"])
    assert (parsed.default, dict(parsed.per_queue)) == (60.0, {"emails": 300.0, "a.b-c_d": 0.5})
    assert parsed.limit("emails") == 300.0 and parsed.limit("other") == 60.0
    assert parse_lag_thresholds(["q=1"]).limit("other") is None
    for bad in ("0", "-1", "nan", "inf", "x", "Bad Queue=3", "=3", "q=", "q=1e400"):
        with pytest.raises(InvalidOptionError, match="max_lag"):
            parse_lag_thresholds([bad])


@pytest.mark.django_db(transaction=True)
def test_bad_arguments_are_refused_before_anything_runs() -> None:
    for args in (["--max-lag", "soon"], ["--stale-after", "0"], ["--host", "a\x00b"]):
        with pytest.raises(CommandError):
            call_command("awa_health", *args)
    with pytest.raises(InvalidOptionError, match="stale_after"):
        check_health(stale_after=-1)
    assert Client().get("/awa/health/?leader=maybe").status_code == 400
    assert Client().get("/awa/health/?max_lag=never").status_code == 400
    assert Client().post("/awa/health/").status_code == 405


@pytest.mark.worker
def test_live_then_frozen_then_killed_worker(manage_py: Start) -> None:
    client = Client()
    proc = worker(manage_py)
    status, out, _ = wait_for(
        lambda: (r := health())[0] == 0 and r,
        timeout=30,
        message=lambda: f"a healthy report; last: {health()}\n{proc.output()}",
    )
    assert out.startswith(f"ok: 1 worker(s) on host {HOST} seen"), out
    assert "; leader " in out
    assert view(client, f"?host={HOST}")[0] == 200
    code, body = view(client)  # the leader check only, by default
    assert (code, body["status"], list(body["checks"])) == (200, "ok", ["leader"]), body
    assert body["checks"]["leader"]["detail"].startswith("leader "), body
    # Frozen: the process lives on, its connections too (the leader lock stays held), but its
    # event loop runs no more: it stops being seen.
    proc.send_signal(signal.SIGSTOP)
    try:
        status, out, err = wait_for(
            lambda: (r := health())[0] == 1 and r,
            timeout=30,
            message=lambda: f"a failing report; last: {health()}",
        )
        assert out == ""
        assert err.count("\n") == 1 and err.startswith("unhealthy: "), err
        assert f"no worker on host {HOST} seen in the last 2 s" in err
        assert "the leader lock is held, but the leader" in err
        code, body = view(client, f"?host={HOST}")
        assert code == 503 and body["status"] == "unhealthy"
        assert not body["checks"]["worker"]["ok"] and not body["checks"]["leader"]["ok"]
    finally:
        proc.kill()  # SIGKILL: its connections close, the leader lock goes with them
    status, out, err = wait_for(
        lambda: "no leader (" in (r := health())[2] and r,
        timeout=30,
        message=lambda: f"no leader; last: {health()}",
    )
    assert status == 1 and err.count("\n") == 1
    assert f"no worker on host {HOST} seen in the last 2 s" in err
    assert view(client)[0] == 503
    # The same from the command line: status 1, one line.
    probe = manage_py("awa_health")
    assert probe.wait(60) == 1
    assert probe.output().count("\n") == 1 and probe.output().startswith("unhealthy: ")


@pytest.mark.worker
def test_no_leader_fails_unless_skipped(manage_py: Start) -> None:
    proc = worker(manage_py, "--no-maintenance")
    wait_for(
        lambda: health("--no-leader")[0] == 0,
        timeout=30,
        message=lambda: f"the worker to be seen; {health('--no-leader')}\n{proc.output()}",
    )
    status, _, err = health()
    assert status == 1
    assert err == "unhealthy: no leader (no process holds the maintenance lock)\n"
    assert health("--no-leader")[0] == 0
    assert health("--no-leader", "--host", "elsewhere.example")[2] == (
        "unhealthy: no worker registered on host elsewhere.example\n"
    )
    assert view(Client(), "?leader=0") == (
        200,
        {"status": "ok", "checks": {"database": {"ok": True, "detail": "database reachable"}}},
    )


@pytest.mark.django_db(transaction=True)
def test_a_lagging_queue_fails_past_its_threshold_and_a_paused_one_does_not() -> None:
    only_lag = ("--no-worker", "--no-leader")
    assert health(*only_lag, "--max-lag", "0.2") == (
        0,
        "ok: no queue is waiting\n",
        "",
    )
    awa_django.enqueue("tests.jobs.common.noop", queue="lagging")
    _, _, err = wait_for(
        lambda: (r := health(*only_lag, "--max-lag", "0.2"))[0] == 1 and r,
        timeout=10,
        message="the queue to lag",
    )
    assert err.startswith("unhealthy: queue lag over the limit: lagging "), err
    assert err.rstrip().endswith("s > 0.2 s")
    # A queue's own threshold wins over the default; a queue without one, with no default,
    # is not checked.
    ok = health(*only_lag, "--max-lag", "0.2", "--max-lag", "lagging=3600")
    assert ok[0] == 0 and ok[1].startswith("ok: lag within limits (highest: lagging "), ok
    assert health(*only_lag, "--max-lag", "other=0.2")[0] == 0
    code, body = view(Client(), "?leader=0&max_lag=0.2")
    assert code == 503 and not body["checks"]["lag"]["ok"]
    assert view(Client(), "?leader=0&max_lag=0.2&max_lag=lagging=3600")[0] == 200
    # Paused: its jobs wait on purpose.
    queue_pause("lagging")
    assert health(*only_lag, "--max-lag", "0.2")[0] == 0
    data = json.loads(health(*only_lag, "--max-lag", "0.2", "--json")[1])
    assert data == {
        "status": "ok",
        "checks": {"lag": {"ok": True, "detail": "no queue is waiting"}},
    }
