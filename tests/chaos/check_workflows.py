"""Invariants of workflows and batches (docs/workflows.md, "Guarantees").

- ``workflow_order``: a step never starts before each of its dependencies ended the way its
  policy needs: completed (or skipped) for ``cancel`` and ``skip``, any end for ``run``; and a
  step whose policy is ``cancel`` or ``skip`` never runs after a dependency failed or was
  cancelled. "Ended" is a terminal write (recorded by the ledger's triggers, in the writing
  transaction) before the step's first execution started.
- ``workflow_released_once``: no step was ever written to the ready ring twice as a first
  emission (two ready rows with run_lease 0); a second release would also run one attempt
  twice, which ``attempt_once`` catches.
- ``workflow_not_stuck``: at the end, every step still waiting has a dependency in the dead
  letter queue, or one that is itself held so (a dead-lettered step holds its workflow, by
  design); and every workflow without a waiting or live step is finished, its counters equal to
  how its steps ended (when its steps' history is still there).

Steps held behind a dead-lettered dependency (``held_steps``) are not live work: the core
invariants ``committed_terminal`` and ``nothing_left_live`` pass over them.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from datetime import datetime
from typing import Any

from tests.chaos.model import Data, EndFacts, Violation, WorkflowRecords

__all__ = ["WORKFLOW_CHECKS", "held_steps", "load_workflows"]

SKIPPED = "awa_django.StepSkipped"


Rows = Callable[[str], list[tuple[Any, ...]]]


def load_workflows(rows: Rows) -> WorkflowRecords:
    records = WorkflowRecords()
    for job_id, workflow_id, policy in rows(
        "SELECT job_id, workflow_id, on_failure FROM awa.workflow_steps"
    ):
        records.steps[job_id] = (workflow_id, policy)
    for upstream, downstream in rows("SELECT upstream, downstream FROM awa.workflow_edges"):
        records.upstream.setdefault(downstream, []).append(upstream)
    records.waiting = {r[0] for r in rows("SELECT job_id FROM awa.workflow_waiting")}
    records.in_dlq = {
        r[0]
        for r in rows(
            "SELECT q.job_id FROM awa.dlq_entries q JOIN awa.workflow_steps s USING (job_id)"
        )
    }
    for row in rows(
        "SELECT workflow_id, steps, completed, failed, cancelled, skipped, "
        "finished_at IS NOT NULL FROM awa.workflows"
    ):
        records.flows[row[0]] = tuple(row[1:])  # type: ignore[assignment]
    for job_id, state, error_type in rows(
        "SELECT DISTINCT ON (d.job_id) d.job_id, d.state, d.errors -> -1 ->> 'type' "
        "FROM awa.done_entries d JOIN awa.workflow_steps s USING (job_id) "
        "ORDER BY d.job_id, d.finalized_at DESC"
    ):
        records.history[job_id] = (state, error_type)
    records.released_twice = [
        r[0]
        for r in rows(
            "SELECT r.job_id FROM awa.ready_entries r JOIN awa.workflow_steps s USING (job_id) "
            "WHERE r.run_lease = 0 GROUP BY r.job_id HAVING count(*) > 1"
        )
    ]
    return records


def held_steps(data: Data) -> set[int]:
    """Waiting steps held, directly or through other held steps, by a dead-lettered one."""
    wf = data.workflows
    held: set[int] = set()
    changed = True
    while changed:
        changed = False
        for job_id in wf.waiting - held:
            if any(u in wf.in_dlq or u in held for u in wf.upstream.get(job_id, [])):
                held.add(job_id)
                changed = True
    return held


def _ends(data: Data, job_id: int) -> list[tuple[str, datetime]]:
    """Each terminal write of a job outside the DLQ: (state, when), skipped told apart."""
    written = data.terminal_written.get(job_id, [])
    when = data.terminal_written_at.get(job_id, [])
    skipped = data.workflows.history.get(job_id, ("", None))[1] == SKIPPED
    return [
        ("skipped" if state == "cancelled" and skipped else state, at)
        for (state, in_dlq, _), at in zip(written, when, strict=True)
        if not in_dlq
    ]


def workflow_order(data: Data, facts: EndFacts) -> list[Violation]:
    out = []
    for job_id, deps in sorted(data.workflows.upstream.items()):
        execs = data.execs.get(job_id, [])
        if not execs:
            continue
        started = min(e.started_at for e in execs)
        policy = data.workflows.steps.get(job_id, (0, "cancel"))[1]
        wanted = ("completed", "skipped") if policy in ("cancel", "skip") else None
        for dep in deps:
            ends = [(s, at) for s, at in _ends(data, dep) if at < started]
            good = [s for s, _ in ends if wanted is None or s in wanted]
            if not good:
                out.append(
                    Violation(
                        "workflow_order",
                        (job_id, dep),
                        f"step {job_id} ({policy}) started at {started.isoformat()} before its "
                        f"dependency {dep} ended as it needs (ends before: {ends}; "
                        f"{data.exec_summary(job_id)})",
                    )
                )
            elif wanted is not None and any(s not in wanted for s in [e[0] for e in ends]):
                out.append(
                    Violation(
                        "workflow_order",
                        (job_id, dep),
                        f"step {job_id} ({policy}) ran although its dependency {dep} ended {ends}",
                    )
                )
    return out


def workflow_released_once(data: Data, facts: EndFacts) -> list[Violation]:
    return [
        Violation(
            "workflow_released_once",
            (job_id,),
            f"step {job_id} was released more than once ({data.snapshot(job_id)})",
        )
        for job_id in data.workflows.released_twice
    ]


def workflow_not_stuck(data: Data, facts: EndFacts) -> list[Violation]:
    wf = data.workflows
    held = held_steps(data)
    out = [
        Violation(
            "workflow_not_stuck",
            (job_id,),
            f"step {job_id} still waits although no dependency is dead-lettered (its "
            f"dependencies: {wf.upstream.get(job_id, [])}; {data.snapshot(job_id)})",
        )
        for job_id in sorted(wf.waiting - held)
    ]
    members: dict[int, list[int]] = collections.defaultdict(list)
    for job_id, (workflow_id, _) in wf.steps.items():
        members[workflow_id].append(job_id)
    for workflow_id, jobs in sorted(members.items()):
        steps, completed, failed, cancelled, skipped, finished = wf.flows[workflow_id]
        if any(j in wf.waiting or j in wf.in_dlq for j in jobs):
            continue
        ended = [wf.history.get(j) for j in jobs]
        if not finished:
            out.append(
                Violation(
                    "workflow_not_stuck",
                    tuple(jobs),
                    f"workflow {workflow_id}: no step waits or is dead-lettered, but it is not "
                    f"finished ({completed}/{failed}/{cancelled}/{skipped} of {steps})",
                )
            )
        if None in ended:
            continue  # a step's history was pruned: its outcome is not known any more
        counts = collections.Counter(
            "skipped" if (s == "cancelled" and t == SKIPPED) else s
            for s, t in ended  # type: ignore[misc]
        )
        want = (counts["completed"], counts["failed"], counts["cancelled"], counts["skipped"])
        if want != (completed, failed, cancelled, skipped) or steps != len(jobs):
            out.append(
                Violation(
                    "workflow_not_stuck",
                    tuple(jobs),
                    f"workflow {workflow_id}: counters {(completed, failed, cancelled, skipped)}"
                    f" of {steps} steps, its steps ended {want} of {len(jobs)}",
                )
            )
    return out


WORKFLOW_CHECKS: tuple[Callable[[Data, EndFacts], list[Violation]], ...] = (
    workflow_order,
    workflow_released_once,
    workflow_not_stuck,
)
