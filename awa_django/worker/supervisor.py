"""``awa_worker --processes N``: N worker processes under one supervisor.

The supervisor starts each child as the same management command with the same options (so
each child knows the fleet is ``--processes N`` strong), plus ``--supervised``: run one worker
process. It forwards SIGTERM and SIGINT to every child (a second signal is forwarded too, so
children exit at once), restarts a child that dies unexpectedly with exponential backoff (1 s
doubling to 30 s, reset once a child has run for a minute) and exits when every child has
exited after a stop: 0 when they all exited 0. In burst mode a child that exits 0 is not
restarted.

A child that does not exit within ``2 * SHUTDOWN_TIMEOUT + 15`` seconds of a stop (a stopped
or wedged process) is continued and killed (its attempts are rescued), and the supervisor exits
1. Each child gets SIGTERM from the kernel if the supervisor itself dies (even by SIGKILL), so
no worker outlives it as an orphan.

The children form a *family*: the supervisor makes a lock file for it (``AWA_WORKER_FAMILY``)
through which one child at a time answers NOTIFY wake-ups (awa_django/worker/family.py).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence

from awa_django.worker.family import FAMILY_ENV, FAMILY_PREFIX, sweep_family_files

__all__ = ["Supervisor", "child_command", "die_with_parent", "launcher"]

log = logging.getLogger("awa_django.worker")

_BACKOFF_MAX = 30.0
_HEALTHY_AFTER = 60.0
_PR_SET_PDEATHSIG = 1


def launcher(
    command: str,
    *,
    from_command_line: bool,
    argv: Sequence[str] | None = None,
    orig_argv: Sequence[str] | None = None,
) -> list[str]:
    """How to start ``manage.py <command>`` again: the interpreter's command line up to the
    command's name when this process was started as ``… <command> …`` (``python manage.py``,
    ``python -m django``, ``django-admin``, with the same interpreter options), else
    ``python -m django`` (a command called from code, with ``call_command``)."""
    argv = list(sys.argv if argv is None else argv)
    orig = list(sys.orig_argv if orig_argv is None else orig_argv)
    if from_command_line and argv[1:2] == [command] and len(orig) >= len(argv):
        return [sys.executable, *orig[1 : len(orig) - (len(argv) - 1)]]
    return [sys.executable, "-m", "django"]


def child_command(launch: Sequence[str], command: str, options: Sequence[str]) -> list[str]:
    """The command line of one child: ``launch``, ``command`` and ``options`` (the parent's
    own options, ``--processes N`` included), then ``--supervised`` (run one worker process,
    one of N)."""
    return [*launch, command, *options, "--supervised"]


class Supervisor:
    """Runs ``count`` copies of ``command`` until stopped (see the module docstring)."""

    def __init__(
        self,
        command: list[str],
        count: int,
        *,
        burst: bool = False,
        stop_timeout: float = 75.0,
        env: dict[str, str] | None = None,
    ) -> None:
        self.command = command
        self.env = env
        self.count = count
        self.burst = burst
        self.stop_timeout = stop_timeout
        self.stop_deadline: float | None = None
        self.children: dict[int, subprocess.Popen[bytes]] = {}
        self.started_at: dict[int, float] = {}
        self.backoff: dict[int, float] = {}
        self.restart_at: dict[int, float] = {}
        self.stopping = False
        self.signals = 0
        self.codes: dict[int, int] = {}
        self.family = ""

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        # The family's lock file: one child at a time answers NOTIFY (worker/family.py).
        sweep_family_files()
        try:
            handle, self.family = tempfile.mkstemp(prefix=f"{FAMILY_PREFIX}{os.getpid()}-")
            os.close(handle)
        except OSError as exc:
            log.warning("awa supervisor: no family lock file (%s); every child answers NOTIFY", exc)
        try:
            return self._supervise()
        finally:
            if self.family:
                with contextlib.suppress(OSError):
                    os.unlink(self.family)

    def _supervise(self) -> int:
        for slot in range(self.count):
            self._spawn(slot)
        while self.children or (self.restart_at and not self.stopping):
            self._reap()
            now = time.monotonic()
            for slot, when in list(self.restart_at.items()):
                if now >= when and not self.stopping:
                    del self.restart_at[slot]
                    self._spawn(slot)
            if self.stop_deadline is not None and now > self.stop_deadline and self.children:
                self._kill_stragglers()
            time.sleep(0.05)
        return 0 if all(code == 0 for code in self.codes.values()) else 1

    def _kill_stragglers(self) -> None:
        for slot, proc in list(self.children.items()):
            log.error(
                "awa supervisor: worker %d (pid %d) did not stop within %.0f s; killing it "
                "(its attempts will be rescued)",
                slot,
                proc.pid,
                self.stop_timeout,
            )
            for sig in (signal.SIGCONT, signal.SIGKILL):
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(sig)
            proc.wait()
            del self.children[slot]
            self.codes[slot] = -signal.SIGKILL

    def _spawn(self, slot: int) -> None:
        env = {**os.environ, **(self.env or {}), "AWA_WORKER_SLOT": str(slot)}
        env[FAMILY_ENV] = self.family
        proc = subprocess.Popen(self.command, env=env, preexec_fn=die_with_parent)
        self.children[slot] = proc
        self.started_at[slot] = time.monotonic()
        log.info("awa supervisor: started worker %d (pid %d)", slot, proc.pid)

    def _reap(self) -> None:
        for slot, proc in list(self.children.items()):
            code = proc.poll()
            if code is None:
                continue
            del self.children[slot]
            self.codes[slot] = code
            if self.stopping or (self.burst and code == 0):
                continue
            ran = time.monotonic() - self.started_at[slot]
            delay = (
                1.0 if ran >= _HEALTHY_AFTER else min(self.backoff.get(slot, 0.5) * 2, _BACKOFF_MAX)
            )
            self.backoff[slot] = delay
            self.restart_at[slot] = time.monotonic() + delay
            log.warning(
                "awa supervisor: worker %d (pid %d) exited with %d after %.1f s; "
                "restarting in %.0f s",
                slot,
                proc.pid,
                code,
                ran,
                delay,
            )

    def _on_signal(self, signum: int, frame: object) -> None:
        self.signals += 1
        self.stopping = True
        if self.stop_deadline is None:
            self.stop_deadline = time.monotonic() + self.stop_timeout
        self.restart_at.clear()
        for proc in self.children.values():
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signum)


def die_with_parent() -> None:
    """Ask Linux to send this process SIGTERM when its parent dies (a supervisor's
    ``preexec_fn``; the worker of ``--reload``)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
