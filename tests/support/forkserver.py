"""A fork server for the ``manage_py`` fixture: management commands started in about 10 ms.

``python -m django awa_worker`` spends about 0.45 CPU seconds importing Django, psycopg and
awa_django before it does anything, and the worker tests start about 500 such processes. The
fork server is one process per test session that imports all that once (``django.setup()``
with no job modules, the commands, the worker, the URLconf; no database connection) and then
forks a child per command. The child is what ``python -m django <args>`` would be:

* its own session (``start_new_session``), stdin from /dev/null, stdout and stderr to the
  command's log file, the working directory and the whole environment it was asked for;
* ``AWA`` rebuilt from tests/settings.py's ``AWA_BASE`` and the child's ``AWA_TEST_OVERRIDES``
  (Django's ``setting_changed`` drops awa_django's cached settings), then its job modules
  imported, as ``ready()`` does in a process of its own;
* ``sys.argv`` and ``sys.orig_argv`` those of ``python -m django <args>`` (a supervisor starts
  its children with the same command line);
* its exit status: the command's, after the exit handlers and non-daemon threads, as at
  interpreter exit.

The server is the children's parent, so it reaps them and reports their exit status; the
``ForkedProcess`` handle asks it (a line of JSON each way over a Unix socket), and signals the
child directly. A command whose environment differs from the server's in anything but
``AWA_TEST_OVERRIDES`` and ``PYTEST_CURRENT_TEST`` (another ``DATABASE_URL``, another settings
module, a variable a test set), or whose overrides set ``AWA["SCHEMA"]`` (read once per
process, when the models are imported), is started with ``subprocess.Popen`` as before, and
so is every command when ``AWA_TEST_FORKSERVER=0``.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, BinaryIO

__all__ = ["ForkServer", "ForkedProcess", "enabled"]

#: Set to 0 to start every command with subprocess.Popen (to rule the fork server out).
ENV = "AWA_TEST_FORKSERVER"
#: The variable a forked command may set differently from the server (and pytest's own, which
#: names the current test).
_OVERRIDES = "AWA_TEST_OVERRIDES"
_FREE = frozenset({_OVERRIDES, "PYTEST_CURRENT_TEST"})


def enabled() -> bool:
    """Whether ``manage_py`` may fork its commands (``AWA_TEST_FORKSERVER`` is not 0)."""
    return os.environ.get(ENV, "1") != "0"


# -- the client, in the pytest process --------------------------------------------------------


class ForkServer:
    """A running fork server for one environment (``env``, without ``AWA_TEST_OVERRIDES``)."""

    def __init__(self, env: Mapping[str, str], cwd: Path, log_path: Path) -> None:
        self.env = {k: v for k, v in env.items() if k not in _FREE}
        self._dir = tempfile.mkdtemp(prefix="awa-forkserver-")
        path = os.path.join(self._dir, "socket")
        with log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tests.support.forkserver", path],
                cwd=cwd,
                env={**self.env, _OVERRIDES: json.dumps({"JOB_MODULES": []})},
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.log_path = log_path
        self._lock = threading.Lock()
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        deadline = time.monotonic() + 60
        while True:
            try:
                self._sock.connect(path)
                break
            except (FileNotFoundError, ConnectionRefusedError):
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"the fork server did not start:\n{log_path.read_text(errors='replace')}"
                    ) from None
                time.sleep(0.02)
        self._file: BinaryIO = self._sock.makefile("rwb")

    def matches(self, env: Mapping[str, str]) -> bool:
        """Whether a command with environment ``env`` can be forked from this server: not one
        whose ``AWA`` names another schema, which the preloaded models were named with."""
        return {k: v for k, v in env.items() if k not in _FREE} == self.env and not (
            own_schema(env)
        )

    def _ask(self, request: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            self._file.write(json.dumps(request).encode() + b"\n")
            self._file.flush()
            line = self._file.readline()
        if not line:
            raise RuntimeError(
                f"the fork server ended:\n{self.log_path.read_text(errors='replace')}"
            )
        answer: dict[str, Any] = json.loads(line)
        if "error" in answer:
            raise RuntimeError(f"the fork server failed: {answer['error']}")
        return answer

    def spawn(
        self, args: Sequence[str], env: Mapping[str, str], cwd: Path, log_path: Path
    ) -> ForkedProcess:
        """Start ``python -m django <args>`` as a child of the server."""
        answer = self._ask(
            {
                "op": "spawn",
                "args": list(args),
                "env": dict(env),
                "cwd": str(cwd),
                "log": str(log_path),
            }
        )
        return ForkedProcess(self, int(answer["pid"]))

    def exit_code(self, pid: int) -> int | None:
        """The exit status of child ``pid`` (as ``Popen.returncode``), None while it runs."""
        code = self._ask({"op": "poll", "pid": pid})["code"]
        return None if code is None else int(code)

    def close(self) -> None:
        """Stop the server (its children were killed by the fixture's teardown)."""
        with contextlib.suppress(OSError):
            self._file.close()
            self._sock.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(self._dir, "socket"))
            os.rmdir(self._dir)


