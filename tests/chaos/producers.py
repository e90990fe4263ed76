"""Producer threads: every round a seeded RNG picks an enqueue path and the jobs' behaviours.

Paths: one job in ``transaction.atomic()`` with its ledger row in the same transaction; one job
in autocommit (ledger after); ``enqueue_many`` inside atomic and in autocommit; a savepoint
whose enqueues roll back while the outer block commits others; a whole atomic block rolled
back; the django.tasks backend inside atomic. Some jobs carry a short ``run_after``.

What a failed call means: an error inside the block (before COMMIT) rolls everything back; an
error at COMMIT leaves the outcome unknown (``chaos.indeterminate``); an autocommit call that
raised may or may not have written its jobs (indeterminate, without ids). Ledger rows for
rolled-back and unknown jobs go through a separate psycopg connection.
"""

from __future__ import annotations

import dataclasses
import random
import threading
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

from django.db import connection, transaction

import awa_django
from awa_django import Job
from awa_django.types import JobRequest
from tests.chaos import jobs
from tests.chaos.common import DJANGO_CONNECTION_ERRORS, Run, child_rng
from tests.chaos.db import LedgerConn, statement

__all__ = ["JobSpec", "Producer", "trickle"]

PATHS = {
    "atomic": 20,
    "autocommit": 15,
    "many_atomic": 12,
    "many_autocommit": 10,
    "savepoint": 12,
    "rollback": 8,
    "task": 8,
}
TARGETS = {"sync": 50, "async": 35, "deadline": 7}
BEHAVIOURS: dict[str, dict[str, int]] = {
    "sync": {
        "ok": 30,
        "raise": 8,
        "terminal": 4,
        "retry_after": 6,
        "snooze": 6,
        "cancel": 3,
        "sys_exit": 2,
        "keyboard_interrupt": 2,
        "base_exception": 2,
        "bad_progress": 2,
        "callback_early": 4,
        "callback_late": 6,
        "callback_never": 4,
        "long": 8,
    },
    "async": {
        "ok": 40,
        "raise": 10,
        "terminal": 4,
        "retry_after": 6,
        "snooze": 6,
        "cancel": 3,
        "cancelled_error": 2,
        "base_exception": 2,
        "bad_progress": 2,
        "long": 8,
    },
    "deadline": {"ok": 2, "hang": 1},
    "task": {"ok": 3, "raise": 1},
}
HANDLERS: dict[str, Job[Any, Any]] = {
    "sync": jobs.sync_job,
    "async": jobs.async_job,
    "deadline": jobs.deadline_job,
}


class _Rollback(Exception):
    """Raised inside an atomic block to roll it back on purpose."""


@dataclasses.dataclass(frozen=True)
class JobSpec:
    """One job a producer means to enqueue, fully decided by the RNG before any I/O."""

    token: str
    target: str
    behaviour: str
    plan: dict[str, Any]
    priority: int
    max_attempts: int
    delay: float | None

    @property
    def kind(self) -> str:
        return "chaos_task" if self.target == "task" else HANDLERS[self.target].kind

    def _handle(self) -> Job[Any, Any]:
        run_after = timedelta(seconds=self.delay) if self.delay else None
        return HANDLERS[self.target].using(
            priority=self.priority, max_attempts=self.max_attempts, run_after=run_after
        )

    def enqueue(self) -> int:
        if self.target == "task":
            return int(jobs.chaos_task.enqueue(self.token, self.behaviour).id)
        return self._handle().enqueue(self.token, self.behaviour, self.plan).id

    def prepare(self) -> JobRequest:
        return self._handle().prepare(self.token, self.behaviour, self.plan)


