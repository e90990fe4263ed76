"""The chaos lane's PostgreSQL: its own embedded cluster in ``.pgdata/chaos/data`` that it may
restart (fast or immediate) on the same port, or the server of ``DATABASE_URL`` (no restarts).

``scripts/pgserver.py`` starts the cluster; a restart stops the postmaster with SIGINT (fast) or
SIGQUIT (immediate) and starts it again with the command line PostgreSQL recorded in
``postmaster.opts``, so the port, socket and settings stay the same.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import sql

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))
import pgserver  # type: ignore[import-not-found]  # noqa: E402

__all__ = ["Cluster", "url_for_database"]

_PR_SET_PDEATHSIG = 1
_READY_TIMEOUT = 60.0


def url_for_database(url: str, database: str) -> str:
    """``url`` with its database name replaced."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{database}"))


class Cluster:
    """The server the chaos runs use; ``restartable`` is False for ``DATABASE_URL``."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir.resolve()
        self.server: Any = None
        self.url = ""
        self.restartable = False

    def start(self) -> str:
        """Start (or adopt ``DATABASE_URL``) and return the URL of its maintenance database."""
        env_url = os.environ.get("DATABASE_URL", "")
        if env_url:
            self.url = env_url
            return env_url
        # fsync off is safe here (the machine does not crash, only PostgreSQL does), but
        # synchronous_commit must stay on: an immediate shutdown would otherwise lose commits
        # the harness was told about (and reuse their job ids).
        self.server = pgserver.start_server(
            self.data_dir, fsync=False, settings={"synchronous_commit": "on"}
        )
        self.url = self.server.url
        self.restartable = True
        return self.url

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None

    def create_database(self, name: str) -> str:
        """Drop and create database ``name``; return its URL."""
        with psycopg.connect(self.url, autocommit=True, connect_timeout=5) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return url_for_database(self.url, name)

    def drop_database(self, name: str) -> None:
        with psycopg.connect(self.url, autocommit=True, connect_timeout=5) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )

    def restart(self, mode: str, *, downtime: float = 0.0) -> None:
        """Stop the postmaster in ``mode`` (``fast`` or ``immediate``), stay down for
        ``downtime`` seconds, and start it again."""
        assert self.restartable and self.server is not None
        command = shlex.split((self.data_dir / "postmaster.opts").read_text())
        process: subprocess.Popen[bytes] = self.server.process
        process.send_signal(signal.SIGINT if mode == "fast" else signal.SIGQUIT)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        deadline = time.monotonic() + 10
        while pgserver.server_processes(self.data_dir) and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(downtime)
        self.server.process = self._launch(command)

    def _launch(self, command: list[str]) -> subprocess.Popen[bytes]:
        account = self._account()
        with (self.data_dir / "server.log").open("ab") as log:
            process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd="/",
                start_new_session=True,
                user=account[0] if account else None,
                group=account[1] if account else None,
                extra_groups=[] if account else None,
                preexec_fn=_die_with_parent,
            )
        deadline = time.monotonic() + _READY_TIMEOUT
        while not self._ready(process.pid):
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"PostgreSQL did not restart; see {self.data_dir}/server.log")
            time.sleep(0.02)
        return process

    def _account(self) -> tuple[int, int] | None:
        """Run as the data dir's owner when we are root (PostgreSQL refuses root)."""
        if os.geteuid() != 0:
            return None
        st = self.data_dir.stat()
        return st.st_uid, st.st_gid

    def _ready(self, pid: int) -> bool:
        with contextlib.suppress(OSError):
            lines = (self.data_dir / "postmaster.pid").read_text().splitlines()
            return len(lines) >= 8 and lines[0].strip() == str(pid) and lines[7].strip() == "ready"
        return False


def _die_with_parent() -> None:
    """Fast shutdown of the postmaster if the driver dies (as pgserver does)."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGINT)
