"""State shared by the driver's threads: the run's identity, counters and the seeded RNGs."""

from __future__ import annotations

import collections
import dataclasses
import random
import threading
from collections import Counter
from pathlib import Path

from django.db import InterfaceError, OperationalError

__all__ = ["DJANGO_CONNECTION_ERRORS", "Run", "child_rng"]

# What Django raises when the server restarts or the backend is terminated.
DJANGO_CONNECTION_ERRORS = (OperationalError, InterfaceError)


def child_rng(seed: int, role: str, index: int = 0) -> random.Random:
    """A thread's own RNG, derived from the run's seed (string seeds hash deterministically)."""
    return random.Random(f"{seed}:{role}:{index}")


@dataclasses.dataclass
class Run:
    """One chaos run: its seed, database, directory, and what its threads did."""

    seed: int
    index: int
    duration: float
    url: str
    run_dir: Path
    restartable: bool
    queues: tuple[str, ...] = ()  # the spread queues plain jobs go to
    faults: Counter[str] = dataclasses.field(default_factory=Counter)
    actions: Counter[str] = dataclasses.field(default_factory=Counter)
    paths: Counter[str] = dataclasses.field(default_factory=Counter)
    committed: int = 0
    rolled_back: int = 0
    indeterminate: int = 0
    notes: list[str] = dataclasses.field(default_factory=list)
    api_errors: list[str] = dataclasses.field(default_factory=list)
    recent: collections.deque[int] = dataclasses.field(
        default_factory=lambda: collections.deque(maxlen=500)
    )
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)

    def count(self, counter: str, key: str, n: int = 1) -> None:
        with self.lock:
            getattr(self, counter)[key] += n

    def add(self, field: str, n: int) -> None:
        with self.lock:
            setattr(self, field, getattr(self, field) + n)

    def note(self, text: str) -> None:
        """Keep a short remark for the summary (at most 50)."""
        with self.lock:
            if len(self.notes) < 50:
                self.notes.append(text)

    def api_error(self, where: str, exc: BaseException) -> None:
        """An awa_django call raised something other than a connection error."""
        with self.lock:
            if len(self.api_errors) < 50:
                self.api_errors.append(f"{where}: {type(exc).__name__}: {exc}")

    def remember(self, job_ids: list[int]) -> None:
        with self.lock:
            self.recent.extend(job_ids)

    def recent_ids(self) -> list[int]:
        with self.lock:
            return sorted(self.recent)
