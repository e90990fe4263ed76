"""``awa_worker --processes N``: N worker processes under one supervisor.

The supervisor starts each child as ``<the same command> --processes 1``, forwards SIGTERM and
SIGINT to every child (a second signal is forwarded too, so children exit at once), restarts a
child that dies unexpectedly with exponential backoff (1 s doubling to 30 s, reset once a child
has run for a minute) and exits when every child has exited after a stop: 0 when they all exited
0. In burst mode a child that exits 0 is not restarted.

A child that does not exit within ``2 * SHUTDOWN_TIMEOUT + 15`` seconds of a stop (a stopped
or wedged process) is continued and killed (its attempts are rescued), and the supervisor exits
1. Each child gets SIGTERM from the kernel if the supervisor itself dies (even by SIGKILL), so
no worker outlives it as an orphan.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence

__all__ = ["Supervisor", "child_command"]

log = logging.getLogger("awa_django.worker")

_BACKOFF_MAX = 30.0
_HEALTHY_AFTER = 60.0
_PR_SET_PDEATHSIG = 1


def child_command(argv: Sequence[str]) -> list[str]:
    """The command line of one child: this command again with ``--processes 1``.

    ``argv`` is the interpreter's original command line (``sys.orig_argv``), so ``python -m
    django …`` and ``python manage.py …`` are both repeated faithfully.
    """
    args = list(argv[1:])
    out: list[str] = []
    skip = False
    for index, arg in enumerate(args):
        if skip:
            skip = False
            continue
        if arg == "--processes":
            skip = index + 1 < len(args)
            continue
        if arg.startswith("--processes="):
            continue
        out.append(arg)
    return [sys.executable, *out, "--processes", "1"]


class Supervisor:
    """Runs ``count`` copies of ``command`` until stopped (see the module docstring)."""

    def __init__(
        self,
        command: list[str],
        count: int,
        *,
        burst: bool = False,
        stop_timeout: float = 75.0,
    ) -> None:
        self.command = command
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

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
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
        env = {**os.environ, "AWA_WORKER_SLOT": str(slot), "AWA_WORKER_PROCESSES": str(self.count)}
        proc = subprocess.Popen(self.command, env=env, preexec_fn=_die_with_parent)
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


def _die_with_parent() -> None:
    """``preexec_fn``: ask Linux to send this child SIGTERM when the supervisor dies."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
