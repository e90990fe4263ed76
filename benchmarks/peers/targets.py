"""The speed targets (docs/benchmarks.md, "Targets") and their verdicts, computed from a run.

A target holds one awa_django figure to a reference: the best peer's figure (times a factor),
a fixed number, or another awa_django figure (the bare INSERT its enqueue is compared with).
"""

from __future__ import annotations

import dataclasses
from typing import Any

__all__ = ["TARGETS", "Target", "Verdict", "best_peer", "best_value", "evaluate", "rows"]

US = "awa_django"
FLOOR_BEFORE = 39_556  # jobs/s: the SQL floor measured before the targets were set


@dataclasses.dataclass(frozen=True)
class Target:
    """``metric`` of awa_django against a reference, met when ``value / reference`` is at
    least ``factor`` (``higher``) or at most ``factor`` (lower is better).

    The reference is the best peer's ``metric`` (``kind="peer"``), the number ``threshold``
    (``kind="absolute"``) or awa_django's own ``reference`` metric (``kind="own"``).
    """

    label: str
    metric: str
    higher: bool
    kind: str = "peer"
    factor: float = 1.0
    threshold: float | None = None
    reference: str | None = None
    reference_label: str = ""
    unit: str = ""
    mutating_peers_only: bool = False


TARGETS: tuple[Target, ...] = (
    Target("claim_v3 of one job ≤ 150 µs server time (p50)", "claim_one_server_p50_us", False,
           kind="absolute", threshold=150, unit="µs"),
    Target(f"SQL floor ≥ 2 × {FLOOR_BEFORE:,} jobs/s", "floor_jobs_per_s", True,
           kind="absolute", threshold=2 * FLOOR_BEFORE, unit="jobs/s"),
    Target("steady-load end-to-end p50 ≤ the best peer's", "steady_e2e_p50_ms", False),
    Target("steady-load end-to-end p95 ≤ the best peer's", "steady_e2e_p95_ms", False),
    Target("pickup p99 ≤ the best peer's", "pickup_p99_ms", False),
    Target("drain ≥ 5× the fastest peer (at its best concurrency)", "drain_jobs_per_s", True,
           factor=5),
    Target("sync handlers drain ≥ 10,000 jobs/s", "drain_sync_jobs_per_s", True,
           kind="absolute", threshold=10_000, unit="jobs/s"),
    Target("default settings drain, async handlers ≥ 5,000 jobs/s",
           "drain_default_async_jobs_per_s", True, kind="absolute", threshold=5_000,
           unit="jobs/s"),
    Target("default settings drain, sync handlers ≥ 5,000 jobs/s",
           "drain_default_sync_jobs_per_s", True, kind="absolute", threshold=5_000,
           unit="jobs/s"),
    Target("single enqueue inside atomic ≥ 0.9× a bare INSERT per atomic block",
           "enqueue_atomic_jobs_per_s", True, kind="own", factor=0.9,
           reference="insert_atomic_rows_per_s", reference_label="bare INSERT"),
    Target("bulk enqueue, 1,000 per call ≥ 2.5× the fastest peer", "enqueue_bulk_jobs_per_s",
           True, factor=2.5),
    Target("dead tuples under the pin ≤ 1 % of the best row-mutating peer's",
           "dead_tuples_pinned", False, factor=0.01, mutating_peers_only=True),
    Target("pinned / clean completion rate ≥ 0.95", "pinned_vs_clean_throughput", True,
           kind="absolute", threshold=0.95, unit="ratio"),
)  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Verdict:
    """One target's outcome: ``met`` is None when a figure is missing."""

    target: str
    value: float | None
    reference_name: str | None
    reference: float | None
    ratio: float | None
    met: bool | None
    detail: str

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def best_value(system: dict[str, Any], metric: str, higher: bool) -> Any:
    """A system's figure; for drain, its best over the concurrency sweep too."""
    value = system.get(metric)
    if metric == "drain_jobs_per_s" and higher:
        values = [v for v in [value, *system.get("drain_sweep", {}).values()] if v is not None]
        value = max(values) if values else None
    return value


def best_peer(systems: dict[str, Any], metric: str, higher: bool) -> tuple[str | None, Any]:
    peers = [
        (n, best_value(s, metric, higher))
        for n, s in systems.items()
        if n != US and best_value(s, metric, higher) is not None
    ]
    if not peers:
        return None, None
    return (max if higher else min)(peers, key=lambda p: p[1])


def _reference(target: Target, systems: dict[str, Any]) -> tuple[str | None, Any]:
    if target.kind == "absolute":
        return "target", target.threshold
    if target.kind == "own":
        assert target.reference is not None
        return target.reference_label, systems.get(US, {}).get(target.reference)
    peers = systems
    if target.mutating_peers_only:
        peers = {n: s for n, s in systems.items() if (s.get(target.metric) or 0) > 0}
    return best_peer(peers, target.metric, target.higher)


def evaluate(systems: dict[str, Any]) -> list[Verdict]:
    """Every target's verdict for a run's ``systems``."""
    ours = systems.get(US, {})
    verdicts = []
    for target in TARGETS:
        value = ours.get(target.metric)
        name, reference = _reference(target, systems)
        if value is None or reference is None:
            verdicts.append(
                Verdict(target.label, value, name, reference, None, None, "not measured")
            )
            continue
        got = value / reference if reference else (float("inf") if value else 1.0)
        met = got >= target.factor if target.higher else got <= target.factor
        if met:
            detail = "met"
        elif target.kind == "absolute":
            sign = "≥" if target.higher else "≤"
            detail = f"missed: {_fmt(value)} against {sign} {_fmt(reference)}"
        elif target.higher:
            detail = f"missed: {got:.2f}× of the {target.factor:g}× asked"
        else:
            detail = f"missed: {got:.2f}× the reference, {target.factor:g}× asked"
        verdicts.append(Verdict(target.label, value, name, reference, got, met, detail))
    return verdicts


def _fmt(value: Any) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float) and abs(value) < 100:
        return f"{value:.2f}" if abs(value) < 10 else f"{value:.1f}"
    return f"{value:,.0f}"


def _ratio(value: float | None) -> str:
    if value is None:
        return "n/a"
    if value == float("inf"):
        return "∞"
    return f"{value:.2f}×" if value >= 0.01 or value == 0 else f"{value:.1g}×"


def rows(systems: dict[str, Any]) -> list[str]:
    """The report's Targets table: each target met or missed, and by how much."""
    lines = ["| target | awa_django | held to | ratio | verdict |", "|---|---:|---|---:|---|"]
    for v in evaluate(systems):
        held = "n/a" if v.reference is None else f"{v.reference_name} {_fmt(v.reference)}"
        lines.append(f"| {v.target} | {_fmt(v.value)} | {held} | {_ratio(v.ratio)} | {v.detail} |")
    return lines
