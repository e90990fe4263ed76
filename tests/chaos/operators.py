"""The operator thread: cancel jobs, pause/resume and drain queues, retry dead letters, change
flow limits, pause, resume and trigger periodic schedules.

Actions are drawn from a seeded RNG every 0.5-2 s. DLQ retries are written to
``chaos.dlq_retried`` in the same transaction as the retry (``certain = false`` when the commit's
outcome is unknown), because each one allows the job one more execution. Flow limit changes and
schedule actions are written to ``chaos.limit_changes`` and ``chaos.schedule_actions`` with the
database clock read before the change's transaction began and after it committed, so that the
checker knows which limits were in force when (tests/chaos/control.py).
"""

from __future__ import annotations

import contextlib
import threading
import time

from django.db import connection, transaction

import awa_django
from awa_django.operator import queue_drain, queue_pause
from tests.chaos import control
from tests.chaos.common import DJANGO_CONNECTION_ERRORS, Run, child_rng
from tests.chaos.db import LedgerConn, statement

__all__ = ["QUEUES", "Operator", "pausable", "resume_all"]

QUEUES = ("chaos", "chaos-async", "chaos-deadline")
ACTIONS = {"cancel": 5, "pause": 2, "drain": 1, "dlq_retry": 3, "limit": 5, "schedule": 2}


class Operator:
    """Runs operator actions until ``stop``; then resumes every queue it paused."""

    def __init__(self, run: Run, stop: threading.Event) -> None:
        self.run = run
        self.stop = stop
        self.rng = child_rng(run.seed, "operator")
        self.ledger = LedgerConn(run.url, "operator")
        self.resumes: list[tuple[float, str]] = []
        self.schedule_resumes: list[tuple[float, str]] = []

    def loop(self) -> None:
        try:
            while not self.stop.is_set():
                action = self.rng.choices(list(ACTIONS), weights=list(ACTIONS.values()))[0]
                # Draw everything the action needs before it runs, so failures do not shift
                # the RNG's sequence.
                queue = self.rng.choice(pausable(self.run))
                pick = self.rng.random()
                pause_for = self.rng.uniform(0.5, 3.0)
                count = self.rng.randint(1, 5)
                change = control.draw_change(self.rng)
                try:
                    if action == "limit":
                        control.change_limits(self.ledger, *change)
                    elif action == "schedule":
                        self._schedule(pick, pause_for)
                    else:
                        self._act(action, queue, pick, pause_for, count)
                    self.run.count("actions", action)
                except DJANGO_CONNECTION_ERRORS:
                    connection.close()
                except Exception as exc:
                    self.run.api_error(f"operator {action}", exc)
                    connection.close()
                self._resume_due()
                self.stop.wait(self.rng.uniform(0.5, 2.0))
        finally:
            for _, name in self.schedule_resumes:
                with contextlib.suppress(*DJANGO_CONNECTION_ERRORS):
                    if name:
                        control.schedule_action(self.ledger, name, "resume")
                    else:
                        control.sabotage_cron_resume()
            connection.close()
            self.ledger.close()

    def _act(self, action: str, queue: str, pick: float, pause_for: float, count: int) -> None:
        if action == "cancel":
            ids = self.run.recent_ids()
            if ids:
                awa_django.cancel(ids[int(pick * len(ids))], reason="chaos operator")
        elif action == "pause":
            queue_pause(queue, True)
            self.resumes.append((time.monotonic() + pause_for, queue))
        elif action == "drain":
            queue_drain(queue)
        else:
            self._dlq_retry(pick, count)

    def _dlq_retry(self, pick: float, count: int) -> None:
        candidates = [row[0] for row in self.ledger.execute("dlq_candidates")]
        if not candidates:
            return
        start = int(pick * len(candidates))
        chosen = candidates[start : start + count]
        at_commit = False
        try:
            with transaction.atomic():
                retried = awa_django.dlq_retry(chosen)
                with connection.cursor() as cursor:
                    for job_id in retried:
                        cursor.execute(statement("dlq_retried_insert"), [job_id, True])
                at_commit = True
        except DJANGO_CONNECTION_ERRORS:
            connection.close()
            if at_commit:
                for job_id in chosen:
                    self.ledger.execute("dlq_retried_insert", [job_id, False])

    def _schedule(self, pick: float, pause_for: float) -> None:
        """Pause the every-2-s schedule for a while (it is resumed later), or trigger one."""
        if pick < 0.5 and not any(q == control.LATEST for _, q in self.schedule_resumes):
            control.schedule_action(self.ledger, control.LATEST, "pause")
            self.schedule_resumes.append((time.monotonic() + pause_for, control.LATEST))
        else:
            control.schedule_action(self.ledger, control.SCHEDULES[int(pick * 2) % 2], "trigger")
        if control.sabotage_cron(self.ledger, pick):
            self.schedule_resumes.append((time.monotonic() + 2.0, ""))

    def _resume_due(self) -> None:
        now = time.monotonic()
        for due, queue in list(self.resumes):
            if due <= now:
                try:
                    queue_pause(queue, False)
                    self.resumes.remove((due, queue))
                except DJANGO_CONNECTION_ERRORS:
                    connection.close()
        for due, name in list(self.schedule_resumes):
            if due <= now:
                try:
                    if name:
                        control.schedule_action(self.ledger, name, "resume")
                    else:  # the sabotage's unrecorded pause
                        control.sabotage_cron_resume()
                    self.schedule_resumes.remove((due, name))
                except DJANGO_CONNECTION_ERRORS:
                    connection.close()


def pausable(run: Run) -> tuple[str, ...]:
    """The queues the operator pauses and drains: the kinds' queues and a few spread ones."""
    return QUEUES + run.queues[:4]


def resume_all(run: Run, patience: float = 60.0) -> None:
    """Resume every queue the operator may have paused (retrying through a restart); in the
    calling thread."""
    deadline = time.monotonic() + patience
    for queue in pausable(run):
        while True:
            try:
                queue_pause(queue, False)
                break
            except DJANGO_CONNECTION_ERRORS:
                connection.close()
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
    connection.close()
