"""The worker fleet: K ``awa_worker`` processes, each in its own process group with its own log.

The driver is their supervisor: ``supervise()`` notices a dead worker, records its death (with
the time a fault killed it, when a fault did) and starts a replacement in the same slot.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

__all__ = ["Death", "Fleet", "Worker"]


@dataclasses.dataclass
class Worker:
    """One worker process (one generation of one slot)."""

    slot: int
    generation: int
    process: subprocess.Popen[bytes]
    log_path: Path
    started_at: datetime

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None


@dataclasses.dataclass(frozen=True)
class Death:
    """A worker process that ended while the run went on."""

    pid: int
    slot: int
    died_at: datetime
    cause: str
    log_path: Path


class Fleet:
    """K worker slots, restarted on death while ``restarting`` is set."""

    def __init__(self, run_dir: Path, env: dict[str, str], size: int) -> None:
        self.run_dir = run_dir
        self.env = env
        self.size = size
        self.workers: dict[int, Worker] = {}
        self.every: list[Worker] = []
        self.deaths: list[Death] = []
        self.killed: dict[int, datetime] = {}  # pid -> when a fault sent SIGKILL
        self.terminated: dict[int, datetime] = {}  # pid -> when a fault sent SIGTERM
        self.restarts = 0
        self.restarting = threading.Event()
        self.lock = threading.RLock()

    def start(self) -> None:
        self.restarting.set()
        for slot in range(self.size):
            self._spawn(slot, 0)

    def _spawn(self, slot: int, generation: int) -> Worker:
        log_path = self.run_dir / f"worker-{slot}-{generation}.log"
        # Every queue (the spread queues appear as producers use them), CONCURRENCY slots.
        command = [sys.executable, "-m", "django", "awa_worker"]
        with log_path.open("ab") as log:
            process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                cwd=str(Path(__file__).resolve().parents[2]),
                start_new_session=True,
            )
        worker = Worker(slot, generation, process, log_path, datetime.now(UTC))
        with self.lock:
            self.workers[slot] = worker
            self.every.append(worker)
        return worker

    def live(self) -> list[Worker]:
        with self.lock:
            return [w for w in self.workers.values() if w.alive()]

    def by_pid(self, pid: int) -> Worker | None:
        with self.lock:
            return next((w for w in self.workers.values() if w.pid == pid), None)

    def signal(self, worker: Worker, signum: int) -> bool:
        """Send ``signum`` to a live worker; False if it is gone."""
        with self.lock:
            if not worker.alive():
                return False
            if signum == signal.SIGKILL:
                self.killed[worker.pid] = datetime.now(UTC)
            elif signum == signal.SIGTERM:
                if worker.pid in self.terminated:
                    return False  # a second SIGTERM means "exit at once", not "drain"
                self.terminated[worker.pid] = datetime.now(UTC)
            with contextlib.suppress(ProcessLookupError):
                os.kill(worker.pid, signum)
                return True
            return False

    def supervise_once(self) -> None:
        """Record dead workers and, while restarting, start their replacements."""
        with self.lock:
            for slot, worker in list(self.workers.items()):
                code = worker.process.poll()
                if code is None or any(d.pid == worker.pid for d in self.deaths):
                    continue
                self.deaths.append(self._death(worker, code))
                if self.restarting.is_set():
                    self.restarts += 1
                    self._spawn(slot, worker.generation + 1)

    def _death(self, worker: Worker, code: int) -> Death:
        """Why a worker ended: a SIGKILL, a graceful stop asked by a fault (which must exit 0),
        or on its own."""
        killed = self.killed.get(worker.pid)
        if killed is not None:
            return Death(worker.pid, worker.slot, killed, "sigkill (fault)", worker.log_path)
        now = datetime.now(UTC)
        if worker.pid in self.terminated:
            cause = "sigterm (fault)" if code == 0 else f"exited {code} after one SIGTERM"
        else:
            cause = f"exited on its own ({code})"
        return Death(worker.pid, worker.slot, now, cause, worker.log_path)

    def supervise(self, stop: threading.Event) -> None:
        while not stop.is_set():
            self.supervise_once()
            stop.wait(0.1)
        self.supervise_once()

    def stop_all(self, timeout: float) -> dict[int, int | None]:
        """SIGTERM every live worker (and SIGCONT, in case it is stopped); return exit codes
        (None: still running after ``timeout``, then killed)."""
        self.restarting.clear()
        live = self.live()
        for worker in live:
            with contextlib.suppress(ProcessLookupError):
                os.kill(worker.pid, signal.SIGCONT)
                os.kill(worker.pid, signal.SIGTERM)
        codes: dict[int, int | None] = {}
        deadline = time.monotonic() + timeout
        for worker in live:
            try:
                codes[worker.pid] = worker.process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                codes[worker.pid] = None
        self.kill_all()
        return codes

    def kill_all(self) -> None:
        """SIGKILL whatever is left (the process group, so nothing survives the run)."""
        self.restarting.clear()
        with self.lock:
            workers = list(self.every)
        for worker in workers:
            if worker.alive():
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(worker.pid, signal.SIGKILL)
                worker.process.wait()
