"""Which process of an ``awa_worker --processes N`` family answers a NOTIFY.

Every worker process listens on ``awa_jobs``, and PostgreSQL delivers each note to all of them.
If each one claimed on every note, the N processes of a family would race for each job: one
gets it, the others pay a claim that comes back empty, on the same CPUs, at the moment the
winner's handler should start (docs/performance.md, "Latency under load").

So within a family one process, the *leader*, answers plain notes: it holds an exclusive
``flock`` on a file the supervisor made for the family (``AWA_WORKER_FAMILY``), for as long as it
runs and is not stopping. The others ignore plain notes, except to try for the lock (one
non-blocking system call), so that when the leader exits, is killed or stops, the next note
makes another process the leader at once. The leader hands a note on when it cannot take all the
work it may announce: when the note finds it without a free slot for that queue, and after a
claim that filled its batch (more may wait). Handing on is a note on ``awa_jobs`` whose payload
is the queue name behind ``HAND_OFF`` (never a queue name, so workers that predate it ignore
it); non-leaders answer it as they would a plain note, the leader ignores it.

A leader that is alive but frozen (stopped by SIGSTOP, or its event loop held by a handler)
keeps the lock and answers nothing. So the leader writes the time (the system's monotonic clock,
shared by the processes of a host) and its pid at the start of the lock file every half second
(``beat``), and a process that is not the leader answers a plain note itself while that time is
older than ``stale_after`` (four beats, 2 s, in a worker: ``leader_frozen``): wake-ups keep
working, at the price of the family racing for each job until the leader beats again.

Nothing here can lose a job: every process still finds work on its own, through the sweep of
its idle queues, whatever the notes do, and a worker started alone (no family) answers every
note. A family lock file that cannot be opened or locked for another reason than a held lock
makes the process answer every note, as before.

This module holds the family lock (``Family``); awa_django/worker/wakeups.py answers the notes
and hands them on.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import struct
import tempfile
import time

__all__ = ["FAMILY_ENV", "FAMILY_PREFIX", "HAND_OFF", "Family", "sweep_family_files"]

log = logging.getLogger("awa_django.worker")

#: The environment variable naming the family's lock file (set by the supervisor).
FAMILY_ENV = "AWA_WORKER_FAMILY"
#: A family's lock file in the temporary directory: this, the supervisor's pid, ``-``, a suffix.
FAMILY_PREFIX = "awa-family-"
#: The payload prefix of a note handed on by a family's leader (not a queue name character).
HAND_OFF = "+"
#: The leader's beat at the start of the lock file: monotonic time (seconds) and pid.
_BEAT = struct.Struct("<dq")


class Family:
    """This process's place in its family: ``leads()`` tells whether it answers plain notes."""

    def __init__(self, path: str | None, *, stale_after: float = 2.0) -> None:
        """``path``: the family's lock file; None (or empty) for a process on its own, which
        always leads. ``stale_after``: seconds without a beat after which the leader counts as
        frozen."""
        self.path = path or None
        self.stale_after = stale_after
        # The supervisor that made the lock file (this process's parent), which removes it.
        self._parent = os.getppid()
        self._fd: int | None = None
        self._leader = self.path is None
        self._closed = False
        self._frozen = False  # the leader was last seen frozen (logged once per freeze)

    @property
    def alone(self) -> bool:
        """Whether this process has no family (it answers every note, hands nothing on)."""
        return self.path is None

    @property
    def leader(self) -> bool:
        """Whether this process holds the family lock now (tries nothing)."""
        return self._leader and not self._closed

    def leads(self) -> bool:
        """Whether this process answers plain notes: it holds the family lock, or takes it now
        (a non-blocking ``flock``). False once ``release`` was called."""
        if self._leader or self._closed:
            return self._leader and not self._closed
        path = self.path
        assert path is not None
        try:
            if self._fd is None:
                self._fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        except OSError as exc:
            # No usable lock: answer every note, as a process on its own does.
            log.warning(
                "awa worker: family lock %s unusable (%s); this process answers every NOTIFY",
                path,
                exc,
            )
            self._leader = True
            return True
        self._leader = True
        self._frozen = False
        log.info("awa worker pid %s now answers NOTIFY for its family", os.getpid())
        self.beat()
        return True

    def beat(self) -> None:
        """As the leader, write the time and this pid for the others (``leader_frozen``);
        otherwise nothing. Called every half second by the worker's event loop."""
        if not self._leader or self._closed or self._fd is None:
            return
        with contextlib.suppress(OSError):
            os.pwrite(self._fd, _BEAT.pack(time.monotonic(), os.getpid()), 0)

    def leader_frozen(self) -> bool:
        """Whether another process leads but has not beaten for ``stale_after`` seconds (a
        frozen process keeps its lock): then this one should answer plain notes itself. False
        for the leader, a process on its own, or while no beat was ever written."""
        if self._leader or self._closed or self._fd is None:
            return False
        try:
            data = os.pread(self._fd, _BEAT.size, 0)
        except OSError:
            return False
        if len(data) < _BEAT.size:
            return False
        at, pid = _BEAT.unpack(data)
        frozen = bool(time.monotonic() - at > self.stale_after)
        if frozen != self._frozen:
            self._frozen = frozen
            if frozen:
                log.warning(
                    "awa worker pid %s: the family's leader (pid %s) has not beaten for %.1f s "
                    "(stopped, or its event loop blocked); this process answers NOTIFY too "
                    "until it does",
                    os.getpid(),
                    pid,
                    time.monotonic() - at,
                )
            else:
                log.info(
                    "awa worker pid %s: the family's leader (pid %s) beats again", os.getpid(), pid
                )
        return frozen

    def release(self) -> None:
        """Stop answering notes (a graceful stop): another process of the family takes the
        lock with the next note. A process whose supervisor is gone (killed: it never removed
        the lock file) removes the file itself, so that no ``awa-family-*`` file is left in
        the temporary directory."""
        if self.path is not None and os.getppid() != self._parent:
            with contextlib.suppress(OSError):
                os.unlink(self.path)
        self._closed = True
        self._leader = False
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)  # frees the flock
            self._fd = None


def sweep_family_files(directory: str | None = None) -> int:
    """Remove the lock files that families whose supervisor is gone left in ``directory`` (the
    temporary directory by default): a family killed whole (supervisor and children at once)
    removes nothing, so each supervisor sweeps when it starts. Returns how many were removed.
    A file whose supervisor lives, another user's file, and a name without a pid are left."""
    directory = directory or tempfile.gettempdir()
    try:
        names = os.listdir(directory)
    except OSError:
        return 0
    removed = 0
    for name in names:
        pid_text, dash, _ = name.removeprefix(FAMILY_PREFIX).partition("-")
        if not name.startswith(FAMILY_PREFIX) or not dash or not pid_text.isdigit():
            continue
        path = os.path.join(directory, name)
        try:
            if int(pid_text) <= 0 or os.stat(path).st_uid != os.getuid():
                continue
            os.kill(int(pid_text), 0)  # the supervisor lives (or is another user's: EPERM)
        except ProcessLookupError:
            with contextlib.suppress(OSError):
                os.unlink(path)
                removed += 1
        except (OSError, OverflowError):
            continue
    return removed
