"""A kind's flow limits (docs/flow.md, "Per kind") changed while workers run: lowered, raised
and cleared by the operator, by settings across a deploy, by the command line; rates set again
after a clear; a lowered limit holds while more than it is running; an open transaction that
sets a limit stalls no claim.

Workers are real subprocesses with the job kinds of tests/jobs/kind_limits.py (helpers in
tests/support/kind_limit_runs.py).
"""

from __future__ import annotations

import itertools
import json
import signal
import time
from typing import Any

import pytest

from tests.jobs import kind_limits, worker_env
from tests.jobs.kind_limits import lim2, plain
from tests.support.database import pg
from tests.support.kind_limit_runs import (
    kind_row,
    max_overlap,
    no_leak,
    one,
    peak,
    q,
    release,
    wait_completed,
    wait_kind_limit,
    worker,
)
from tests.support.polling import wait_for

pytestmark = pytest.mark.usefixtures("clean_awa", "katk_tables")


def test_lowering_kind_limit_holds_at_once(manage_py: Any) -> None:
    from awa_django.operator.actions import set_kind_limits

    procs = [worker(manage_py, "--concurrency", "8") for _ in range(2)]
    wait_kind_limit("katk.lim2", 2)
    a = lim2.enqueue(block="a").id
    b = lim2.enqueue(block="b").id
    rest = [lim2.enqueue(seconds=0.05).id for _ in range(8)]
    wait_for(
        lambda: one("SELECT gauge.cur FROM katk_gauge gauge WHERE name='katk.lim2'") == 2,
        timeout=20,
    )
    set_kind_limits("katk.lim2", global_concurrency=1, actor="atk")
    with pg() as c:
        c.execute("UPDATE katk_gauge SET peak = cur WHERE name = 'katk.lim2'")
    release("a")
    wait_completed([a], procs)
    # b still runs: nothing else of the kind may start while it does
    started_before = one("SELECT count(*) FROM katk_runs WHERE job_id = ANY(%s)", [rest])
    release("b")
    wait_completed([b, *rest], procs)
    assert started_before == 0 or max_overlap("katk.lim2") <= 2
    # after lowering: never two at once among b and the rest
    rows = q("SELECT job_id, started, ended FROM katk_runs WHERE job_id = ANY(%s)", [[b, *rest]])
    rows.sort(key=lambda r: r[1])
    for (j1, _s1, e1), (j2, s2, _e2) in itertools.pairwise(rows):
        assert s2 >= e1, f"jobs {j1} and {j2} overlapped under limit 1"
    no_leak("katk.lim2")


def test_clearing_operator_limit_releases_parked_promptly(manage_py: Any) -> None:
    from awa_django.operator.actions import clear_kind_limits, set_kind_limits

    set_kind_limits("katk.plain", global_concurrency=1, actor="atk")
    procs = [worker(manage_py, "--concurrency", "8", overrides={"POLL_INTERVAL": 1.0})]
    first = plain.enqueue(block="first").id
    wait_for(lambda: one("SELECT count(*) FROM katk_runs WHERE job_id = %s", [first]), timeout=20)
    rest = [plain.enqueue(block="rest").id for _ in range(5)]
    wait_for(lambda: (kind_row("katk.plain").waiting or 0) == 5, timeout=10, message="5 parked")
    t0 = time.monotonic()
    clear_kind_limits("katk.plain", actor="atk")
    wait_for(
        lambda: one("SELECT count(*) FROM katk_runs WHERE job_id = ANY(%s)", [rest]) == 5,
        timeout=10,
        message="parked jobs start after the limit is cleared",
    )
    took = time.monotonic() - t0
    assert took < 1.5, f"cleared kind's parked jobs took {took:.2f}s to start (POLL_INTERVAL 1)"
    release("first")
    release("rest")
    wait_completed([first, *rest], procs)
    assert one("SELECT count(*) FROM awa.flow_waiting") == 0