def make_spec(rng: random.Random, token: str, target: str | None = None) -> JobSpec:
    """Draw one job: where it goes, what its handler does, its options."""
    target = target or _pick(rng, TARGETS)
    behaviour = _pick(rng, BEHAVIOURS[target])
    plan: dict[str, Any] = {}
    if behaviour == "long":
        plan["seconds"] = round(rng.uniform(0.4, 2.0), 2)
    elif behaviour == "callback_late":
        plan.update(delay=round(rng.uniform(0.1, 1.5), 2), error=rng.random() < 0.3, timeout=8.0)
    elif behaviour == "callback_never":
        plan["timeout"] = round(rng.uniform(0.3, 1.0), 2)
    elif behaviour == "callback_early":
        plan["timeout"] = 2.0
    elif behaviour == "hang":
        plan["seconds"] = jobs.HANG_SECONDS
    delay = round(rng.uniform(0.05, 0.8), 3) if rng.random() < 0.15 else None
    return JobSpec(
        token=token,
        target=target,
        behaviour=behaviour,
        plan=plan,
        priority=0 if target == "task" else rng.choice((-5, 0, 0, 0, 5)),
        max_attempts=rng.randint(3, 5),
        delay=None if target == "task" else delay,
    )


def _pick(rng: random.Random, weights: dict[str, int]) -> str:
    return rng.choices(list(weights), weights=list(weights.values()))[0]


Sent = list[tuple[JobSpec, int]]


