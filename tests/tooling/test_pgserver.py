"""scripts/pgserver.py: the embedded PostgreSQL used by the tests and the demo."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pgserver
import psycopg
import pytest
from django.db import connection

from tests.support.polling import wait_for
from tests.support.processes import REPO


@pytest.fixture
def scratch_dir() -> Iterator[Path]:
    """A fresh directory under .pgdata (reachable by the server's user, unlike /tmp/pytest-*)."""
    base = REPO / ".pgdata"
    base.mkdir(exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix="scratch-", dir=base))
    yield path
    pgserver.stop(path / "data")
    shutil.rmtree(path, ignore_errors=True)


def is_running(pid: int) -> bool:
    """True while ``pid`` exists and has not exited (a zombie awaiting its reaper has)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def test_start_serves_a_second_server_and_stop_leaves_no_process(
    scratch_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DATABASE_URL", raising=False)
    data_dir = scratch_dir / "data"
    url, stop = pgserver.start(data_dir, fsync=False, database="scratch", stop_at_exit=False)

    assert f":{connection.settings_dict['PORT']}/" not in url  # not the session's server
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT current_setting('server_version_num')::int, current_database()")
        version, database = row.fetchone() or (0, "")
    assert version >= 150000
    assert database == "scratch"
    postmaster = pgserver.postmaster_pid(data_dir)
    processes = pgserver.server_processes(data_dir)
    assert postmaster is not None
    assert postmaster in processes
    assert len(processes) > 1  # checkpointer, walwriter, ...

    stop()

    assert not (data_dir / "postmaster.pid").exists()
    assert [pid for pid in processes if is_running(pid)] == []
    assert pgserver.server_processes(data_dir) == set()
    assert (data_dir / "PG_VERSION").exists()  # kept: not ephemeral
    stop()  # idempotent


def test_a_stale_postmaster_pid_from_a_killed_run_is_cleared(
    scratch_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DATABASE_URL", raising=False)
    data_dir = scratch_dir / "data"
    _, stop_first = pgserver.start(data_dir, fsync=False, stop_at_exit=False)
    first = pgserver.postmaster_pid(data_dir)
    assert first is not None
    try:
        os.kill(first, signal.SIGKILL)  # as if the machine's OOM killer struck
        # SIGKILL is delivered asynchronously; until reaped the postmaster stays a zombie.
        assert wait_for(lambda: not is_running(first), timeout=10)
        assert (data_dir / "postmaster.pid").exists()

        url, stop_second = pgserver.start(data_dir, fsync=False, stop_at_exit=False)
        try:
            with psycopg.connect(url) as conn:
                conn.execute("SELECT 1")
            assert pgserver.postmaster_pid(data_dir) not in (None, first)
            stop_first()  # must not touch the second server
            assert pgserver.postmaster_pid(data_dir) is not None
        finally:
            stop_second()
    finally:
        stop_first()
    assert pgserver.server_processes(data_dir) == set()


def test_a_data_dir_in_use_is_refused(scratch_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DATABASE_URL", raising=False)
    data_dir = scratch_dir / "data"
    url, stop = pgserver.start(data_dir, fsync=False, stop_at_exit=False)
    try:
        with pytest.raises(pgserver.PgServerError, match="is in use by a server started by"):
            pgserver.start(data_dir, fsync=False, stop_at_exit=False)
        with psycopg.connect(url) as conn:
            conn.execute("SELECT 1")  # the first server was left alone
    finally:
        stop()


def test_run_command_server_dies_with_its_parent(scratch_dir: Path) -> None:
    data_dir = scratch_dir / "data"
    runner = subprocess.Popen(
        [
            sys.executable,
            str(REPO / "scripts" / "pgserver.py"),
            "run",
            "--data-dir",
            str(data_dir),
            "--no-fsync",
            "--ephemeral",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert runner.stdout is not None
        url = runner.stdout.readline().strip()
        assert url.startswith("postgresql://postgres@127.0.0.1:")
        postmaster = pgserver.postmaster_pid(data_dir)
        assert postmaster is not None
        runner.kill()  # SIGKILL: no cleanup code runs in the runner
        runner.wait()
        wait_for(
            lambda: not pgserver.server_processes(data_dir),
            timeout=30,
            message=f"the server of {data_dir} to exit after its parent died",
        )
    finally:
        runner.kill()
        runner.wait()
        if runner.stdout is not None:
            runner.stdout.close()


def test_database_url_takes_precedence(scratch_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    existing = "postgresql://someone@db.example.invalid:5433/app"
    monkeypatch.setenv("DATABASE_URL", existing)
    url, stop = pgserver.start(scratch_dir / "never")
    assert url == existing
    assert not (scratch_dir / "never").exists()
    stop()