def test_raising_kind_limit_unparks_within_poll_interval(manage_py: Any) -> None:
    from awa_django.operator.actions import set_kind_limits

    set_kind_limits("katk.plain", global_concurrency=1, actor="atk")
    procs = [worker(manage_py, "--concurrency", "8", overrides={"POLL_INTERVAL": 1.0})]
    first = plain.enqueue(block="go").id
    wait_for(lambda: one("SELECT count(*) FROM katk_runs WHERE job_id = %s", [first]), timeout=20)
    rest = [plain.enqueue(block="go").id for _ in range(5)]
    wait_for(lambda: (kind_row("katk.plain").waiting or 0) == 5, timeout=10)
    t0 = time.monotonic()
    set_kind_limits("katk.plain", global_concurrency=4, actor="atk")
    wait_for(
        lambda: one("SELECT count(*) FROM katk_runs WHERE job_id = ANY(%s)", [rest]) == 3,
        timeout=10,
    )
    assert time.monotonic() - t0 < 1.5
    # A handler writes its run row, then counts itself in the gauge: wait for the count.
    wait_for(lambda: one("SELECT cur FROM katk_gauge WHERE name = 'katk.plain'") == 4, timeout=5)
    release("go")
    wait_completed([first, *rest], procs)
    assert peak("katk.plain") == 4
    no_leak("katk.plain")


def test_command_clear_restores_job_decorator_limits(manage_py: Any) -> None:
    env = worker_env(kind_limits)
    p = manage_py(
        "awa_queue", "limit", "--kind", "katk.lim2", "--global-concurrency", "7", extra_env=env
    )
    assert p.wait(60) == 0, p.output()
    assert kind_row("katk.lim2").global_concurrency == 7
    p = manage_py("awa_queue", "limit", "--kind", "katk.lim2", "--clear", extra_env=env)
    assert p.wait(60) == 0, p.output()
    row = kind_row("katk.lim2")
    assert row is not None and row.global_concurrency == 2 and row.source == "settings", row


def test_settings_kinds_wins_over_job_decorator(manage_py: Any) -> None:
    procs = [
        worker(
            manage_py,
            "--concurrency",
            "8",
            overrides={"KINDS": {"katk.lim2": {"global_concurrency": 1}}},
        )
        for _ in range(2)
    ]
    wait_kind_limit("katk.lim2", 1)
    ids = [lim2.enqueue(seconds=0.03).id for _ in range(12)]
    wait_completed(ids, procs)
    assert peak("katk.lim2") == 1


def test_deploy_dropping_settings_limit_unparks(manage_py: Any) -> None:
    old = worker(
        manage_py,
        "--concurrency",
        "8",
        overrides={"KINDS": {"katk.settings_limited": {"global_concurrency": 1}}},
    )
    wait_kind_limit("katk.settings_limited", 1)
    from tests.jobs.kind_limits import settings_limited

    first = settings_limited.enqueue(block="dep").id
    wait_for(lambda: one("SELECT count(*) FROM katk_runs WHERE job_id = %s", [first]), timeout=20)
    rest = [settings_limited.enqueue(seconds=0.01).id for _ in range(5)]
    wait_for(lambda: (kind_row("katk.settings_limited").waiting or 0) == 5, timeout=10)
    old.send_signal(signal.SIGTERM)
    release("dep")
    assert old.wait(30) == 0, old.output()
    new = worker(manage_py, "--concurrency", "8", overrides={"POLL_INTERVAL": 1.0})
    wait_completed([first, *rest], [new], timeout=15)
    row = kind_row("katk.settings_limited")
    assert row is None or (row.global_concurrency is None and row.waiting == 0), row


