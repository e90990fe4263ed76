"""The Markdown report and the PNG chart of a ``benchmarks/run`` result."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from benchmarks.peers import targets

__all__ = ["write"]

US = "awa_django"

# metric: (label, unit, True if higher is better)
METRICS: dict[str, tuple[str, str, bool]] = {
    "drain_jobs_per_s": ("Drain", "jobs/s", True),
    "drain_sync_jobs_per_s": ("Drain, sync handlers", "jobs/s", True),
    "drain_default_async_jobs_per_s": ("Drain, default settings, async handlers", "jobs/s", True),
    "drain_default_sync_jobs_per_s": ("Drain, default settings, sync handlers", "jobs/s", True),
    "enqueue_single_jobs_per_s": ("Enqueue, one job per transaction", "jobs/s", True),
    "enqueue_bulk_jobs_per_s": ("Enqueue, bulk API, 1,000 per call", "jobs/s", True),
    "pickup_p50_ms": ("Pickup latency p50", "ms", False),
    "pickup_p95_ms": ("Pickup latency p95", "ms", False),
    "pickup_p99_ms": ("Pickup latency p99", "ms", False),
    "steady_e2e_p50_ms": ("Steady load, end-to-end p50", "ms", False),
    "steady_e2e_p95_ms": ("Steady load, end-to-end p95", "ms", False),
    "dead_tuples_pinned": ("Dead tuples after the pinned run", "tuples", False),
    "pinned_vs_clean_throughput": ("Pinned / clean completion rate", "ratio", True),
}


def fmt(value: Any, unit: str = "") -> str:
    if value is None:
        return "n/a"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if unit == "ratio":
        return f"{value:.2f}"
    if isinstance(value, float) and abs(value) < 100:
        return f"{value:.2f}" if abs(value) < 10 else f"{value:.1f}"
    return f"{value:,.0f}"


def capped_key(metric: str) -> str:
    """``drain_sync_jobs_per_s`` -> ``drain_sync_capped``: the flag of a drain figure."""
    return metric.removesuffix("_jobs_per_s") + "_capped"


def ratio(ours: Any, theirs: Any) -> str:
    if ours is None or theirs is None:
        return "n/a"
    if theirs == 0:
        return "∞" if ours else "1.00×"
    value = ours / theirs
    return f"{value:.2f}×" if value >= 0.01 or value == 0 else f"{value:.1g}×"


def markdown(data: dict[str, Any], chart: Path, json_path: Path | None) -> str:
    systems: dict[str, Any] = data["systems"]
    names = list(systems)
    peers = [n for n in names if n != US]
    run, machine, pg = data["run"], data["machine"], data["postgres"]
    lines = [
        "# Benchmarks: awa_django side by side with its Postgres peers",
        "",
        f"Produced by `benchmarks/run{' --quick' if run['quick'] else ''}` on "
        f"{run['finished_at']} in {run.get('wall_seconds', '?')} s "
        f"({'quick smoke sizes' if run['quick'] else 'full sizes'}). "
        "Same machine, same PostgreSQL server, same run; each scenario on a fresh database "
        "cloned from the system's template; systems interleaved round by round.",
        "",
        f"- Machine: {machine['cpus']} CPUs ({machine['cpu_model']}), "
        f"{machine['memory_gib']} GiB, Linux {machine['kernel']}, Python {machine['python']}. "
        "Postgres, the producer and the workers share the CPUs.",
        f"- PostgreSQL {pg['server_version']}: fsync={pg['fsync']}, "
        f"synchronous_commit={pg['synchronous_commit']}, "
        f"full_page_writes={pg['full_page_writes']}, shared_buffers={pg['shared_buffers']}, "
        f"autovacuum={pg['autovacuum']} (naptime {pg['autovacuum_naptime']}).",
        f"- Workers: {run['processes']} OS processes per system, {run['concurrency']} jobs in "
        "flight per process where the system has the knob (django-tasks-db runs one task at a "
        "time per process by design).",
        f"- Sizes: {run['jobs']:,} single enqueues, {run['bulk_jobs']:,} bulk enqueues, "
        f"drain {run['drain_jobs']:,} jobs (cap {run['cap']:g} s), pickup "
        f"{run['pickup_rate']:g}/s for {run['pickup_seconds']:g} s, steady and pinned "
        f"{run['steady_rate']:g}/s for {run['steady_seconds']:g} s with a 1 ms handler; "
        f"enqueue, drain, pickup and steady: median of {run['rounds']} interleaved round(s); "
        "pinned: one run per system.",
        f"- Sync-handler drains at {run.get('sync_concurrency', 64)} jobs in flight per "
        "process; default-settings drains with every worker knob at the system's default "
        "(see the configurations at the end).",
        "",
        f"![throughput and dead tuples]({chart.name})",
        "",
        "## Results",
        "",
        "| metric | " + " | ".join(names) + " |",
        "|---|" + "---:|" * len(names),
    ]
    for metric, (label, unit, higher) in METRICS.items():
        arrow = "↑" if higher else "↓"
        cells = []
        for n in names:
            cell = fmt(systems[n].get(metric), unit)
            if metric.startswith("drain") and systems[n].get(capped_key(metric)):
                cell += " (capped)"
            unfinished = systems[n].get("steady_unfinished") or 0
            if metric.startswith("steady_e2e") and unfinished:
                cell = f"> {cell} ({unfinished:,} unfinished)"
            cells.append(cell)
        lines.append(f"| {label} ({unit}, {arrow} better) | " + " | ".join(cells) + " |")
    if peers:
        lines += [
            "",
            "## Ratios awa_django / peer",
            "",
            "Above 1 is better for awa_django on ↑ metrics; below 1 is better on ↓ metrics.",
            "",
            "| metric | " + " | ".join(peers) + " |",
            "|---|" + "---:|" * len(peers),
        ]
        ours = systems.get(US, {})
        for metric, (label, _unit, higher) in METRICS.items():
            arrow = "↑" if higher else "↓"
            cells = [ratio(ours.get(metric), systems[p].get(metric)) for p in peers]
            lines.append(f"| {label} ({arrow}) | " + " | ".join(cells) + " |")
        lines += [
            "",
            "## Targets",
            "",
            'The speed targets, each computed from this run. "held to" is the best peer\'s '
            "figure (drain: at the peer's best concurrency; dead tuples: among peers that leave "
            "any), a fixed figure, or awa_django's own bare-INSERT baseline.",
            "",
            *targets.rows(systems),
        ]
    sweep = sorted({int(c) for s in systems.values() for c in s.get("drain_sweep", {})})
    if sweep:
        columns = [*sweep, run["concurrency"]]
        lines += [
            "",
            "## Drain by concurrency",
            "",
            "One round at each other concurrency (jobs in flight per process, 2 processes); the "
            "last column is the headline figure above. The drain target holds awa_django's "
            "headline to each peer's best figure in this table.",
            "",
            "| system | " + " | ".join(f"{c}" for c in columns) + " |",
            "|---|" + "---:|" * len(columns),
        ]
        for n in names:
            swept = systems[n].get("drain_sweep", {})
            cells = [fmt(swept.get(str(c))) for c in sweep]
            lines.append(
                f"| {n} | " + " | ".join([*cells, fmt(systems[n].get("drain_jobs_per_s"))]) + " |"
            )
    if US in systems and systems[US].get("floor_jobs_per_s"):
        floor = systems[US]["floor_jobs_per_s"]
        drain = systems[US].get("drain_jobs_per_s") or 0
        lines += [
            "",
            "## The floor",
            "",
            f"awa_django's own `claim_v3` and `finalize_v2`, driven by a bare loop in "
            f"{run['processes']} processes (claim up to {run['concurrency']}, finalize them at "
            f"once, no handler): **{fmt(floor)} jobs/s**. The worker drains at {fmt(drain)} "
            f"jobs/s, {drain / floor:.0%} of what its SQL allows.",
        ]
    lines += probes(systems.get(US, {}))
    lines += [
        "",
        "## Details",
        "",
        "| system | version | steady completion (offered) | pinned completion | pinned e2e p95 "
        "(ms) | dead tuples clean → pinned | table growth under the pin | drain rounds (jobs/s) |",
        "|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for n in names:
        s = systems[n]
        rounds = ", ".join(fmt(v) for v in s.get("drain_jobs_per_s_rounds", []))
        lines.append(
            f"| {n} | {s['version']} | {fmt(s.get('steady_completion_jobs_per_s'))} "
            f"({fmt(s.get('steady_offered_jobs_per_s'))}) | "
            f"{fmt(s.get('pinned_completion_jobs_per_s'))} | {fmt(s.get('pinned_e2e_p95_ms'))} | "
            f"{fmt(s.get('dead_tuples_clean'))} → {fmt(s.get('dead_tuples_pinned'))} | "
            f"{fmt((s.get('pinned_table_growth_bytes') or 0) / 1024)} KiB | {rounds} |"
        )
    lines += [
        "",
        "## How each figure is measured",
        "",
        "- **Enqueue**: one connection; single = the system's per-job API, each call its own "
        "committed transaction; bulk = its bulk API in calls of 1,000. The job count in the "
        "database is checked afterwards.",
        "- **Drain**: N no-op jobs pre-enqueued with the bulk API (then `VACUUM ANALYZE` and "
        "`CHECKPOINT`), the workers started; the rate is N over the time from the first job's "
        "start to the last job's finish, read from the system's own tables on the database "
        "clock, once the database counts all N finished (or the cap struck: then the finished "
        "count over that window).",
        "- **Pickup**: idle workers (warmed up), jobs enqueued one per transaction at a fixed "
        "rate; latency = handler start minus enqueue commit. Both ends are database-clock "
        "readings (`clock_timestamp()` in a ledger row written right after the commit and by "
        "the handler), so their one-way delays cancel.",
        "- **Steady**: the same at a higher fixed rate (credit on real elapsed time) with a 1 ms "
        "handler; end-to-end = handler end minus enqueue commit; completion rate = jobs "
        "finished within the producer's window over its length. A system that falls behind is "
        "waited for (as long as the producer ran, at least 30 s); jobs still unfinished then are "
        "left out of the percentiles, which the table marks as lower bounds.",
        "- **Drain, sync handlers**: the drain with a plain `def` no-op handler, for every "
        "system that runs sync handlers (awa_django: its handler thread pool; procrastinate: "
        "`sync_to_async` on the event loop's default thread pool; Chancy: `ThreadedExecutor`; "
        "django-tasks-db: always sync). PgQueuer 1.x refuses sync entrypoints, so it has none.",
        "- **Drain, default settings**: the drain with each worker started as the system ships "
        "it: no concurrency, batch or polling option set (the queue name only where one is "
        "needed), sync and async handlers where the system has both. The configurations below "
        "name each system's defaults.",
        "- **Enqueue inside atomic** (awa_django): `with transaction.atomic(): job.enqueue()` "
        "against `with transaction.atomic():` one bare `INSERT ... RETURNING id` into a "
        "two-column table (what `Model.objects.create` sends), same Django connection, in "
        "alternating blocks of 50.",
        "- **claim_v3 of one job** (awa_django): `awa.claim_v3('peers', 1)` then "
        "`awa.finalize_v2` of that job, in a loop over a pre-enqueued queue with its default 4 "
        "enqueue shards. Server time is read inside the server by a PL/pgSQL wrapper "
        "(`clock_timestamp()` around the call: no parse, plan or commit, as in "
        "pg_stat_statements, which the run does not load because `shared_preload_libraries` "
        "would tax every system); client round trips minus an empty `SELECT 1` round trip are "
        "given beside it (they include the commit).",
        "- **Pinned**: steady again while another connection holds a `REPEATABLE READ` "
        "transaction with an assigned xid for the whole run; dead tuples are exact "
        "(`pgstattuple`) over every table the system owns, read at the end while the pin is "
        "still held; table growth is the change of their total size (indexes and TOAST "
        "included).",
        "",
        "## Each system's defaults (the default-settings drains)",
        "",
        *DEFAULTS_TEXT,
        "",
        "## Configuration of every system",
        "",
    ]
    for n in names:
        lines += [f"### {n} {systems[n]['version']}", "", "```json",
                  json.dumps(systems[n]["config"], indent=2), "```", ""]  # fmt: skip
        for variant, config in systems[n].get("variants", {}).items():
            lines += [f"- {VARIANTS.get(variant, variant)}: {config.get('worker')}; handlers "
                      f"{config.get('handlers')}"]  # fmt: skip
        if systems[n].get("variants"):
            lines.append("")
    if json_path is not None:
        lines.append(f"Raw figures: `{json_path.name}` (from `benchmarks/run --output`).")
    return "\n".join(lines).rstrip() + "\n"


# What "default settings" means for each system: its worker started with no option but the
# queue it must serve, as its docs start it. Each is what the installed version ships.
DEFAULTS_TEXT = [
    "- **awa_django**: `manage.py awa_worker`, no option, once per process: `AWA['CONCURRENCY']` "
    "= 32 jobs at once per process (async and sync handlers alike; sync ones in its handler "
    "thread pool), every queue discovered, LISTEN/NOTIFY on, maintenance leader election on.",
    "- **procrastinate**: `App.run_worker_async()` with no argument: concurrency 1, every queue, "
    "LISTEN/NOTIFY on with a 5 s poll fallback, jobs kept (`delete_jobs=never`); sync tasks run "
    "through asgiref's `sync_to_async` on the event loop's default thread pool.",
    "- **PgQueuer**: `PgQueuer.run()` with no argument: dequeue batches of 10, no "
    "`max_concurrent_tasks` cap, 30 s dequeue timeout (LISTEN/NOTIFY wake-ups). Async "
    "entrypoints only: 1.x raises `TypeError` for a sync one.",
    "- **django-tasks-db**: `manage.py db_worker` with no option: queue `default`, one task at a "
    "time, 1 s poll interval, a random start-up delay (outside the measured window, which starts "
    "at the first job's start). Sync tasks only.",
    "- **Chancy**: `Queue('peers')` declared with no option: the `ProcessExecutor` (a process "
    "pool), concurrency = the CPU count, a 5 s polling interval, no eager polling; async jobs run "
    "in the same executor.",
]

VARIANTS = {
    "sync": "Sync handlers",
    "default_async": "Default settings, async handlers",
    "default_sync": "Default settings, sync handlers",
}


def probes(ours: dict[str, Any]) -> list[str]:
    """awa_django's enqueue-inside-atomic and claim-one figures (empty when not measured)."""
    lines: list[str] = []
    if ours.get("enqueue_atomic_jobs_per_s"):
        lines += [
            "",
            "## Enqueue inside the caller's transaction",
            "",
            f"`with transaction.atomic(): job.enqueue(...)`: "
            f"**{fmt(ours['enqueue_atomic_jobs_per_s'])} jobs/s**; a bare one-row INSERT per "
            f"atomic block on the same connection: {fmt(ours.get('insert_atomic_rows_per_s'))} "
            f"rows/s; ratio {fmt(ours.get('enqueue_atomic_vs_insert'), 'ratio')}.",
        ]
    if ours.get("claim_one_server_p50_us") is not None:
        lines += [
            "",
            "## One claim, one finalize",
            "",
            "`awa.claim_v3(queue, 1)` (the worker's claim) on a queue of "
            f"{ours.get('claim_one_shards', '?')} "
            f"enqueue shards, server time p50 **{fmt(ours['claim_one_server_p50_us'])} µs** "
            f"(p95 {fmt(ours.get('claim_one_server_p95_us'))} µs); `awa.finalize_v2` of the job "
            f"p50 {fmt(ours.get('finalize_one_server_p50_us'))} µs; both "
            f"{fmt(ours.get('claim_finalize_server_p50_us'))} µs. Client round trips minus an "
            f"empty `SELECT 1` ({fmt(ours.get('select1_rtt_p50_us'))} µs), commit included: "
            f"claim {fmt(ours.get('claim_one_rtt_minus_select1_p50_us'))} µs, finalize "
            f"{fmt(ours.get('finalize_one_rtt_minus_select1_p50_us'))} µs.",
        ]
    return lines


