"""The chaos checker's feature invariants catch what they promise to catch.

Each test feeds one invariant a doctored ledger (tests/chaos/model.py) that breaks it, and the
same ledger with the break repaired, so that a checker that never fires (or always fires) fails
here. No database and no worker: the checks are pure functions of the loaded data.
"""

from __future__ import annotations

import collections
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tests.chaos.check import CHECKS, committed_terminal, rescues_explained
from tests.chaos.check_features import (
    callback_outcomes,
    periodic_fires,
    retry_delays,
    unique_one_holder,
    unique_rollback_releases,
)
from tests.chaos.check_flow import flow_concurrency, flow_rate, flow_serial
from tests.chaos.model import (
    Call,
    CronFire,
    Data,
    EndFacts,
    Exec,
    Fault,
    Features,
    LimitChange,
    Options,
    Park,
    Schedule,
    ScheduleAction,
    Terminal,
    UniqueEnqueue,
    UniqueRollback,
)
from tests.chaos.sabotage import BREAKABLE

T0 = datetime(2030, 1, 1, tzinfo=UTC)
FACTS = EndFacts(heartbeat_staleness=1.5, terminal_bound=40.0)
START = T0 - timedelta(days=1)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def data(
    execs: list[Exec] = (),  # type: ignore[assignment]
    features: Features | None = None,
    faults: list[Fault] = (),  # type: ignore[assignment]
    errors: dict[int, list[dict[str, Any]]] | None = None,
    committed: tuple[int, ...] = (),
) -> Data:
    by_job: dict[int, list[Exec]] = collections.defaultdict(list)
    for e in execs:
        by_job[e.job_id].append(e)
    seen = {job: [("completed", False, 1, 1, errs)] for job, errs in (errors or {}).items()}
    return Data(
        committed={job: (f"t{job}", "atomic", "chaos.sync", "ok") for job in committed},
        rolled_back=[],
        indeterminate=[],
        execs=dict(by_job),
        exec_tokens={},
        job_tokens={},
        terminal_seen=seen,  # type: ignore[arg-type]
        current={},
        duplicates={},
        dlq_retries=collections.Counter(),
        last_dlq_retry={},
        last_terminal={},
        deaths={},
        slow_deaths=set(),
        faults=list(faults),
        features=features or Features(),
    )


def run(
    job: int,
    start: float,
    end: float | None,
    *,
    queue: str = "q",
    kind: str = "chaos.sync",
    weight: int | None = None,
    serial: str | None = None,
    worker: str = "w1",
    lease: int = 1,
    claimed: float | None = None,
) -> Exec:
    return Exec(
        job_id=job,
        run_lease=lease,
        attempt=lease,
        pid=100,
        behaviour="long",
        token=f"t{job}",
        action="return" if end is not None else None,
        started_at=at(start),
        finished_at=None if end is None else at(end),
        claimed_at=at(start if claimed is None else claimed),
        queue=queue,
        kind=kind,
        weight=weight,
        serial_key=serial,
        worker_id=worker,
    )


def limits(scope: str, *changes: tuple[float, int | None, float | None, int | None]) -> Features:
    """Limit changes of ``scope``: (when, concurrency, rate, burst), the first since the start."""
    found = []
    for i, (when, concurrency, rate, burst) in enumerate(changes):
        began = START if i == 0 else at(when)
        found.append(LimitChange(scope, concurrency, rate, burst, began, began))
    return Features(limit_changes=found)


def invariants(found: list[Any]) -> set[str]:
    return {v.invariant for v in found}


# -- flow: global concurrency ---------------------------------------------------------------------


def test_running_more_units_than_the_limit_is_reported() -> None:
    features = limits("queue:q", (0, 2, None, None))
    fits = [run(1, 0, 5), run(2, 1, 5), run(3, 5, 8)]
    assert flow_concurrency(data(fits, features), FACTS) == []
    over = [*fits, run(4, 2, 3)]
    found = flow_concurrency(data(over, features), FACTS)
    assert invariants(found) == {"flow_concurrency"}
    assert 4 in found[0].job_ids


def test_weights_count_and_a_job_heavier_than_the_limit_counts_as_the_limit() -> None:
    features = limits("queue:q", (0, 2, None, None))
    assert flow_concurrency(data([run(1, 0, 5, weight=3)], features), FACTS) == []
    found = flow_concurrency(data([run(1, 0, 5, weight=3), run(2, 1, 2)], features), FACTS)
    assert invariants(found) == {"flow_concurrency"}
    found = flow_concurrency(data([run(1, 0, 5, weight=2), run(2, 1, 2)], features), FACTS)
    assert invariants(found) == {"flow_concurrency"}