@pytest.mark.parametrize("change", ["raise", "clear", "to_concurrency"])
def test_slow_rate_changed_takes_effect_within_poll_interval(manage_py: Any, change: str) -> None:
    """A kind parked by a slow rate (one job per 20 s): raising or clearing the rate must take
    effect within one POLL_INTERVAL (docs: "A change takes effect with the next claim: within
    one POLL_INTERVAL"), not when the soft wait of the old rate runs out."""
    from awa_django.operator.actions import clear_kind_limits, set_kind_limits

    set_kind_limits("katk.plain", rate_limit=0.05, rate_burst=1, actor="atk")
    procs = [worker(manage_py, "--concurrency", "8", overrides={"POLL_INTERVAL": 1.0})]
    ids = [plain.enqueue().id for _ in range(10)]
    wait_for(lambda: one("SELECT count(*) FROM katk_runs") == 1, timeout=20)
    wait_for(
        lambda: (kind_row("katk.plain").waiting or 0) == 9,
        timeout=10,
        message=lambda: f"9 parked: {kind_row('katk.plain')}",
    )
    t0 = time.monotonic()
    if change == "raise":
        set_kind_limits("katk.plain", rate_limit=1000, rate_burst=100, actor="atk")
    elif change == "clear":
        clear_kind_limits("katk.plain", actor="atk")
    else:
        set_kind_limits("katk.plain", global_concurrency=5, actor="atk")
    wait_completed(ids, procs, timeout=25)
    took = time.monotonic() - t0
    assert took < 2.5, f"after the change ({change}) the parked jobs took {took:.1f}s to run"


def test_slow_queue_rate_raised_takes_effect_at_once(manage_py: Any) -> None:
    """The same as above for a queue's rate (comparison: docs/flow.md "Rate limits")."""
    from awa_django.operator.actions import set_queue_limits

    set_queue_limits("katk", rate_limit=0.05, rate_burst=1, actor="atk")
    procs = [worker(manage_py, "--concurrency", "8", overrides={"POLL_INTERVAL": 1.0})]
    ids = [plain.enqueue().id for _ in range(10)]
    wait_for(lambda: one("SELECT count(*) FROM katk_runs") == 1, timeout=20)
    t0 = time.monotonic()
    set_queue_limits("katk", rate_limit=1000, rate_burst=100, actor="atk")
    wait_completed(ids, procs, timeout=25)
    took = time.monotonic() - t0
    assert took < 2.5, f"after raising the queue rate the jobs took {took:.1f}s to run"


def test_kind_rate_state_not_ahead_after_raise(manage_py: Any) -> None:
    """Direct check of the documented invariant: after a raise, the kind's GCRA state (tat) is
    never further ahead of now than burst x T of the new limits allows, once a claim ran."""
    from awa_django.operator.actions import set_kind_limits

    set_kind_limits("katk.plain", rate_limit=0.05, rate_burst=1, actor="atk")
    procs = [worker(manage_py, "--concurrency", "8", overrides={"POLL_INTERVAL": 0.2})]
    ids = [plain.enqueue().id for _ in range(3)]
    wait_for(lambda: one("SELECT count(*) FROM katk_runs") == 1, timeout=20)
    set_kind_limits("katk.plain", rate_limit=10, rate_burst=1, actor="atk")

    def ahead() -> float:
        return float(
            one(
                "SELECT coalesce(extract(epoch FROM max(tat) - now()), 0)"
                " FROM awa.flow_kind_rate_state WHERE kind = 'katk.plain'"
            )
        )

    # claims run every POLL_INTERVAL (0.2 s): within 3 s the state must be back within
    # burst x T = 0.1 s of now (docs: "never further ahead than the current limits allow")
    wait_for(
        lambda: ahead() <= 0.15,
        timeout=3,
        message=lambda: f"tat within 0.1 s of now after the raise; it is {ahead():.1f}s ahead",
    )
    wait_completed(ids, procs, timeout=25)