class ForkedProcess:
    """What the tests use of ``subprocess.Popen``, for a child of the fork server."""

    def __init__(self, server: ForkServer, pid: int) -> None:
        self.server = server
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.server.exit_code(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(["python", "-m", "django"], timeout or 0)
            time.sleep(0.01)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


# -- the server -------------------------------------------------------------------------------


def own_schema(env: Mapping[str, str]) -> bool:
    """Whether ``env``'s ``AWA_TEST_OVERRIDES`` sets ``AWA["SCHEMA"]``: a process of its own."""
    return "SCHEMA" in json.loads(env.get(_OVERRIDES) or "{}")


def _preload() -> None:
    """Import what a command imports, before any fork (no database connection is opened)."""
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import get_commands
    from django.urls import get_resolver

    import awa_django.management.commands.awa_maintenance
    import awa_django.management.commands.awa_worker
    import awa_django.worker.runtime
    import awa_django.worker.supervisor  # noqa: F401

    get_commands()
    get_resolver(settings.ROOT_URLCONF).url_patterns  # noqa: B018  (imports the URLconf)


def _child(request: dict[str, Any]) -> int:
    """In the forked child: become ``python -m django <args>`` and run it; its exit status."""
    os.setsid()
    log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    os.close(null)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])

    import django
    from django.conf import settings
    from django.core.management import execute_from_command_line
    from django.core.signals import setting_changed

    import tests.settings
    from awa_django.jobs import autodiscover_jobs

    args = list(request["args"])
    sys.argv = [os.path.join(os.path.dirname(django.__file__), "__main__.py"), *args]
    sys.orig_argv = [sys.executable, "-m", "django", *args]
    code = 0
    try:
        # What django.setup() does with this process's settings (AWA read, job modules
        # imported), then the command; an error is printed as the interpreter would.
        awa = {**tests.settings.AWA_BASE, **json.loads(os.environ.get(_OVERRIDES) or "{}")}
        settings.AWA = awa
        setting_changed.send(sender=type(settings), setting="AWA", value=awa, enter=True)
        autodiscover_jobs()
        execute_from_command_line(sys.argv)
    except SystemExit as exc:
        if exc.code is None:
            code = 0
        elif isinstance(exc.code, int):
            code = exc.code
        else:
            print(exc.code, file=sys.stderr)
            code = 1
    except BaseException:
        traceback.print_exc()
        code = 1
    # What the interpreter does at exit: join non-daemon threads, run the exit handlers.
    with contextlib.suppress(BaseException):
        threading._shutdown()  # type: ignore[attr-defined]
    with contextlib.suppress(BaseException):
        atexit._run_exitfuncs()
    return code


def _serve(path: str) -> None:
    _preload()
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(1)
    conn, _ = server.accept()
    stream = conn.makefile("rwb")
    codes: dict[int, int] = {}

    def reap() -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            codes[pid] = os.waitstatus_to_exitcode(status)

    for line in stream:
        request = json.loads(line)
        try:
            reap()
            if request["op"] == "spawn":
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    code = 1
                    try:
                        stream.close()
                        conn.close()
                        server.close()
                        code = _child(request)
                    finally:
                        with contextlib.suppress(BaseException):
                            sys.stdout.flush()
                            sys.stderr.flush()
                        os._exit(code)
                answer: dict[str, Any] = {"pid": pid}
            else:
                answer = {"code": codes.get(int(request["pid"]))}
        except Exception as exc:
            answer = {"error": f"{type(exc).__name__}: {exc}"}
        stream.write(json.dumps(answer).encode() + b"\n")
        stream.flush()


if __name__ == "__main__":
    _serve(sys.argv[1])