def test_a_lowered_limit_lets_running_jobs_finish_but_starts_nothing_new() -> None:
    features = limits("queue:q", (0, 4, None, None), (5, 2, None, None))
    running = [run(job, 0, 10) for job in (1, 2, 3, 4)]
    assert flow_concurrency(data(running, features), FACTS) == []
    found = flow_concurrency(data([*running, run(5, 6, 7)], features), FACTS)
    assert invariants(found) == {"flow_concurrency"}
    # Once they fit under the new limit, a new job may start.
    ended = [run(job, 0, 6) for job in (1, 2, 3)] + [run(4, 0, 10), run(5, 7, 8)]
    assert flow_concurrency(data(ended, features), FACTS) == []


def test_a_raised_limit_is_used_and_a_change_in_flight_allows_either_limit() -> None:
    features = limits("queue:q", (0, 1, None, None), (5, 3, None, None))
    after = [run(1, 6, 9), run(2, 6.5, 9), run(3, 7, 9)]
    assert flow_concurrency(data(after, features), FACTS) == []
    before = [run(1, 1, 3), run(2, 2, 3)]
    assert invariants(flow_concurrency(data(before, features), FACTS)) == {"flow_concurrency"}
    # A claim whose transaction began before the change committed may have read either limit.
    racing = [run(1, 4, 9), run(2, 5.5, 9, claimed=4.9)]
    in_flight = Features(
        limit_changes=[
            LimitChange("queue:q", 1, None, None, START, START),
            LimitChange("queue:q", 3, None, None, at(5), at(6)),
        ]
    )
    assert flow_concurrency(data(racing, in_flight), FACTS) == []


def test_an_attempt_whose_worker_lost_its_session_may_overlap() -> None:
    features = limits("queue:q", (0, 1, None, None))
    over = [run(1, 0, 5, worker="w1"), run(2, 2, 3, worker="w2")]
    assert invariants(flow_concurrency(data(over, features), FACTS)) == {"flow_concurrency"}
    features.session_losses = {"awa:worker:w1": [(at(1), at(1.5))]}
    assert flow_concurrency(data(over, features), FACTS) == []


def test_a_worker_that_lost_its_session_between_claim_and_start_may_overlap() -> None:
    # Frozen after it claimed, reaped, woken: it runs the handler all the same (docs/flow.md).
    features = limits("queue:q", (0, 1, None, None))
    late = [run(2, 1, 6, worker="w2"), run(1, 3, 5, worker="w1", claimed=0)]
    assert invariants(flow_concurrency(data(late, features), FACTS)) == {"flow_concurrency"}
    features.session_losses = {"awa:worker:w1": [(at(0.5), at(2))]}  # before its handler began
    assert flow_concurrency(data(late, features), FACTS) == []


def test_kind_limits_count_the_kind_across_queues() -> None:
    features = limits("kind:chaos.limited", (0, 1, None, None))
    both = [
        run(1, 0, 5, queue="a", kind="chaos.limited"),
        run(2, 1, 2, queue="b", kind="chaos.limited"),
        run(3, 1, 2, queue="b", kind="chaos.sync"),
    ]
    found = flow_concurrency(data(both, features), FACTS)
    assert invariants(found) == {"flow_concurrency"}
    assert 3 not in found[0].job_ids


# -- flow: rate -----------------------------------------------------------------------------------


def test_more_starts_than_the_rate_allows_are_reported() -> None:
    features = limits("queue:q", (0, None, 10.0, 2))
    fits = [run(i, 0.1 * i, None, claimed=0.1 * i) for i in range(1, 20)]
    fits += [run(30, 0.1, None, claimed=0.1)]  # the burst
    assert flow_rate(data(fits, features), FACTS) == []
    burst = [run(i, 0.001 * i, None, claimed=0.001 * i) for i in range(1, 4)]
    found = flow_rate(data(burst, features), FACTS)
    assert invariants(found) == {"flow_rate"}
    assert "3 jobs started" in found[0].evidence


