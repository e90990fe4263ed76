"""A throwaway PgBouncer in transaction pooling mode, in front of a PostgreSQL server.

The ``pgbouncer`` lane of scripts/test and tests/conftest.py (with ``AWA_TEST_PGBOUNCER=1``) use
it to run the producer tests through a real pooler. The binary is Debian's ``pgbouncer``
package (``/usr/sbin/pgbouncer``, 1.18 on Debian 12: no prepared statements in transaction
mode, so clients must not prepare; Django's psycopg backend does not by default).

Guarantees:

- :func:`start` returns once PgBouncer accepts TCP connections on ``127.0.0.1`` (a free port,
  retried if taken between choosing and binding), with a configuration of its own in a new
  temporary directory: every database name is forwarded to the server (``* = host= port=``),
  ``auth_type = trust`` for the server URL's user (the test servers trust local connections),
  ``pool_mode = transaction``, ``default_pool_size`` server connections per database and user;
  that user may read the admin console (``stats_users``: ``SHOW CONFIG``, ``SHOW POOLS``).
- The startup parameter ``options`` (Django's ``OPTIONS["options"]``, e.g. ``-c jit=off``) is
  ignored, not refused: PgBouncer cannot apply it per transaction.
- PgBouncer refuses to run as root; as root it runs as pgserver's service user (``awa_pg``).
- It is a child of the calling process and gets SIGTERM if that process dies; stopping waits
  for it to exit and removes its directory.

Runnable too: ``python scripts/pgbouncer.py run --server URL`` prints the pooler's URL (same
user and database) and serves until SIGTERM, SIGINT or SIGHUP, or until its parent dies. Uses
only the standard library and scripts/pgserver.py.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pgserver  # scripts/ is on sys.path: run as a script, or from pytest (pyproject.toml)

HOST = "127.0.0.1"
BINARY_CANDIDATES = ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer")
DEFAULT_POOL_SIZE = 4
_START_ATTEMPTS = 3
_START_TIMEOUT = 20.0


class PgBouncerError(RuntimeError):
    """PgBouncer is missing or could not be started."""


def binary() -> str | None:
    """The pgbouncer executable, or None if it is not installed."""
    found = shutil.which("pgbouncer")
    if found:
        return found
    return next((path for path in BINARY_CANDIDATES if os.access(path, os.X_OK)), None)


class Bouncer:
    """A running PgBouncer that is a child of this process."""

    def __init__(self, process: subprocess.Popen[bytes], directory: Path, port: int, user: str):
        self.process = process
        self.directory = directory
        self.port = port
        self.user = user
        self._stopped = False

    def url(self, database: str) -> str:
        """A ``postgresql://`` URL of ``database`` through the pooler."""
        return f"postgresql://{self.user}@{HOST}:{self.port}/{database}"

    def log(self) -> str:
        """What PgBouncer logged so far."""
        try:
            return (self.directory / "pgbouncer.log").read_text(errors="replace")
        except OSError:
            return ""

    def stop(self, timeout: float = 10.0) -> None:
        """SIGINT (PgBouncer's immediate shutdown: its server connections close, so the
        databases behind it can be dropped at once), then SIGKILL. Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        for signum, grace in ((signal.SIGINT, timeout), (signal.SIGKILL, 5.0)):
            if self.process.poll() is not None:
                break
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signum)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(grace)
        self.process.wait()
        shutil.rmtree(self.directory, ignore_errors=True)


def _config(
    server_host: str, server_port: int, port: int, directory: Path, pool_size: int, user: str
) -> str:
    return f"""\
[databases]
* = host={server_host} port={server_port}