class Producer:
    """One producer thread (Django's connection for this thread, plus a ledger connection)."""

    def __init__(self, run: Run, index: int, stop: threading.Event) -> None:
        self.run = run
        self.index = index
        self.stop = stop
        self.rng = child_rng(run.seed, "producer", index)
        self.ledger = LedgerConn(run.url, f"producer-{index}")
        self.round = 0
        self.paths: dict[str, Callable[[list[list[JobSpec]]], None]] = {
            "atomic": lambda g: self._atomic("atomic", g[0], many=False),
            "autocommit": lambda g: self._autocommit("autocommit", g[0], many=False),
            "many_atomic": lambda g: self._atomic("many_atomic", g[0], many=True),
            "many_autocommit": lambda g: self._autocommit("many_autocommit", g[0], many=True),
            "savepoint": self._savepoint,
            "rollback": lambda g: self._rollback(g[0]),
            "task": lambda g: self._atomic("task", g[0], many=False),
        }

    def loop(self) -> None:
        try:
            while not self.stop.is_set():
                path, groups = self._draw()
                self.run.count("paths", path)
                try:
                    self.paths[path](groups)
                except Exception as exc:  # an unexpected refusal, or a harness bug
                    self.run.api_error(f"producer {self.index} {path}", exc)
                    connection.close()
                self.stop.wait(self.rng.uniform(0.02, 0.2))
        finally:
            connection.close()
            self.ledger.close()

    def _draw(self) -> tuple[str, list[list[JobSpec]]]:
        """The next round: a path and its groups of jobs (drawn before any I/O)."""
        self.round += 1
        path = _pick(self.rng, PATHS)
        prefix = f"r{self.run.index}p{self.index}n{self.round}"

        def specs(group: int, count: int, target: str | None = None) -> list[JobSpec]:
            return [make_spec(self.rng, f"{prefix}g{group}j{i}", target) for i in range(count)]

        if path in ("many_atomic", "many_autocommit"):
            return path, [specs(0, self.rng.randint(1, 20))]
        if path == "savepoint":
            return path, [
                specs(0, self.rng.randint(0, 2)),
                specs(1, self.rng.randint(1, 3)),
                specs(2, self.rng.randint(1, 3)),
            ]
        if path == "rollback":
            return path, [specs(0, self.rng.randint(1, 3))]
        if path == "task":
            return path, [specs(0, 1, "task")]
        return path, [specs(0, 1)]

    # -- paths ---------------------------------------------------------------------------------

    def _atomic(self, path: str, specs: list[JobSpec], *, many: bool) -> None:
        sent: Sent = []
        at_commit = False
        try:
            with transaction.atomic():
                self._send(specs, many, sent)
                self._ledger_in_transaction(path, sent)
                at_commit = True
        except Exception as exc:
            self._failed(path, specs, sent, at_commit, exc)
            return
        self._committed(sent)

    def _autocommit(self, path: str, specs: list[JobSpec], *, many: bool) -> None:
        sent: Sent = []
        try:
            self._send(specs, many, sent)
        except Exception as exc:
            self._closed_after(exc)
            done = {spec.token for spec, _ in sent}
            unknown = [(s, None) for s in specs if s.token not in done]
            self._record("indeterminate_insert", path, unknown)
            self.run.add("indeterminate", len(unknown))
        for spec, job_id in sent:
            self.ledger.execute(
                "committed_insert", [job_id, spec.token, path, spec.kind, spec.behaviour]
            )
        self._committed(sent)

    def _savepoint(self, groups: list[list[JobSpec]]) -> None:
        before, inner, after = groups
        outer: Sent = []
        rolled: Sent = []
        at_commit = False
        try:
            with transaction.atomic():
                self._send(before, False, outer)
                try:
                    with transaction.atomic():
                        self._send(inner, len(inner) > 1, rolled)
                        raise _Rollback
                except _Rollback:
                    pass
                self._send(after, False, outer)
                self._ledger_in_transaction("savepoint", outer)
                at_commit = True
        except Exception as exc:
            self._failed("savepoint", before + after, outer, at_commit, exc)
        else:
            self._committed(outer)
        finally:
            self._record("rolled_back_insert", "savepoint", self._with_ids(inner, rolled))
            self.run.add("rolled_back", len(inner))

    def _rollback(self, specs: list[JobSpec]) -> None:
        sent: Sent = []
        try:
            with transaction.atomic():
                self._send(specs, False, sent)
                raise _Rollback
        except _Rollback:
            pass
        except Exception as exc:
            self._closed_after(exc)
        self._record("rolled_back_insert", "rollback", self._with_ids(specs, sent))
        self.run.add("rolled_back", len(specs))

    # -- helpers -------------------------------------------------------------------------------

    @staticmethod
    def _send(specs: list[JobSpec], many: bool, out: Sent) -> None:
        if many and specs:
            handles = awa_django.enqueue_many([spec.prepare() for spec in specs])
            out.extend(zip(specs, [h.id for h in handles], strict=True))
            return
        for spec in specs:
            out.append((spec, spec.enqueue()))

    @staticmethod
    def _ledger_in_transaction(path: str, sent: Sent) -> None:
        with connection.cursor() as cursor:
            for spec, job_id in sent:
                cursor.execute(
                    statement("committed_insert"),
                    [job_id, spec.token, path, spec.kind, spec.behaviour],
                )

    def _failed(
        self, path: str, specs: list[JobSpec], sent: Sent, at_commit: bool, exc: Exception
    ) -> None:
        """A transaction that raised: unknown if it got as far as COMMIT, else rolled back."""
        self._closed_after(exc)
        rows = self._with_ids(specs, sent)
        if at_commit:
            self._record("indeterminate_insert", path, rows)
            self.run.add("indeterminate", len(rows))
        else:
            self._record("rolled_back_insert", path, rows)
            self.run.add("rolled_back", len(rows))

    def _closed_after(self, exc: Exception) -> None:
        if not isinstance(exc, DJANGO_CONNECTION_ERRORS):
            self.run.api_error(f"producer {self.index}", exc)
        connection.close()

    @staticmethod
    def _with_ids(specs: list[JobSpec], sent: Sent) -> list[tuple[JobSpec, int | None]]:
        ids = {spec.token: job_id for spec, job_id in sent}
        return [(spec, ids.get(spec.token)) for spec in specs]

    def _record(self, name: str, path: str, rows: Sequence[tuple[JobSpec, int | None]]) -> None:
        for spec, job_id in rows:
            self.ledger.execute(name, [spec.token, job_id, path])

    def _committed(self, sent: Sent) -> None:
        self.run.add("committed", len(sent))
        self.run.remember([job_id for _, job_id in sent])


def trickle(run: Run, stop: threading.Event, per_second: float) -> None:
    """Plain ``ok`` jobs at a steady rate (autocommit), so the rings keep rotating while the
    driver watches them shrink: an idle ring stops rotating by design."""
    ledger = LedgerConn(run.url, "trickle")
    n = 0
    try:
        while not stop.is_set():
            n += 1
            token = f"r{run.index}trickle{n}"
            try:
                job_id = JobSpec(token, "sync", "ok", {}, 0, 3, None).enqueue()
            except DJANGO_CONNECTION_ERRORS:
                connection.close()
                ledger.execute("indeterminate_insert", [token, None, "trickle"])
                continue
            ledger.execute("committed_insert", [job_id, token, "trickle", "chaos.sync", "ok"])
            run.add("committed", 1)
            stop.wait(1.0 / per_second)
    finally:
        connection.close()
        ledger.close()