def test_kind_rate_set_again_after_clear_takes_effect_at_once(manage_py: Any) -> None:
    """docs: "a rate set again after it was cleared, takes effect at once rather than after
    what a slower rate had accumulated"."""
    from awa_django.operator.actions import clear_kind_limits, set_kind_limits

    set_kind_limits("katk.plain", rate_limit=0.05, rate_burst=1, actor="atk")
    procs = [worker(manage_py, "--concurrency", "8", overrides={"POLL_INTERVAL": 0.5})]
    first = [plain.enqueue().id for _ in range(2)]
    wait_for(lambda: one("SELECT count(*) FROM katk_runs") == 1, timeout=20)
    clear_kind_limits("katk.plain", actor="atk")
    wait_completed(first, procs, timeout=5)
    set_kind_limits("katk.plain", rate_limit=20, rate_burst=5, actor="atk")
    t0 = time.monotonic()
    ids = [plain.enqueue().id for _ in range(10)]
    wait_completed(ids, procs, timeout=30)
    took = time.monotonic() - t0
    assert took < 2.5, f"10 jobs at 20/s burst 5 took {took:.1f}s after the rate was set again"


def test_operator_throttle_then_clear_back_to_job_rate(manage_py: Any) -> None:
    """An operator throttles a kind to a crawl during an incident, then clears the override:
    the kind must go back to its @job rate (20/s burst 5) at once."""
    from awa_django.operator.actions import clear_kind_limits, set_kind_limits
    from tests.jobs.kind_limits import rated

    procs = [worker(manage_py, "--concurrency", "8", overrides={"POLL_INTERVAL": 0.5})]
    wait_kind_limit("katk.rated")
    set_kind_limits("katk.rated", rate_limit=0.05, rate_burst=1, actor="atk")
    ids = [rated.enqueue().id for _ in range(11)]
    wait_for(lambda: one("SELECT count(*) FROM katk_runs") == 1, timeout=20)
    row = clear_kind_limits("katk.rated", actor="atk")
    assert row is not None and row.rate_limit == 20
    t0 = time.monotonic()
    wait_completed(ids, procs, timeout=30)
    took = time.monotonic() - t0
    assert took < 2.5, f"10 jobs at 20/s burst 5 took {took:.1f}s after the throttle was cleared"


def test_open_transaction_setting_kind_limit_does_not_stall_claims(manage_py: Any) -> None:
    """set_kind_limits runs in the caller's transaction (documented): while that transaction
    stays open, claims of the queues holding the kind (and their other kinds) must go on."""
    from django.db import transaction

    from awa_django.operator.actions import set_kind_limits
    from tests.jobs.kind_limits import rated

    procs = [worker(manage_py, "--concurrency", "8")]
    wait_kind_limit("katk.rated")
    warm = [rated.enqueue().id for _ in range(3)]
    wait_completed(warm, procs)
    with transaction.atomic():
        set_kind_limits("katk.rated", rate_limit=30, rate_burst=3, actor="atk")
        with pg() as c:
            ids = [
                c.execute(
                    "SELECT job_id FROM awa.enqueue_one_v2(%s, 'katk-rate', 0, %s, 5)",
                    [k, json.dumps({"args": [], "kwargs": {}})],
                ).fetchone()[0]
                for k in ["katk.free", "katk.rated", "katk.free", "katk.rated", "katk.free"]
            ]
        t0 = time.monotonic()
        wait_completed(ids, procs, timeout=10)
        took = time.monotonic() - t0
    assert took < 2, f"claims stalled {took:.1f}s behind an open set_kind_limits transaction"


@pytest.mark.parametrize("via", ["queue"])
def test_queue_rate_set_again_after_clear_takes_effect_at_once(manage_py: Any, via: str) -> None:
    """Comparison with the kind finding: the same sequence on a queue's rate."""
    from awa_django.operator.actions import clear_queue_limits, set_queue_limits

    set_queue_limits("katk", rate_limit=0.05, rate_burst=1, actor="atk")
    procs = [worker(manage_py, "--concurrency", "8", overrides={"POLL_INTERVAL": 0.5})]
    first = [plain.enqueue().id for _ in range(2)]
    wait_for(lambda: one("SELECT count(*) FROM katk_runs") == 1, timeout=20)
    clear_queue_limits("katk", actor="atk")
    wait_completed(first, procs, timeout=5)
    set_queue_limits("katk", rate_limit=20, rate_burst=5, actor="atk")
    t0 = time.monotonic()
    ids = [plain.enqueue().id for _ in range(10)]
    wait_completed(ids, procs, timeout=30)
    took = time.monotonic() - t0
    assert took < 2.5, f"queue: 10 jobs at 20/s burst 5 took {took:.1f}s after set again"


