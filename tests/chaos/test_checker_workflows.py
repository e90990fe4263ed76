"""The chaos checker's workflow invariants catch what they promise to catch (a doctored ledger
breaks each one, the repaired ledger passes); no database, no worker."""

from __future__ import annotations

import collections
from datetime import UTC, datetime, timedelta

from tests.chaos.check import committed_terminal, nothing_left_live
from tests.chaos.check_workflows import (
    workflow_not_stuck,
    workflow_order,
    workflow_released_once,
)
from tests.chaos.model import Data, EndFacts, Exec, WorkflowRecords

T0 = datetime(2030, 1, 1, tzinfo=UTC)
FACTS = EndFacts(heartbeat_staleness=1.5, terminal_bound=40.0)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def run(
    *,
    ends: dict[int, list[tuple[str, bool, float]]],
    starts: dict[int, float],
    policy: str = "cancel",
    waiting: set[int] = frozenset(),  # type: ignore[assignment]
    in_dlq: set[int] = frozenset(),  # type: ignore[assignment]
    flow: tuple[int, int, int, int, int, bool] = (2, 2, 0, 0, 0, True),
    current: dict[int, str] | None = None,
) -> Data:
    """Steps 1 -> 2 of workflow 7: job 2 waits for job 1."""
    records = WorkflowRecords(
        steps={1: (7, "cancel"), 2: (7, policy)},
        upstream={2: [1]},
        waiting=set(waiting),
        in_dlq=set(in_dlq),
        flows={7: flow},
        history={j: (e[-1][0], None) for j, e in ends.items() if e and not e[-1][1]},
    )
    return Data(
        committed={j: (f"t{j}", "workflow", "chaos.sync", "ok") for j in (1, 2)},
        rolled_back=[],
        indeterminate=[],
        execs={
            j: [Exec(j, 1, 1, 100, "ok", f"t{j}", "completed", at(s), at(s + 0.1))]
            for j, s in starts.items()
        },
        exec_tokens={},
        job_tokens={},
        terminal_seen={},
        current={j: [(s, False, 1, 1, [])] for j, s in (current or {}).items()},
        duplicates={},
        dlq_retries=collections.Counter(),
        last_dlq_retry={},
        last_terminal={},
        deaths={},
        slow_deaths=set(),
        faults=[],
        terminal_written={j: [(s, d, 1) for s, d, _ in e] for j, e in ends.items()},
        terminal_written_at={j: [at(t) for _, _, t in e] for j, e in ends.items()},
        workflows=records,
    )


def test_a_step_that_starts_before_its_dependency_completed_is_caught() -> None:
    early = run(
        ends={1: [("completed", False, 5.0)], 2: [("completed", False, 6.0)]},
        starts={1: 1.0, 2: 4.0},
    )
    assert [v.invariant for v in workflow_order(early, FACTS)] == ["workflow_order"]
    fine = run(
        ends={1: [("completed", False, 3.0)], 2: [("completed", False, 6.0)]},
        starts={1: 1.0, 2: 4.0},
    )
    assert workflow_order(fine, FACTS) == []


def test_a_step_that_ran_after_a_failed_dependency_is_caught_unless_it_runs_anyway() -> None:
    ends = {1: [("failed", False, 3.0)], 2: [("completed", False, 6.0)]}
    assert workflow_order(run(ends=ends, starts={1: 1.0, 2: 4.0}), FACTS)
    assert workflow_order(run(ends=ends, starts={1: 1.0, 2: 4.0}, policy="run"), FACTS) == []


def test_a_waiting_step_with_no_dead_lettered_dependency_is_stuck() -> None:
    stuck = run(
        ends={1: [("completed", False, 3.0)]},
        starts={1: 1.0},
        waiting={2},
        flow=(2, 1, 0, 0, 0, False),
        current={2: "scheduled"},
    )
    assert [v.invariant for v in workflow_not_stuck(stuck, FACTS)] == ["workflow_not_stuck"]
    assert nothing_left_live(stuck, FACTS) and committed_terminal(stuck, FACTS)
    held = run(
        ends={1: [("failed", True, 3.0)]},
        starts={1: 1.0},
        waiting={2},
        in_dlq={1},
        flow=(2, 0, 0, 0, 0, False),
        current={1: "failed", 2: "scheduled"},
    )
    assert workflow_not_stuck(held, FACTS) == []
    assert nothing_left_live(held, FACTS) == [] and committed_terminal(held, FACTS) == []


def test_counters_that_disagree_with_the_steps_are_caught() -> None:
    ends = {1: [("completed", False, 3.0)], 2: [("completed", False, 6.0)]}
    assert workflow_not_stuck(run(ends=ends, starts={1: 1.0, 2: 4.0}), FACTS) == []
    wrong = run(ends=ends, starts={1: 1.0, 2: 4.0}, flow=(2, 1, 1, 0, 0, True))
    assert [v.invariant for v in workflow_not_stuck(wrong, FACTS)] == ["workflow_not_stuck"]
    unfinished = run(ends=ends, starts={1: 1.0, 2: 4.0}, flow=(2, 2, 0, 0, 0, False))
    assert workflow_not_stuck(unfinished, FACTS)


def test_a_step_released_twice_is_caught() -> None:
    twice = run(ends={}, starts={})
    twice.workflows.released_twice = [2]
    assert [v.invariant for v in workflow_released_once(twice, FACTS)] == ["workflow_released_once"]