def chart(data: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    systems = data["systems"]
    names = list(systems)
    colors = ["#1f6feb" if n == US else "#8c959f" for n in names]
    panels = [
        ("drain_jobs_per_s", "Drain (jobs/s)"),
        ("enqueue_single_jobs_per_s", "Enqueue, one per transaction (jobs/s)"),
        ("enqueue_bulk_jobs_per_s", "Enqueue, bulk (jobs/s)"),
        ("dead_tuples_pinned", "Dead tuples after the pinned run"),
    ]
    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    for ax, (metric, title) in zip(axes.flat, panels, strict=True):
        values = [systems[n].get(metric) or 0 for n in names]
        bars = ax.bar(range(len(names)), values, color=colors)
        ax.set_title(title)
        ax.margins(y=0.2)
        ax.set_xticks(range(len(names)), names, rotation=25, ha="right", fontsize=8)
        if metric == "dead_tuples_pinned":
            ax.set_yscale("symlog", linthresh=10)
        else:
            ax.set_yscale("log")
        for bar, value in zip(bars, values, strict=True):
            ax.annotate(f"{value:,.0f}", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                        ha="center", va="bottom", fontsize=7)  # fmt: skip
    fig.suptitle(
        f"awa_django and peers, PostgreSQL {data['postgres']['server_version'].split()[0]}, "
        f"{data['machine']['cpus']} CPUs ({'quick' if data['run']['quick'] else 'full'} run)"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write(
    data: dict[str, Any], md_path: Path, png_path: Path, json_path: Path | None = None
) -> list[Path]:
    """Write the report and its chart; return their paths."""
    chart(data, png_path)
    md_path.write_text(markdown(data, png_path, json_path or md_path.with_suffix(".json")))
    return [md_path, png_path]