def test_each_rate_holds_under_its_own_regime() -> None:
    features = limits("queue:q", (0, None, 50.0, 5), (10, None, 1.0, 1))
    fast = [run(i, 0.02 * i, None, claimed=0.02 * i) for i in range(1, 100)]
    slow = [run(200 + i, 13 + i, None, claimed=13 + i) for i in range(5)]
    assert flow_rate(data(fast + slow, features), FACTS) == []
    too_fast = [run(300 + i, 20 + 0.02 * i, None, claimed=20 + 0.02 * i) for i in range(5)]
    assert invariants(flow_rate(data(fast + too_fast, features), FACTS)) == {"flow_rate"}


# -- flow: serial keys ----------------------------------------------------------------------------


def test_two_jobs_of_one_serial_key_at_once_are_reported() -> None:
    apart = [run(1, 0, 2, serial="k"), run(2, 2.5, 3, serial="k"), run(3, 1, 2, serial="other")]
    assert flow_serial(data(apart), FACTS) == []
    together = [*apart, run(4, 1, 1.5, serial="k")]
    found = flow_serial(data(together), FACTS)
    assert invariants(found) == {"flow_serial"}
    assert set(found[0].job_ids) == {1, 4}


def test_the_producers_serial_key_counts_even_when_the_job_row_lost_it() -> None:
    features = Features(options={4: Options("chaos.sync", "ok", "q", serial_key="k")})
    together = [run(1, 0, 2, serial="k"), run(4, 1, 1.5)]
    assert invariants(flow_serial(data(together, features), FACTS)) == {"flow_serial"}


# -- unique jobs ----------------------------------------------------------------------------------


def unique_features(*enqueues: UniqueEnqueue, ends: dict[int, float]) -> Features:
    return Features(
        unique_enqueues=list(enqueues),
        terminals={
            job: [Terminal(job, "completed", False, 1, 1, at(end))] for job, end in ends.items()
        },
        options={
            u.job_id: Options(u.kind, "ok", unique_key=u.key) for u in enqueues if not u.duplicate
        },
    )


def test_two_jobs_holding_one_unique_key_at_once_are_reported() -> None:
    a = UniqueEnqueue("a", "k", "chaos.sync", 1, False, at(0))
    later = UniqueEnqueue("b", "k", "chaos.sync", 2, False, at(11))
    ok = unique_features(a, later, ends={1: 10, 2: 20})
    assert unique_one_holder(data(features=ok, committed=(1, 2)), FACTS) == []
    early = UniqueEnqueue("b", "k", "chaos.sync", 2, False, at(5))
    bad = unique_features(a, early, ends={1: 10, 2: 20})
    found = unique_one_holder(data(features=bad, committed=(1, 2)), FACTS)
    assert invariants(found) == {"unique_one_holder"}
    other_kind = UniqueEnqueue("b", "k", "chaos.async", 2, False, at(5))
    fine = unique_features(a, other_kind, ends={1: 10, 2: 20})
    assert unique_one_holder(data(features=fine, committed=(1, 2)), FACTS) == []


def test_a_unique_holder_that_ended_before_its_producer_recorded_the_enqueue_holds_nothing() -> (
    None
):
    """A producer stalled between its commit and its record: the job ran and ended (the
    trigger's exact record, the sample without a finish time) before the record's time. It held
    the key before the next holder took it, not for ever."""
    a = UniqueEnqueue("a", "k", "chaos.sync", 1, False, at(5))
    b = UniqueEnqueue("b", "k", "chaos.sync", 2, False, at(6))
    features = unique_features(a, b, ends={2: 20})
    features.terminals[1] = [Terminal(1, "completed", False, 1, 1, None)]
    stalled = data(features=features, committed=(1, 2))
    assert invariants(unique_one_holder(stalled, FACTS)) == {"unique_one_holder"}  # unknown end
    stalled.terminal_written_at = {1: [at(4)]}
    assert unique_one_holder(stalled, FACTS) == []
    retried = data(features=features, committed=(1, 2))  # a DLQ retry holds it again
    retried.terminal_written_at = {1: [at(4)]}
    features.dlq_retried_at = {1: [at(5.5)]}
    assert invariants(unique_one_holder(retried, FACTS)) == {"unique_one_holder"}


def test_a_duplicate_answer_must_name_a_holder_of_the_same_key() -> None:
    a = UniqueEnqueue("a", "k", "chaos.sync", 1, False, at(0))
    dup = UniqueEnqueue("b", "k", "chaos.sync", 1, True, at(1))
    assert unique_one_holder(data(features=unique_features(a, dup, ends={1: 5})), FACTS) == []
    wrong = UniqueEnqueue("b", "other", "chaos.sync", 1, True, at(1))
    found = unique_one_holder(data(features=unique_features(a, wrong, ends={1: 5})), FACTS)
    assert invariants(found) == {"unique_one_holder"}