[pgbouncer]
listen_addr = {HOST}
listen_port = {port}
unix_socket_dir =
auth_type = trust
auth_file = {directory / "userlist.txt"}
pool_mode = transaction
default_pool_size = {pool_size}
min_pool_size = 0
reserve_pool_size = 0
max_client_conn = 500
ignore_startup_parameters = extra_float_digits,options
query_wait_timeout = 30
stats_users = {user}
logfile = {directory / "pgbouncer.log"}
"""


def start(server_url: str, *, pool_size: int = DEFAULT_POOL_SIZE) -> Bouncer:
    """Start PgBouncer in transaction mode in front of the server of ``server_url`` (a
    ``postgresql://user@host:port/db`` URL; the password, if any, is not used)."""
    exe = binary()
    if exe is None:
        raise PgBouncerError("pgbouncer is not installed (Debian: apt-get install pgbouncer)")
    parts = urlsplit(server_url)
    user = parts.username or pgserver.SUPERUSER
    server_host = parts.hostname or HOST
    server_port = parts.port or 5432
    account = pgserver._service_account()
    log = ""
    for _ in range(_START_ATTEMPTS):
        directory = Path(tempfile.mkdtemp(prefix="awa-pgbouncer-"))
        port = pgserver._free_port()
        (directory / "userlist.txt").write_text(f'"{user}" ""\n')
        ini = directory / "pgbouncer.ini"
        ini.write_text(_config(server_host, server_port, port, directory, pool_size, user))
        if account is not None:
            for path in (directory, *directory.iterdir()):
                os.chown(path, *account)
            pgserver._grant_traverse(directory.parent, account)
        process = subprocess.Popen(
            [exe, str(ini)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd=directory,
            start_new_session=True,
            user=account[0] if account else None,
            group=account[1] if account else None,
            extra_groups=[] if account else None,
            preexec_fn=_parent_death_signal,
        )
        bouncer = Bouncer(process, directory, port, user)
        if _wait_ready(bouncer) and process.poll() is None:
            return bouncer
        log = bouncer.log()
        bouncer.stop()
        if "Address already in use" not in log:
            break
    raise PgBouncerError(f"pgbouncer did not start; its log says:\n{log[-3000:]}")


def _wait_ready(bouncer: Bouncer) -> bool:
    """Wait until ``bouncer`` accepts connections (True) or has exited (False)."""
    return pgserver._wait_until(
        lambda: bouncer.process.poll() is not None or _accepts(bouncer.port), _START_TIMEOUT
    )


def _accepts(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(1.0)
        return sock.connect_ex((HOST, port)) == 0


def _parent_death_signal() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(pgserver._PR_SET_PDEATHSIG, signal.SIGTERM)


def pooled_url(bouncer: Bouncer, server_url: str) -> str:
    """``server_url`` with its host and port replaced by the pooler's."""
    parts = urlsplit(server_url)
    netloc = parts.netloc.rsplit("@", 1)
    auth = f"{netloc[0]}@" if len(netloc) == 2 else ""
    return urlunsplit(parts._replace(netloc=f"{auth}{HOST}:{bouncer.port}"))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run a throwaway PgBouncer (transaction mode).")
    commands = parser.add_subparsers(dest="command", required=True)
    run_cmd = commands.add_parser(
        "run", help="start, print the pooled URL, serve until SIGTERM/SIGINT/SIGHUP"
    )
    run_cmd.add_argument("--server", required=True, help="postgresql:// URL of the server")
    run_cmd.add_argument("--pool-size", type=int, default=DEFAULT_POOL_SIZE)
    commands.add_parser("check", help="exit 0 if pgbouncer is installed, else 1")
    args = parser.parse_args(argv)
    if args.command == "check":
        exe = binary()
        print(exe or "pgbouncer is not installed")
        return 0 if exe else 1

    def leave(signum: int, _frame: object) -> None:
        raise SystemExit(0)

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, leave)
    ctypes.CDLL(None, use_errno=True).prctl(pgserver._PR_SET_PDEATHSIG, signal.SIGTERM)
    try:
        bouncer = start(args.server, pool_size=args.pool_size)
    except PgBouncerError as exc:
        print(f"pgbouncer: {exc}", file=sys.stderr)
        return 1
    atexit.register(bouncer.stop)
    try:
        print(pooled_url(bouncer, args.server), flush=True)
        code = bouncer.process.wait()
        print(f"pgbouncer exited unexpectedly with status {code}:\n{bouncer.log()[-2000:]}")
        return 1
    finally:
        bouncer.stop()


if __name__ == "__main__":
    sys.exit(main())
