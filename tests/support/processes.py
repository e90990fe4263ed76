"""Subprocesses of the tests: the repository's root (their working directory) and the handle of
a process started by the ``manage_py`` fixture (tests/conftest.py)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Sequence
from pathlib import Path

from tests.support.forkserver import ForkedProcess
from tests.support.polling import WaitTimeout

__all__ = ["REPO", "ManagedProcess", "kill_together"]

REPO = Path(__file__).resolve().parents[2]


class ManagedProcess:
    """A subprocess started by the ``manage_py`` fixture, in its own process group."""

    def __init__(
        self, proc: subprocess.Popen[bytes] | ForkedProcess, log_path: Path, argv: Sequence[str]
    ):
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


def kill_together(processes: list[ManagedProcess]) -> None:
    """SIGKILL every process group first, then reap them: a whole fleet dies at once. Killing
    them one by one (each reaped before the next is signalled) lets the survivors act on the
    first one's death (take its permits, claim a parked job) before they die in turn."""
    for process in processes:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.proc.pid, signal.SIGKILL)
    for process in processes:
        process.proc.wait()