def test_two_live_jobs_with_one_key_seen_by_the_observer_are_reported() -> None:
    features = Features(unique_overlaps=[("chaos.sync:k", [1, 2], "1=running,2=available")])
    assert invariants(unique_one_holder(data(features=features), FACTS)) == {"unique_one_holder"}


def test_a_producer_told_duplicate_after_the_holder_rolled_back_is_reported() -> None:
    took = UniqueRollback("k", "a", "b", 7, False, None)
    assert unique_rollback_releases(data(features=Features(unique_rollbacks=[took])), FACTS) == []
    told = UniqueRollback("k", "a", "b", 7, True, None)
    found = unique_rollback_releases(data(features=Features(unique_rollbacks=[told])), FACTS)
    assert invariants(found) == {"unique_rollback_releases"}


# -- periodic schedules ---------------------------------------------------------------------------


def schedule_features(
    fires: list[tuple[int, float, float]], catch_up: int = 1000, leaders: float = 0.0
) -> Features:
    """Fires (job, fire time, made at) of a schedule firing every second until a final pause
    at 20 s."""
    return Features(
        cron_fires=[CronFire(job, "s", at(t), at(made)) for job, t, made in fires],
        schedules={"s": Schedule("s", "* * * * * *", "UTC", catch_up)},
        schedule_actions=[ScheduleAction("s", "pause", at(20), at(20.1))],
        leaders=[(at(x), 100) for x in range(0, 21)] if leaders == 0 else [],
    )


def every_second(until: int = 17, skip: tuple[int, ...] = ()) -> list[tuple[int, float, float]]:
    return [(t, t, t + 0.1) for t in range(until + 1) if t not in skip]


def test_each_fire_time_has_exactly_one_job_none_missed_none_early() -> None:
    assert periodic_fires(data(features=schedule_features(every_second())), FACTS) == []
    twice = [*every_second(), (99, 5, 5.3)]
    assert invariants(periodic_fires(data(features=schedule_features(twice)), FACTS)) == {
        "periodic_fires"
    }
    missed = schedule_features(every_second(skip=(7,)))
    found = periodic_fires(data(features=missed), FACTS)
    assert invariants(found) == {"periodic_fires"}
    assert "missed" in found[0].evidence
    early = [*every_second(skip=(9,)), (9, 9, 8.5)]
    assert invariants(periodic_fires(data(features=schedule_features(early)), FACTS)) == {
        "periodic_fires"
    }


def test_catch_up_latest_may_drop_fires_only_while_the_leader_is_disrupted() -> None:
    gap = every_second(skip=(7, 8))
    gap = [(j, t, t + 0.1 if t != 9 else 9.05) for j, t, _ in gap]
    quiet = schedule_features(gap, catch_up=1)
    assert invariants(periodic_fires(data(features=quiet), FACTS)) == {"periodic_fires"}
    killed = [Fault("kill_worker", 100, "slot 0", at(6.5), at(6.5))]
    assert periodic_fires(data(features=quiet, faults=killed), FACTS) == []
    # catch_up 1000 never drops a fire, whatever happened to the leader.
    strict = schedule_features(gap, catch_up=1000)
    assert invariants(periodic_fires(data(features=strict, faults=killed), FACTS)) == {
        "periodic_fires"
    }


def test_a_fire_dropped_just_before_the_window_ends_is_judged_by_the_fire_after_it() -> None:
    # Fires every second; 16 is dropped by catch_up 1 and 17 made at 17.5, after the window's
    # end (the final pause at 20 s, minus the lateness allowed).
    fires = [*every_second(until=15), (17, 17, 17.5)]
    features = schedule_features(fires, catch_up=1)
    features.leaders = [(at(x), 100) for x in range(0, 16)] + [(at(16.5), 200)]
    assert periodic_fires(data(features=features), FACTS) == []  # the leadership moved
    features.leaders = [(at(x), 100) for x in range(0, 21)]
    assert invariants(periodic_fires(data(features=features), FACTS)) == {"periodic_fires"}


