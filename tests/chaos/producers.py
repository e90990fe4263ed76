"""Producer threads: every round a seeded RNG picks an enqueue path and the jobs' behaviours.

Paths: one job in ``transaction.atomic()`` with its ledger row in the same transaction; one job
in autocommit (ledger after); ``enqueue_many`` inside atomic and in autocommit; a savepoint
whose enqueues roll back while the outer block commits others; a whole atomic block rolled
back; the django.tasks backend inside atomic; jobs of the flow-limited queues and kind
(``flow``), jobs with retry policies (``retry``), unique jobs (``unique``) and a unique holder
rolled back while another producer waits for its key (``unique_rollback``; both in
tests/chaos/unique_paths.py), workflows of 2-5 steps with random dependencies and policies
(``workflow``) and batches with a callback (``batch``), each inside atomic (sometimes rolled
back on purpose) or in autocommit. Some jobs carry a short ``run_after``; most plain jobs go to the
spread queues (tests/chaos/specs.py).

What a failed call means: an error inside the block (before COMMIT) rolls everything back; an
error at COMMIT leaves the outcome unknown (``chaos.indeterminate``); an autocommit call that
raised may or may not have written its jobs (indeterminate, without ids). Ledger rows for
rolled-back and unknown jobs go through a separate psycopg connection.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Sequence
from typing import Any

from django.db import connection, transaction

import awa_django
from tests.chaos import unique_paths
from tests.chaos.common import DJANGO_CONNECTION_ERRORS, Run, child_rng
from tests.chaos.db import LedgerConn, statement
from tests.chaos.specs import (
    JobSpec,
    make_flow_spec,
    make_retry_spec,
    make_spec,
    make_unique_spec,
)

__all__ = ["Producer", "trickle"]

PATHS = {
    "atomic": 20,
    "autocommit": 15,
    "many_atomic": 12,
    "many_autocommit": 10,
    "savepoint": 12,
    "rollback": 8,
    "task": 8,
    "flow": 16,
    "retry": 6,
    "unique": 8,
    "unique_rollback": 3,
    "workflow": 8,
    "batch": 3,
}
FLOW_TARGETS = ("limit", "rate", "serial", "kind")


class _Rollback(Exception):
    """Raised inside an atomic block to roll it back on purpose."""


Sent = list[tuple[JobSpec, int]]


def _pick(rng: random.Random, weights: dict[str, int]) -> str:
    return rng.choices(list(weights), weights=list(weights.values()))[0]


class Producer:
    """One producer thread (Django's connection for this thread, plus a ledger connection)."""

    def __init__(
        self,
        run: Run,
        index: int,
        stop: threading.Event,
        pace: tuple[float, float] = (0.02, 0.2),
        limited: int = 3,
    ) -> None:
        self.run = run
        self.pace = pace  # seconds between two rounds, drawn uniformly
        self.limited = limited  # producers 0 .. limited-1 feed the limited queues
        self.index = index
        self.stop = stop
        self.rng = child_rng(run.seed, "producer", index)
        self.ledger = LedgerConn(run.url, f"producer-{index}")
        self.round = 0
        self.in_atomic = False
        self.pause = 0.0
        #: The drawn shape of a workflow (each step's dependencies and policy) or the batch's
        #: callback, and whether its transaction is rolled back on purpose.
        self.shape: Any = None
        self.roll_back = False
        self.paths: dict[str, Callable[[list[list[JobSpec]]], None]] = {
            "atomic": lambda g: self._atomic("atomic", g[0], many=False),
            "autocommit": lambda g: self._autocommit("autocommit", g[0], many=False),
            "many_atomic": lambda g: self._atomic("many_atomic", g[0], many=True),
            "many_autocommit": lambda g: self._autocommit("many_autocommit", g[0], many=True),
            "savepoint": self._savepoint,
            "rollback": lambda g: self._rollback(g[0]),
            "task": lambda g: self._atomic("task", g[0], many=False),
            "flow": self._flow,
            "retry": lambda g: self._atomic("retry", g[0], many=True),
            "unique": self._unique,
            "unique_rollback": self._unique_rollback,
            "workflow": self._workflow,
            "batch": self._batch,
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
                self.stop.wait(self.rng.uniform(*self.pace))
        finally:
            connection.close()
            self.ledger.close()

    def _draw(self) -> tuple[str, list[list[JobSpec]]]:
        """The next round: a path and its groups of jobs (drawn before any I/O)."""
        self.round += 1
        path = _pick(self.rng, PATHS)
        prefix = f"r{self.run.index}p{self.index}n{self.round}"

        queues = self.run.queues

        def specs(group: int, count: int, target: str | None = None) -> list[JobSpec]:
            return [
                make_spec(self.rng, f"{prefix}g{group}j{i}", target, queues) for i in range(count)
            ]

        self.in_atomic = self.rng.random() < 0.5
        self.pause = round(self.rng.uniform(0.02, 0.3), 3)
        rng = self.rng
        if path == "flow":
            # The limited queues get the same load however many producers run (a soak's five
            # would outrun the limits and leave a backlog past the terminal bound).
            what = rng.choice(FLOW_TARGETS if self.index < self.limited else FLOW_TARGETS[2:])
            # Bursts larger than the limits, so that they bind (and a broken one shows), but
            # not more work than the limited queue clears at its lowest limit.
            count = {"rate": (4, 10), "limit": (3, 7)}.get(what, (2, 6))
            count = rng.randint(*count)
            return path, [
                [make_flow_spec(rng, f"{prefix}j{i}", what, queues) for i in range(count)]
            ]
        if path == "retry":
            count = rng.randint(1, 4)
            return path, [[make_retry_spec(rng, f"{prefix}j{i}", queues) for i in range(count)]]
        if path in ("workflow", "batch"):
            self.roll_back = self.in_atomic and rng.random() < 0.15

            def step(token: str) -> JobSpec:
                return make_spec(rng, token, rng.choice(("sync", "async")), queues)

            if path == "batch":
                members = [step(f"{prefix}b{i}") for i in range(rng.randint(3, 12))]
                self.shape = rng.choice(("on_complete", "on_success", "on_failure"))
                return path, [members, [step(f"{prefix}cb")]]
            count = rng.randint(2, 5)
            # Each step after the first waits for one or two earlier ones (from the third on,
            # sometimes none: a second root).
            self.shape = [
                (
                    sorted(rng.sample(range(i), rng.randint(0 if i > 1 else i, min(2, i)))),
                    rng.choices(("cancel", "skip", "run"), weights=(5, 2, 3))[0],
                )
                for i in range(count)
            ]
            return path, [[step(f"{prefix}w{i}") for i in range(count)]]
        if path == "unique":
            count = rng.randint(1, 3)
            return path, [[make_unique_spec(rng, f"{prefix}j{i}") for i in range(count)]]
        if path == "unique_rollback":
            key = f"rollback-{prefix}"
            first = make_unique_spec(rng, f"{prefix}a", key)
            return path, [[first], [make_unique_spec(rng, f"{prefix}b", key)]]
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
            self.failed(path, specs, sent, at_commit, exc)
            return
        self.committed(sent)

    def _autocommit(self, path: str, specs: list[JobSpec], *, many: bool) -> None:
        sent: Sent = []
        try:
            self._send(specs, many, sent)
        except Exception as exc:
            self.closed_after(exc)
            done = {spec.token for spec, _ in sent}
            unknown = [(s, None) for s in specs if s.token not in done]
            self.record("indeterminate_insert", path, unknown)
            self.run.add("indeterminate", len(unknown))
        for spec, job_id in sent:
            self.ledger.execute("committed_insert", spec.ledger_row(job_id, path))
        self.committed(sent)

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
            self.failed("savepoint", before + after, outer, at_commit, exc)
        else:
            self.committed(outer)
        finally:
            self.record("rolled_back_insert", "savepoint", self._with_ids(inner, rolled))
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
            self.closed_after(exc)
        self.record("rolled_back_insert", "rollback", self._with_ids(specs, sent))
        self.run.add("rolled_back", len(specs))

    def _flow(self, groups: list[list[JobSpec]]) -> None:
        """Flow jobs in one ``enqueue_many``, inside atomic or in autocommit."""
        if self.in_atomic:
            self._atomic("flow", groups[0], many=True)
        else:
            self._autocommit("flow", groups[0], many=True)

    def _unique(self, groups: list[list[JobSpec]]) -> None:
        unique_paths.enqueue_unique(self, groups[0], atomic=self.in_atomic)

    def _unique_rollback(self, groups: list[list[JobSpec]]) -> None:
        [holder], [other] = groups
        unique_paths.rollback_race(self, holder, other, self.pause)

    def _workflow(self, groups: list[list[JobSpec]]) -> None:
        specs = groups[0]

        def send(sent: Sent) -> None:
            wf = awa_django.workflow(f"chaos {specs[0].token}")
            steps: list[awa_django.Step] = []
            for spec, (after, policy) in zip(specs, self.shape, strict=True):
                deps = [steps[j] for j in after]
                steps.append(wf.add(spec.prepare(), after=deps, name=spec.token, on_failure=policy))
            run = wf.enqueue()
            sent.extend((spec, run.jobs[spec.token].id) for spec in specs)

        self._together("workflow", specs, send)

    def _batch(self, groups: list[list[JobSpec]]) -> None:
        members, [callback] = groups

        def send(sent: Sent) -> None:
            callbacks = {self.shape: callback.prepare()}
            run = awa_django.batch(
                [m.prepare() for m in members], name=f"chaos {callback.token}", **callbacks
            ).enqueue()
            sent.extend((m, run.jobs[str(i)].id) for i, m in enumerate(members))
            sent.append((callback, run.jobs[self.shape].id))

        self._together("batch", [*members, callback], send)

    def _together(self, path: str, specs: list[JobSpec], send: Callable[[Sent], None]) -> None:
        """Jobs written by one statement (a workflow, a batch): inside atomic (rolled back on
        purpose when drawn so) or in autocommit, where a call that raised wrote all or none."""
        sent: Sent = []
        if not self.in_atomic:
            try:
                send(sent)
            except Exception as exc:
                self.closed_after(exc)
                self.record("indeterminate_insert", path, [(s, None) for s in specs])
                self.run.add("indeterminate", len(specs))
                return
            for spec, job_id in sent:
                self.ledger.execute("committed_insert", spec.ledger_row(job_id, path))
            self.committed(sent)
            return
        at_commit = False
        try:
            with transaction.atomic():
                send(sent)
                if self.roll_back:
                    raise _Rollback
                self._ledger_in_transaction(path, sent)
                at_commit = True
        except _Rollback:
            self.record("rolled_back_insert", path, self._with_ids(specs, sent))
            self.run.add("rolled_back", len(specs))
            return
        except Exception as exc:
            self.failed(path, specs, sent, at_commit, exc)
            return
        self.committed(sent)

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
                cursor.execute(statement("committed_insert"), spec.ledger_row(job_id, path))

    def failed(
        self, path: str, specs: list[JobSpec], sent: Sent, at_commit: bool, exc: Exception
    ) -> None:
        """A transaction that raised: unknown if it got as far as COMMIT, else rolled back."""
        self.closed_after(exc)
        rows = self._with_ids(specs, sent)
        if at_commit:
            self.record("indeterminate_insert", path, rows)
            self.run.add("indeterminate", len(rows))
        else:
            self.record("rolled_back_insert", path, rows)
            self.run.add("rolled_back", len(rows))

    def closed_after(self, exc: Exception) -> None:
        if not isinstance(exc, DJANGO_CONNECTION_ERRORS):
            self.run.api_error(f"producer {self.index}", exc)
        connection.close()

    @staticmethod
    def _with_ids(specs: list[JobSpec], sent: Sent) -> list[tuple[JobSpec, int | None]]:
        ids = {spec.token: job_id for spec, job_id in sent}
        return [(spec, ids.get(spec.token)) for spec in specs]

    def record(self, name: str, path: str, rows: Sequence[tuple[JobSpec, int | None]]) -> None:
        for spec, job_id in rows:
            self.ledger.execute(name, [spec.token, job_id, path])

    def committed(self, sent: Sent) -> None:
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
                spec = JobSpec(token, "sync", "ok", {})
                job_id = spec.enqueue()
            except DJANGO_CONNECTION_ERRORS:
                connection.close()
                ledger.execute("indeterminate_insert", [token, None, "trickle"])
                continue
            ledger.execute("committed_insert", spec.ledger_row(job_id, "trickle"))
            run.add("committed", 1)
            stop.wait(1.0 / per_second)
    finally:
        connection.close()
        ledger.close()