def test_deploy_raising_kind_rate_takes_effect_at_once(manage_py: Any) -> None:
    """A deploy raises a kind's rate in AWA["KINDS"] (0.05/s -> 20/s): the new workers must run
    it at the new rate at once."""
    old = worker(
        manage_py,
        "--concurrency",
        "8",
        overrides={"KINDS": {"katk.settings_limited": {"rate_limit": 0.05, "rate_burst": 1}}},
    )
    wait_kind_limit("katk.settings_limited")
    from tests.jobs.kind_limits import settings_limited

    ids = [settings_limited.enqueue(seconds=0).id for _ in range(11)]
    wait_for(lambda: one("SELECT count(*) FROM katk_runs") == 1, timeout=20)
    old.send_signal(signal.SIGTERM)
    assert old.wait(30) == 0
    new = worker(
        manage_py,
        "--concurrency",
        "8",
        overrides={"KINDS": {"katk.settings_limited": {"rate_limit": 20, "rate_burst": 5}}},
    )
    wait_for(lambda: (kind_row("katk.settings_limited").rate_limit or 0) == 20, timeout=20)
    t0 = time.monotonic()
    wait_completed(ids, [new], timeout=30)
    took = time.monotonic() - t0
    assert took < 2.5, f"after the deploy raised the rate, 10 jobs took {took:.1f}s"


@pytest.mark.parametrize("how", ["clear_to_settings", "operator_lower"])
def test_lowered_kind_limit_holds_while_over_limit(manage_py: Any, how: str) -> None:
    """4 of the kind run under an operator limit of 4; the limit drops to 2 (cleared back to
    @job's 2, or set to 2); two of the four end: the other two still hold the kind at its new
    limit, so nothing of the kind may start until one more ends."""
    from awa_django.operator.actions import clear_kind_limits, set_kind_limits

    set_kind_limits("katk.lim2", global_concurrency=4, actor="atk")
    procs = [worker(manage_py, "--concurrency", "8") for _ in range(2)]
    wait_kind_limit("katk.lim2", 4)
    held = [lim2.enqueue(block=f"b{i}").id for i in range(4)]
    wait_for(lambda: one("SELECT cur FROM katk_gauge WHERE name = 'katk.lim2'") == 4, timeout=20)
    if how == "clear_to_settings":
        clear_kind_limits("katk.lim2", actor="atk")
    else:
        set_kind_limits("katk.lim2", global_concurrency=2, actor="atk")
    rest = [lim2.enqueue(seconds=0.05).id for _ in range(8)]
    wait_for(lambda: (kind_row("katk.lim2").waiting or 0) >= 1, timeout=10)
    release("b0")
    release("b1")
    wait_completed(held[:2], procs, timeout=20)
    t_end = time.monotonic() + 1.5  # many claims (POLL_INTERVAL 0.05)
    wait_for(lambda: time.monotonic() > t_end, timeout=3)
    started = one("SELECT count(*) FROM katk_runs WHERE job_id = ANY(%s)", [rest])
    assert started == 0, f"{started} job(s) started while 2 of the kind still ran at limit 2"
    release("b2")
    release("b3")
    wait_completed([*held, *rest], procs, timeout=30)
    rows = q(
        "SELECT started, ended FROM katk_runs WHERE job_id = ANY(%s)", [[held[2], held[3], *rest]]
    )
    ev = sorted([(s, 1) for s, _ in rows] + [(e, 0) for _, e in rows], key=lambda x: (x[0], x[1]))
    cur = best = 0
    for _, k in ev:
        cur += 1 if k else -1
        best = max(best, cur)
    assert best <= 2
    no_leak("katk.lim2")