def test_a_paused_schedule_fires_nothing_and_its_pause_excuses_the_gap() -> None:
    features = schedule_features(every_second(skip=(5, 6, 7)))
    features.schedule_actions = [
        ScheduleAction("s", "pause", at(4.5), at(4.6)),
        ScheduleAction("s", "resume", at(7.5), at(7.6)),
        ScheduleAction("s", "pause", at(20), at(20.1)),
    ]
    assert periodic_fires(data(features=features), FACTS) == []
    features.cron_fires.append(CronFire(50, "s", at(6), at(6.2)))
    assert invariants(periodic_fires(data(features=features), FACTS)) == {"periodic_fires"}


# -- retry policies -------------------------------------------------------------------------------


def retried(job: int, wait: float, *, attempt: int = 2, kind: str = "ValueError") -> Exec:
    failed_at = at(10)
    return Exec(
        job_id=job,
        run_lease=attempt,
        attempt=attempt,
        pid=100,
        behaviour="raise",
        token=f"t{job}",
        action="return",
        started_at=at(20),
        finished_at=at(21),
        run_at=failed_at + timedelta(seconds=wait),
        last_error={"type": kind, "attempt": attempt - 1, "at": failed_at.isoformat()},
        prev_outcome="retry",
    )


def test_a_retry_sooner_or_later_than_its_policy_allows_is_reported() -> None:
    policy = {"backoff": "linear", "base": 0.5, "jitter": 0.5}
    features = Features(options={1: Options("chaos.sync", "raise", retry=policy)})
    # After attempt 2 fails, linear waits 2 x 0.5 = 1 s, plus up to 50 %.
    for wait, broken in ((1.0, False), (1.49, False), (0.99, True), (1.6, True)):
        found = retry_delays(data([retried(1, wait, attempt=3)], features), FACTS)
        assert invariants(found) == ({"retry_delays"} if broken else set()), wait


def test_the_cap_bounds_the_wait_and_jobs_without_a_policy_follow_the_default() -> None:
    capped = Features(options={1: Options("chaos.sync", "raise", retry={"base": 1, "cap": 0.3})})
    assert retry_delays(data([retried(1, 0.3)], capped), FACTS) == []
    assert invariants(retry_delays(data([retried(1, 0.5)], capped), FACTS)) == {"retry_delays"}
    # The default: RETRY_BACKOFF_BASE x 2^attempt plus up to 25 %.
    assert retry_delays(data([retried(2, 0.02 * 1.1)]), FACTS) == []
    assert invariants(retry_delays(data([retried(2, 0.03)]), FACTS)) == {"retry_delays"}


def test_retry_after_waits_exactly_what_the_handler_asked() -> None:
    exact = retried(1, FACTS.retry_after_seconds, kind="awa_django.RetryAfter")
    assert retry_delays(data([exact]), FACTS) == []
    late = retried(1, 0.2, kind="awa_django.RetryAfter")
    assert invariants(retry_delays(data([late]), FACTS)) == {"retry_delays"}


# -- callback waits -------------------------------------------------------------------------------


def callback_data(calls: list[Call], result_by: str | None, errors: list[dict[str, Any]]) -> Data:
    park = Park("cb", 1, 1, 1, "race", at(0))
    terminals = [Terminal(1, "completed", False, 1, 1, at(5), {"by": result_by})]
    features = Features(parks=[park], calls=calls, terminals={1: terminals} if result_by else {})
    return data(features=features, errors={1: errors})


def call(request: str, outcome: str, via: str = "python", replayed: bool = False) -> Call:
    return Call(f"{request}-{outcome}-{replayed}", request, "cb", via, "result", outcome, replayed)


def test_one_resolution_decides_a_callback_attempt() -> None:
    good = callback_data([call("r1", "resolved"), call("r2", "stale")], "r1", [])
    assert callback_outcomes(good, FACTS) == []
    replay = callback_data(
        [call("r1", "resolved", "http"), call("r1", "resolved", "http", replayed=True)], "r1", []
    )
    assert callback_outcomes(replay, FACTS) == []


def test_two_acting_resolutions_or_two_outcomes_are_reported() -> None:
    two = callback_data([call("r1", "resolved"), call("r2", "resolved")], "r1", [])
    assert invariants(callback_outcomes(two, FACTS)) == {"callback_outcomes"}
    rescued = {"type": "awa_django.Rescued", "message": "callback timed out", "attempt": 1}
    both = callback_data([call("r1", "resolved")], "r1", [rescued])
    assert invariants(callback_outcomes(both, FACTS)) == {"callback_outcomes"}
    timed_out = callback_data([call("r1", "stale")], None, [rescued])
    assert callback_outcomes(timed_out, FACTS) == []


