"""benchmarks/run's bookkeeping: the report's ratios and target verdicts, the metric check.

The measurements themselves are exercised by the `bench` lane (`benchmarks/run --quick`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.peers import orchestrate, report, sql


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
            "enqueue_single_jobs_per_s": 1_800.0,
            "pickup_p95_ms": 2.0,
            "dead_tuples_pinned": 3,
        },
        peer_a={
            "drain_jobs_per_s": 5_000.0,
            "drain_sweep": {"32": 6_250.0, "128": 4_000.0},
            "enqueue_single_jobs_per_s": 2_000.0,
            "pickup_p95_ms": 4.0,
            "dead_tuples_pinned": 1_000,
        },
        peer_b={"drain_jobs_per_s": 400.0, "enqueue_single_jobs_per_s": 900.0},
    )
    rows = "\n".join(report.targets(data["systems"]))
    # Held to the peer's best concurrency: 6,250, not the 5,000 at the shared setting.
    assert (
        "| drain ≥ 4× the fastest peer (at its best concurrency) | 20,000 | peer_a 6,250 | 3.20× "
        "| missed: 3.20× of the 4× asked |"
    ) in rows
    assert "peer_a 2,000 | 0.90× | missed: 0.90× of the 1.5× asked |" in rows
    assert "| pickup p95 ≤ the best peer's | 2.00 | peer_a 4.00 | 0.50× | met |" in rows
    assert "peer_a 1,000 | 0.003× | met |" in rows
    assert "bulk enqueue ≥ 3× the fastest peer | n/a | n/a | n/a | not measured |" in rows


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
    data = result(awa_django=complete, peer={**complete, "pickup_p95_ms": None})
    assert orchestrate.missing_metrics(data) == ["peer.pickup_p95_ms"]


def test_every_system_query_has_a_window_and_a_count() -> None:
    names = set(sql._queries())
    prefixes = {n.removesuffix("_window") for n in names if n.endswith("_window")}
    assert prefixes == {"awa_django", "procrastinate", "pgqueuer", "django_tasks_db", "chancy"}
    assert {f"{p}_count" for p in prefixes} <= names
