"""Helpers for tests: polling with a deadline, subprocess handles, database URLs and
connections. Functions that build data (jobs, users, clients) are in tests/factories.py."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote, urlencode, urlsplit

import psycopg

T = TypeVar("T")

REPO = Path(__file__).resolve().parent.parent

#: The pgbouncer lane: the tests' Django connections go through PgBouncer in transaction
#: pooling mode (tests/conftest.py); ``AWA_TEST_DIRECT_URL`` is the server's own address.
PGBOUNCER = os.environ.get("AWA_TEST_PGBOUNCER") == "1"


class WaitTimeout(AssertionError):
    """A condition polled by :func:`wait_for` did not hold before its deadline."""


def wait_for(
    predicate: Callable[[], T],
    *,
    timeout: float = 10.0,
    interval: float = 0.05,
    message: str | Callable[[], str] = "the condition",
) -> T:
    """Poll ``predicate`` until it returns something truthy, and return that.

    This is the one place in the test suite that sleeps. Tests wait on observable state (a row,
    a process exit, a file), never for a fixed time. ``message`` (or a callable producing it,
    e.g. to include a subprocess's output) says what was awaited if the deadline passes.
    """
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() >= deadline:
            text = message() if callable(message) else message
            raise WaitTimeout(f"timed out after {timeout:g}s waiting for {text}")
        time.sleep(interval)


class ManagedProcess:
    """A subprocess started by the ``manage_py`` fixture, in its own process group."""

    def __init__(self, proc: subprocess.Popen[bytes], log_path: Path, argv: Sequence[str]):
        self.proc = proc
        self.log_path = log_path
        self.argv = list(argv)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def output(self) -> str:
        """Everything the process wrote so far (stdout and stderr, interleaved)."""
        return self.log_path.read_text(errors="replace")

    def send_signal(self, sig: int) -> None:
        """Signal the process itself (not its group), as a supervisor or ``kill`` would."""
        self.proc.send_signal(sig)

    def wait(self, timeout: float = 30.0) -> int:
        """Wait for the exit status; fail the test with the output if it takes too long."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise WaitTimeout(
                f"{' '.join(self.argv)} still running after {timeout:g}s; output:\n{self.output()}"
            ) from None

    def kill(self) -> None:
        """SIGKILL the whole process group and reap the process."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


def database_url(settings_dict: Mapping[str, Any]) -> str:
    """A ``postgresql://`` URL for a Django DATABASES entry (the inverse of django-environ)."""
    user = quote(str(settings_dict.get("USER") or ""), safe="")
    password = str(settings_dict.get("PASSWORD") or "")
    host = str(settings_dict.get("HOST") or "")
    port = str(settings_dict.get("PORT") or "")
    name = str(settings_dict["NAME"])
    auth = user + (f":{quote(password, safe='')}" if password else "")
    if host.startswith("/"):
        # A Unix socket directory: django-environ reads it from a path that starts with "/".
        host, name = "", f"{host}/{name}"
    netloc = (f"{auth}@" if auth else "") + host + (f":{port}" if port else "")
    url = f"postgresql://{netloc}/{quote(name, safe='')}"
    options = {
        k: v for k, v in (settings_dict.get("OPTIONS") or {}).items() if isinstance(v, str | int)
    }
    return f"{url}?{urlencode(options)}" if options else url


def conninfo(alias: str = "default") -> str:
    """psycopg conninfo for the (test) database behind ``alias`` (on the server itself, not
    through PgBouncer, when the pgbouncer lane runs: see tests/conftest.py)."""
    from django.db import connections

    s = connections[alias].settings_dict
    host, port = s.get("HOST"), s.get("PORT")
    direct = os.environ.get("AWA_TEST_DIRECT_URL")
    if direct:
        # Under PgBouncer (the pgbouncer lane): the test's own observers connect to the server
        # directly; only the code under test goes through the pooler.
        parts = urlsplit(direct)
        host, port = parts.hostname, parts.port
    return psycopg.conninfo.make_conninfo(
        dbname=s["NAME"],
        user=s.get("USER") or None,
        password=s.get("PASSWORD") or None,
        host=host or None,
        port=str(port) if port else None,
        options=(s.get("OPTIONS") or {}).get("options"),  # -c jit=off, as in tests/settings.py
    )


@contextlib.contextmanager
def pg(autocommit: bool = True) -> Iterator[psycopg.Connection[Any]]:
    """A fresh psycopg connection to the test database (worker-style), closed on exit."""
    conn = psycopg.connect(conninfo(), autocommit=autocommit)
    try:
        yield conn
    finally:
        conn.close()


_handler_local = threading.local()


def handler_conn() -> psycopg.Connection[Any]:
    """A job handler's own autocommit connection to the test database (``DATABASE_URL`` of the
    worker process), one per thread, opened again if it was closed: handlers of the tests' job
    modules record what they do over it, committed at once."""
    conn: psycopg.Connection[Any] | None = getattr(_handler_local, "conn", None)
    if conn is None or conn.closed:
        conn = psycopg.connect(os.environ["DATABASE_URL"].split("?", 1)[0], autocommit=True)
        _handler_local.conn = conn
    return conn