def test_a_request_answered_stale_must_not_decide_and_an_applied_one_must() -> None:
    stale_won = callback_data([call("r1", "stale")], "r1", [])
    assert invariants(callback_outcomes(stale_won, FACTS)) == {"callback_outcomes"}
    rescued = {"type": "awa_django.Rescued", "message": "callback timed out", "attempt": 1}
    lost = callback_data([call("r1", "resolved", "http")], None, [rescued])
    assert invariants(callback_outcomes(lost, FACTS)) == {"callback_outcomes"}
    # A Python "resolved" may have been kept for a park that never came: a rescue may end it.
    kept = callback_data([call("r1", "resolved")], None, [rescued])
    assert callback_outcomes(kept, FACTS) == []


def test_a_cancel_after_the_attempt_ended_is_not_a_second_outcome() -> None:
    error = {"type": "awa_django.CallbackError", "message": "chaos: late error r1", "attempt": 1}
    cancelled = {"type": "Cancelled", "message": "chaos operator", "attempt": 1}
    later = callback_data([call("r1", "resolved")], None, [error, cancelled])
    assert callback_outcomes(later, FACTS) == []


# -- committed jobs ------------------------------------------------------------------------------


def test_a_job_finished_during_the_final_stop_is_not_lost() -> None:

    finished = data(committed=(1,))
    finished.current = {1: [("completed", False, 1, 1, [])]}
    assert committed_terminal(finished, FACTS) == []
    gone = data(committed=(1,))
    assert invariants(committed_terminal(gone, FACTS)) == {"committed_terminal"}


def test_a_job_pruned_before_any_sample_is_not_lost_and_two_written_outcomes_are_reported() -> None:
    """The observer samples awa.jobs; a job that waited longer than the history's retention
    can leave it before a sample. The triggers' record of each terminal write
    (chaos.terminal_written) says whether it ever ended, and how."""
    pruned = data(committed=(1,))
    pruned.terminal_written = {1: [("completed", False, 1)]}
    assert committed_terminal(pruned, FACTS) == []
    twice = data(committed=(1,))
    twice.terminal_written = {1: [("completed", False, 1), ("failed", True, 2)]}
    assert invariants(committed_terminal(twice, FACTS)) == {"committed_terminal"}


def test_a_stale_rescue_late_by_a_leader_s_hold_back_after_a_restart_is_explained() -> None:
    """A worker killed just before a server restart, holding an attempt whose handler never
    started, has it rescued only when the new leader's hold-back ends (docs/maintenance.md),
    long after the kill: explained. The same rescue with no restart before it is not."""
    error = {
        "type": "awa_django.Rescued",
        "message": "heartbeat stale: worker presumed dead",
        "attempt": 1,
        "at": at(20).isoformat(),
    }
    facts = EndFacts(heartbeat_staleness=1.5, terminal_bound=40.0, outage_hold_back=10.5)
    restarted = data(errors={1: [error]}, committed=(1,))
    restarted.deaths = {100: at(5)}
    restarted.faults = [Fault("restart_fast", None, "", at(8), at(9))]
    assert rescues_explained(restarted, facts) == []
    quiet = data(errors={1: [error]}, committed=(1,))
    quiet.deaths = {100: at(5)}
    assert invariants(rescues_explained(quiet, facts)) == {"rescues_explained"}


# -- the whole checker ----------------------------------------------------------------------------


def test_every_feature_invariant_is_run_and_every_break_names_one() -> None:
    names = {check.__name__ for check in CHECKS}
    assert {
        "flow_concurrency",
        "flow_rate",
        "flow_serial",
        "unique_one_holder",
        "unique_rollback_releases",
        "periodic_fires",
        "retry_delays",
        "callback_outcomes",
    } <= names
    assert set(BREAKABLE) == {
        "limit",
        "rate",
        "serial",
        "unique",
        "unique_rollback",
        "cron",
        "retry",
        "callback",
    }


def test_an_unknown_break_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.chaos import sabotage

    sabotage.enabled.cache_clear()
    monkeypatch.setenv(sabotage.ENV, "limit,nonsense")
    try:
        with pytest.raises(ValueError, match="nonsense"):
            sabotage.enabled()
        monkeypatch.setenv(sabotage.ENV, "all")
        sabotage.enabled.cache_clear()
        assert sabotage.enabled() == frozenset(BREAKABLE)
    finally:
        sabotage.enabled.cache_clear()
