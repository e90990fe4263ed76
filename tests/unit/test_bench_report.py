"""benchmarks/run's bookkeeping: the report's ratios and target verdicts, the metric check.

The measurements themselves are exercised by the `bench` lane (`benchmarks/run --quick`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.peers import orchestrate, report, sql, targets


def result(**systems: dict[str, Any]) -> dict[str, Any]:
    return {
        "machine": {"cpus": 2, "cpu_model": "x", "memory_gib": 1, "kernel": "k", "python": "3"},
        "postgres": {
            "server_version": "18.6",
            "fsync": "on",
            "synchronous_commit": "on",
            "full_page_writes": "on",
            "shared_buffers": "1GB",
            "autovacuum": "on",
            "autovacuum_naptime": "1min",
        },
        "run": {
            "quick": True,
            "finished_at": "now",
            "processes": 2,
            "concurrency": 8,
            "jobs": 1,
            "bulk_jobs": 1,
            "drain_jobs": 1,
            "cap": 1.0,
            "pickup_rate": 1.0,
            "pickup_seconds": 1.0,
            "steady_rate": 1.0,
            "steady_seconds": 1.0,
            "rounds": 1,
        },
        "systems": {
            name: {"version": "1", "config": {}, **metrics} for name, metrics in systems.items()
        },
    }


def test_targets_say_met_or_by_how_much_they_were_missed() -> None:
    data = result(
        awa_django={
            "drain_jobs_per_s": 20_000.0,
            "enqueue_bulk_jobs_per_s": 30_000.0,
            "pickup_p99_ms": 2.0,
            "steady_e2e_p50_ms": 3.0,
            "steady_e2e_p95_ms": 9.0,
            "dead_tuples_pinned": 3,
        },
        peer_a={
            "drain_jobs_per_s": 3_000.0,
            "drain_sweep": {"32": 4_000.0, "128": 2_000.0},
            "enqueue_bulk_jobs_per_s": 10_000.0,
            "pickup_p99_ms": 4.0,
            "steady_e2e_p50_ms": 3.0,
            "steady_e2e_p95_ms": 6.0,
            "dead_tuples_pinned": 1_000,
        },
        peer_b={"drain_jobs_per_s": 400.0, "enqueue_bulk_jobs_per_s": 9_000.0},
    )
    rows = "\n".join(targets.rows(data["systems"]))
    # Held to the peer's best concurrency: 4,000, not the 3,000 at the shared setting.
    assert (
        "| drain ≥ 5× the fastest peer (at its best concurrency) | 20,000 | peer_a 4,000 | 5.00× "
        "| met |"
    ) in rows
    assert "| peer_a 10,000 | 3.00× | met |" in rows
    assert "| pickup p99 ≤ the best peer's | 2.00 | peer_a 4.00 | 0.50× | met |" in rows
    assert "p50 ≤ the best peer's | 3.00 | peer_a 3.00 | 1.00× | met |" in rows  # a tie meets
    assert (
        "| steady-load end-to-end p95 ≤ the best peer's | 9.00 | peer_a 6.00 | 1.50× "
        "| missed: 1.50× the reference, 1× asked |"
    ) in rows
    assert "peer_a 1,000 | 0.003× | met |" in rows
    assert "| sync handlers drain ≥ 10,000 jobs/s | n/a | target 10,000 | n/a | not measured |" in (
        rows
    )


def test_absolute_and_own_baseline_targets() -> None:
    ours = {
        "claim_one_server_p50_us": 180.0,
        "floor_jobs_per_s": 90_000.0,
        "drain_sync_jobs_per_s": 12_000.0,
        "drain_default_async_jobs_per_s": 4_000.0,
        "drain_default_sync_jobs_per_s": 5_000.0,
        "enqueue_atomic_jobs_per_s": 950.0,
        "insert_atomic_rows_per_s": 1_000.0,
        "pinned_vs_clean_throughput": 0.9,
    }
    verdicts = {v.target: v for v in targets.evaluate({"awa_django": ours})}
    claim = verdicts["claim_v3 of one job ≤ 150 µs server time (p50)"]
    assert (claim.met, claim.detail) == (False, "missed: 180 against ≤ 150")
    assert verdicts["SQL floor ≥ 2 × 39,556 jobs/s"].met  # 90,000 ≥ 79,112
    assert verdicts["sync handlers drain ≥ 10,000 jobs/s"].met
    default_async = verdicts["default settings drain, async handlers ≥ 5,000 jobs/s"]
    assert (default_async.met, default_async.detail) == (False, "missed: 4,000 against ≥ 5,000")
    assert verdicts["default settings drain, sync handlers ≥ 5,000 jobs/s"].met  # boundary
    atomic = verdicts["single enqueue inside atomic ≥ 0.9× a bare INSERT per atomic block"]
    assert (atomic.reference_name, atomic.reference, atomic.met) == ("bare INSERT", 1_000.0, True)
    assert atomic.ratio == 0.95
    pinned = verdicts["pinned / clean completion rate ≥ 0.95"]
    assert (pinned.met, pinned.detail) == (False, "missed: 0.90 against ≥ 0.95")
    # Peer-relative targets without peers are not measured, never met.
    drain = verdicts["drain ≥ 5× the fastest peer (at its best concurrency)"]
    assert (drain.met, drain.detail) == (None, "not measured")


def test_dead_tuples_are_held_to_peers_that_leave_any() -> None:
    data = result(
        awa_django={"dead_tuples_pinned": 5},
        clean_peer={"dead_tuples_pinned": 0},
        mutating={"dead_tuples_pinned": 400},
    )
    (verdict,) = [v for v in targets.evaluate(data["systems"]) if v.target.startswith("dead")]
    assert (verdict.reference_name, verdict.met) == ("mutating", False)


def test_the_report_gives_every_ratio_and_marks_capped_drains(tmp_path: Path) -> None:
    data = result(
        awa_django={"drain_jobs_per_s": 900.0, "pickup_p50_ms": 1.0, "drain_sweep": {"32": 450}},
        slow={"drain_jobs_per_s": 300.0, "drain_capped": True, "pickup_p50_ms": 4.0},
    )
    text = report.markdown(data, tmp_path / "chart.png", tmp_path / "r.json")
    assert "| Drain (jobs/s, ↑ better) | 900 | 300 (capped) |" in text
    assert "| Drain (↑) | 3.00× |" in text
    assert "| Pickup latency p50 (↓) | 0.25× |" in text
    assert "| Enqueue, one job per transaction (↑) | n/a |" in text
    assert "![throughput and dead tuples](chart.png)" in text
    assert "| system | 32 | 8 |" in text  # the sweep, then the run's own concurrency
    assert "| awa_django | 450 | 900 |" in text
    assert "| slow | n/a | 300 |" in text


def test_a_run_missing_a_required_metric_is_reported() -> None:
    complete = dict.fromkeys(orchestrate.METRICS, 1.0)
    ours = {**complete, **dict.fromkeys(orchestrate.AWA_METRICS, 1.0)}
    data = result(awa_django=ours, peer={**complete, "pickup_p95_ms": None})
    assert orchestrate.missing_metrics(data) == ["peer.pickup_p95_ms"]
    # The drain variants a system owes follow the handler flavours it has.
    data = result(
        awa_django={**ours, "handlers": ["async", "sync"], "drain_sync_jobs_per_s": 1.0},
        async_only={**complete, "handlers": ["async"]},
    )
    assert orchestrate.missing_metrics(data) == [
        "awa_django.drain_default_async_jobs_per_s",
        "awa_django.drain_default_sync_jobs_per_s",
        "async_only.drain_default_async_jobs_per_s",
    ]


def test_drain_variants_follow_the_handler_flavours() -> None:
    assert orchestrate.drain_variants(["async", "sync"]) == [
        ("drain_sync", "sync", []),
        ("drain_default_async", "async", ["--defaults"]),
        ("drain_default_sync", "sync", ["--defaults"]),
    ]
    assert orchestrate.drain_variants(["async"]) == [
        ("drain_default_async", "async", ["--defaults"])
    ]
    assert orchestrate.drain_variants(["sync"])[0] == ("drain_sync", "sync", [])


def test_the_report_shows_variants_probes_and_configurations(tmp_path: Path) -> None:
    data = result(
        awa_django={
            "drain_sync_jobs_per_s": 8_000.0,
            "drain_default_async_jobs_per_s": 4_000.0,
            "enqueue_atomic_jobs_per_s": 900.0,
            "insert_atomic_rows_per_s": 1_000.0,
            "enqueue_atomic_vs_insert": 0.9,
            "claim_one_server_p50_us": 120.0,
            "claim_one_shards": 4,
            "variants": {"sync": {"worker": "w --queue peers=64", "handlers": "def"}},
        },
        chancy={"drain_default_async_jobs_per_s": 1.2, "drain_default_async_capped": True},
    )
    text = report.markdown(data, tmp_path / "chart.png", None)
    assert "| Drain, sync handlers (jobs/s, ↑ better) | 8,000 | n/a |" in text
    assert (
        "| Drain, default settings, async handlers (jobs/s, ↑ better) | 4,000 | 1.20 (capped) |"
        in (text)
    )
    assert "| Pickup latency p99 (↓) | n/a |" in text
    assert "**900 jobs/s**" in text and "ratio 0.90" in text
    assert "on a queue of 4 enqueue shards, server time p50 **120 µs**" in text
    assert "- Sync handlers: w --queue peers=64; handlers def" in text


def test_every_system_query_has_a_window_and_a_count() -> None:
    names = set(sql._queries())
    prefixes = {n.removesuffix("_window") for n in names if n.endswith("_window")}
    assert prefixes == {"awa_django", "procrastinate", "pgqueuer", "django_tasks_db", "chancy"}
    assert {f"{p}_count" for p in prefixes} <= names
