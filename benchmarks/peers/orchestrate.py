"""``benchmarks/run``: every scenario for every system, one Postgres, one JSON, one report.

Each system gets a template database with its schema (installed by its own path) and the
benchmark's ledger; every scenario run gets a fresh clone of it. Throughput scenarios (enqueue,
drain, sync-handler drain, default-settings drain, awa_django's floor, its enqueue-in-atomic
and claim-one probes), pickup latency and steady load run ``--rounds`` times with the systems
interleaved, and the report quotes medians (a single steady run per system let one noisy
minute decide the latency targets); pinned runs once per system.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from benchmarks.peers import report, systems, targets

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

# Durability untouched: fsync, synchronous_commit and full_page_writes stay on. Sizes as in
# benchmarks/common.py; autovacuum at its defaults, as every system would meet it.
SERVER_SETTINGS = {
    "shared_buffers": "1GB",
    "max_wal_size": "16GB",
    "checkpoint_timeout": "30min",
    "wal_buffers": "64MB",
    "max_connections": "300",
}

SIZES = {
    # name: (single enqueues, bulk enqueues, drain jobs, drain cap s, pickup rate/s, pickup s,
    #        steady rate/s, steady s, rounds)
    # A smoke run (the test suite's bench lane): every metric measured, none meaningful.
    # Sized so that the slowest peer's step is a few seconds: the lane's time is the systems'
    # start-ups and waits, not their throughput.
    "quick": {
        "jobs": 100,
        "bulk_jobs": 500,
        "drain_jobs": 300,
        "cap": 4.0,
        "pickup_rate": 40.0,
        "pickup_seconds": 1.0,
        "steady_rate": 100.0,
        "steady_seconds": 1.0,
        "rounds": 1,
        "sweep": [],
        "sync_concurrency": 64,
        "atomic_jobs": 200,
        "claim_jobs": 300,
    },
    "full": {
        "jobs": 2_000,
        "bulk_jobs": 20_000,
        "drain_jobs": 20_000,
        "cap": 20.0,
        "pickup_rate": 50.0,
        "pickup_seconds": 10.0,
        "steady_rate": 200.0,
        "steady_seconds": 25.0,
        "rounds": 3,
        "sweep": [32, 128],
        "sync_concurrency": 64,
        "atomic_jobs": 2_000,
        "claim_jobs": 2_000,
    },
}

METRICS = (
    "drain_jobs_per_s",
    "enqueue_single_jobs_per_s",
    "enqueue_bulk_jobs_per_s",
    "pickup_p50_ms",
    "pickup_p95_ms",
    "pickup_p99_ms",
    "steady_e2e_p50_ms",
    "steady_e2e_p95_ms",
    "dead_tuples_pinned",
    "pinned_vs_clean_throughput",
)
# Required of awa_django alone (its SQL floor and probes).
AWA_METRICS = (
    "floor_jobs_per_s",
    "enqueue_atomic_vs_insert",
    "claim_one_server_p50_us",
)
# awa_django's probes (awa_probes.py): scenario -> the keys of its result kept per round (the
# entry carries their medians).
AWA_PROBES = {
    "enqueue_atomic": (
        "enqueue_atomic_jobs_per_s", "insert_atomic_rows_per_s", "enqueue_atomic_vs_insert",
    ),
    "claim_one": (
        "claim_one_server_p50_us", "claim_one_server_p95_us", "finalize_one_server_p50_us",
        "claim_finalize_server_p50_us", "select1_rtt_p50_us",
        "claim_one_rtt_minus_select1_p50_us", "finalize_one_rtt_minus_select1_p50_us",
        "claim_one_shards",
    ),
}  # fmt: skip


def drain_variants(handlers: list[str]) -> list[tuple[str, str, list[str]]]:
    """(key prefix, handler, drive options) of the extra drains a system with ``handlers``
    runs: sync handlers at the sync concurrency, then default settings per flavour. Keys of
    the results: ``<prefix>_jobs_per_s`` and ``<prefix>_capped``."""
    variants: list[tuple[str, str, list[str]]] = []
    if "sync" in handlers:
        variants.append(("drain_sync", "sync", []))
    for handler in handlers:
        variants.append((f"drain_default_{handler}", handler, ["--defaults"]))
    return variants


class Bench:
    def __init__(self, url: str, args: argparse.Namespace, size: dict[str, Any]) -> None:
        self.url = url
        self.args = args
        self.size = size
        self.logs = args.output.parent / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.admin = psycopg.connect(url, autocommit=True)

    def db_url(self, name: str) -> str:
        parts = urllib.parse.urlsplit(self.url)
        return urllib.parse.urlunsplit(parts._replace(path=f"/{name}"))

    def create(self, name: str, template: str | None = None) -> str:
        self.admin.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )
        statement = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
        if template:
            statement += sql.SQL(" TEMPLATE {}").format(sql.Identifier(template))
        self.admin.execute(statement)
        return self.db_url(name)

    def drop(self, name: str) -> None:
        self.admin.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )

    def drive(
        self, system: str, scenario: str, url: str, *options: str, tag: str = ""
    ) -> dict[str, Any]:
        log = self.logs / f"{system}-{tag or scenario}.log"
        command = [
            sys.executable,
            "-m",
            "benchmarks.peers.drive",
            system,
            scenario,
            "--processes",
            str(self.args.processes),
            "--concurrency",
            str(self.args.concurrency),
            "--sync-concurrency",
            str(self.size["sync_concurrency"]),
            "--log",
            str(log),
            *options,
        ]
        env = {**os.environ, "DATABASE_URL": url, "BENCH_LEDGER_URL": url}
        env.pop("DJANGO_SETTINGS_MODULE", None)
        started = time.perf_counter()
        done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
        with log.open("a") as out:
            out.write(done.stderr)
        if done.returncode != 0:
            raise RuntimeError(
                f"{system} {scenario} failed ({done.returncode}); see {log}:\n{done.stderr[-2000:]}"
            )
        result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
        say(
            f"{system} {tag or scenario}: {summary(result)} ({time.perf_counter() - started:.0f} s)"
        )
        return result

    def run_fresh(self, system: str, scenario: str, *options: str, tag: str = "") -> dict[str, Any]:
        name = f"run_{system}"
        url = self.create(name, template=f"tpl_{system}")
        try:
            return self.drive(system, scenario, url, *options, tag=tag)
        finally:
            self.drop(name)


def summary(result: dict[str, Any]) -> str:
    keys = [
        k
        for k in result
        if k.endswith(("_per_s", "_ms", "_us", "dead_tuples")) and not isinstance(result[k], dict)
    ]
    return ", ".join(f"{k}={result[k]:.4g}" for k in keys[:6] if isinstance(result[k], int | float))


def say(message: str) -> None:
    print(f"bench: {message}", file=sys.stderr, flush=True)


def machine() -> dict[str, Any]:
    model = ""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    mem = Path("/proc/meminfo").read_text().split()[1]
    return {
        "cpus": os.cpu_count(),
        "cpu_model": model,
        "memory_gib": round(int(mem) / 1024 / 1024, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
    }


def postgres_info(conn: psycopg.Connection[Any]) -> dict[str, Any]:
    names = [
        "server_version", "shared_buffers", "max_wal_size", "checkpoint_timeout", "wal_buffers",
        "fsync", "synchronous_commit", "full_page_writes", "autovacuum", "autovacuum_naptime",
        "max_connections", "wal_level",
    ]  # fmt: skip
    info = {}
    for name in names:
        row = conn.execute("SELECT current_setting(%s)", [name]).fetchone()
        info[name] = row[0] if row else None
    return info


#: Steady-load figures of each round whose median the report quotes.
STEADY_MEDIANS = (
    "steady_offered_jobs_per_s", "steady_completion_jobs_per_s", "steady_e2e_p50_ms",
    "steady_e2e_p95_ms", "steady_e2e_p99_ms", "dead_tuples_clean",
)  # fmt: skip


def steady_figures(steady: dict[str, Any]) -> dict[str, Any]:
    """One steady round's figures, under the names the report reads."""
    return {
        "steady_offered_jobs_per_s": steady["offered_rate"],
        "steady_completion_jobs_per_s": steady["completion_jobs_per_s"],
        "steady_e2e_p50_ms": steady["e2e_p50_ms"],
        "steady_e2e_p95_ms": steady["e2e_p95_ms"],
        "steady_e2e_p99_ms": steady["e2e_p99_ms"],
        "steady_unfinished": steady["jobs"] - steady["finished"],
        "dead_tuples_clean": steady["dead_tuples"],
    }


def median(values: list[float]) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def run(args: argparse.Namespace, url: str) -> dict[str, Any]:
    size = {**SIZES["quick" if args.quick else "full"]}
    if args.rounds:
        size["rounds"] = args.rounds
    bench = Bench(url, args, size)
    names = args.systems
    results: dict[str, Any] = {}
    for name in names:
        bench.create(f"tpl_{name}")
        bench.drive(name, "install", bench.db_url(f"tpl_{name}"))
        described = bench.drive(name, "describe", bench.db_url(f"tpl_{name}"))
        results[name] = {
            "version": described["version"],
            "handlers": described["handlers"],
            # The shared shape, unless the system says otherwise (django-tasks-db: 1 per process).
            "config": {
                "processes": args.processes,
                "concurrency": args.concurrency,
                **described["config"],
            },
            "variants": described["variants"],
            "rounds": [],
        }
    for round_no in range(size["rounds"]):
        for name in names:
            row: dict[str, Any] = {}
            row.update(
                bench.run_fresh(
                    name, "enqueue", "--jobs", str(size["jobs"]),
                    "--bulk-jobs", str(size["bulk_jobs"]), tag=f"enqueue-{round_no}",
                )
            )  # fmt: skip
            row.update(
                bench.run_fresh(
                    name, "drain", "--jobs", str(size["drain_jobs"]), "--cap", str(size["cap"]),
                    tag=f"drain-{round_no}",
                )
            )  # fmt: skip
            for prefix, handler, options in drain_variants(results[name]["handlers"]):
                drained = bench.run_fresh(
                    name, "drain", "--jobs", str(size["drain_jobs"]), "--cap", str(size["cap"]),
                    "--handler", handler, "--concurrency", str(size["sync_concurrency"]),
                    *options, tag=f"{prefix.removeprefix('drain_')}-{round_no}",
                )  # fmt: skip
                row[f"{prefix}_jobs_per_s"] = drained["drain_jobs_per_s"]
                row[f"{prefix}_capped"] = drained["drain_capped"]
            if name == "awa_django":
                row.update(
                    bench.run_fresh(
                        name, "floor", "--jobs", str(size["drain_jobs"]),
                        "--cap", str(size["cap"]), tag=f"floor-{round_no}",
                    )
                )  # fmt: skip
                row.update(
                    bench.run_fresh(
                        name, "enqueue_atomic", "--jobs", str(size["atomic_jobs"]),
                        tag=f"enqueue-atomic-{round_no}",
                    )
                )  # fmt: skip
                row.update(
                    bench.run_fresh(
                        name, "claim_one", "--jobs", str(size["claim_jobs"]),
                        tag=f"claim-one-{round_no}",
                    )
                )  # fmt: skip
            pickup = bench.run_fresh(
                name, "latency", "--rate", str(size["pickup_rate"]),
                "--seconds", str(size["pickup_seconds"]), tag=f"pickup-{round_no}",
            )  # fmt: skip
            row.update({f"pickup_p{q}_ms": pickup[f"pickup_p{q}_ms"] for q in (50, 95, 99)})
            row["pickup"] = pickup
            steady = bench.run_fresh(
                name, "latency", "--rate", str(size["steady_rate"]),
                "--seconds", str(size["steady_seconds"]), "--work-ms", "1",
                tag=f"steady-{round_no}",
            )  # fmt: skip
            row.update(steady_figures(steady))
            row["steady"] = steady
            results[name]["rounds"].append(row)
    # Drain at other concurrencies, one round: each peer's best is what awa_django is held to.
    for concurrency in size["sweep"]:
        for name in names:
            if name == "django_tasks_db":
                continue  # one task at a time per process, whatever the setting
            swept = bench.run_fresh(
                name, "drain", "--jobs", str(size["drain_jobs"]), "--cap", str(size["cap"]),
                "--concurrency", str(concurrency), tag=f"drain-c{concurrency}",
            )  # fmt: skip
            results[name].setdefault("drain_sweep", {})[str(concurrency)] = swept[
                "drain_jobs_per_s"
            ]
    for name in names:
        entry = results[name]
        pinned = bench.run_fresh(
            name, "latency", "--rate", str(size["steady_rate"]),
            "--seconds", str(size["steady_seconds"]), "--work-ms", "1", "--pin", tag="pinned",
        )  # fmt: skip
        rounds = entry["rounds"]
        entry["scenarios"] = {"steady": [r["steady"] for r in rounds], "pinned": pinned}
        for key in (
            "drain_jobs_per_s", "enqueue_single_jobs_per_s", "enqueue_bulk_jobs_per_s",
            "pickup_p50_ms", "pickup_p95_ms", "pickup_p99_ms", *STEADY_MEDIANS,
        ):  # fmt: skip
            entry[key] = median([r[key] for r in rounds])
            entry[f"{key}_rounds"] = [r[key] for r in rounds]
        entry["drain_capped"] = any(r["drain_capped"] for r in rounds)
        for prefix, _handler, _options in drain_variants(entry["handlers"]):
            key = f"{prefix}_jobs_per_s"
            entry[key] = median([r[key] for r in rounds])
            entry[f"{key}_rounds"] = [r[key] for r in rounds]
            entry[f"{prefix}_capped"] = any(r[f"{prefix}_capped"] for r in rounds)
        if name == "awa_django":
            for key in ("floor_jobs_per_s", *(k for keys in AWA_PROBES.values() for k in keys)):
                entry[key] = median([r[key] for r in rounds])
                entry[f"{key}_rounds"] = [r[key] for r in rounds]
        # Unfinished jobs of any round mark the latency figures as lower bounds.
        entry["steady_unfinished"] = max(r["steady_unfinished"] for r in rounds)
        clean = entry["steady_completion_jobs_per_s"]
        entry.update(
            {
                "pinned_unfinished": pinned["jobs"] - pinned["finished"],
                "dead_tuples_pinned": pinned["dead_tuples"],
                "pinned_completion_jobs_per_s": pinned["completion_jobs_per_s"],
                "pinned_e2e_p95_ms": pinned["e2e_p95_ms"],
                "pinned_table_growth_bytes": pinned["table_bytes_after"]
                - pinned["table_bytes_before"],
                "pinned_vs_clean_throughput": (
                    pinned["completion_jobs_per_s"] / clean if clean else None
                ),
            }
        )
    for name in names:
        bench.drop(f"tpl_{name}")
    return {
        "machine": machine(),
        "postgres": postgres_info(bench.admin),
        "run": {
            "quick": args.quick,
            "processes": args.processes,
            "concurrency": args.concurrency,
            **size,
            "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        },
        "systems": results,
    }


def required_metrics(name: str, entry: dict[str, Any]) -> list[str]:
    """The metrics a system's entry must carry: every system's, its drain variants' (by the
    handler flavours it has) and, for awa_django, its floor and probes."""
    required = list(METRICS)
    required += [f"{p}_jobs_per_s" for p, _h, _o in drain_variants(entry.get("handlers", []))]
    if name == "awa_django":
        required += AWA_METRICS
    return required


def missing_metrics(data: dict[str, Any]) -> list[str]:
    """``system.metric`` for every required metric that has no value."""
    return [
        f"{name}.{metric}"
        for name, entry in data["systems"].items()
        for metric in required_metrics(name, entry)
        if entry.get(metric) is None
    ]


def parse_systems(value: str) -> list[str]:
    names = [n.strip() for n in value.split(",") if n.strip()]
    unknown = [n for n in names if n not in systems.NAMES]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown system(s) {', '.join(unknown)}; choose from {', '.join(systems.NAMES)}"
        )
    return names


def main() -> None:
    parser = argparse.ArgumentParser(prog="benchmarks/run", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small sizes (a smoke run, < 5 min)")
    parser.add_argument(
        "--systems", type=parse_systems, default=list(systems.NAMES),
        help=f"comma-separated subset of {','.join(systems.NAMES)}",
    )  # fmt: skip
    parser.add_argument(
        "--output", type=Path, default=ROOT / "benchmarks/results/latest.json",
        help="JSON path; the report (.md) and chart (.png) are written next to it",
    )  # fmt: skip
    parser.add_argument("--processes", type=int, default=2, help="worker processes per system")
    parser.add_argument(
        "--concurrency", type=int, default=512, help="jobs in flight per process (all systems)"
    )
    parser.add_argument("--rounds", type=int, default=0, help="rounds of the throughput scenarios")
    parser.add_argument(
        "--publish", action="store_true", help="also write docs/benchmarks.md and its chart"
    )
    args = parser.parse_args()
    args.output = args.output.resolve()
    args.output.parent.mkdir(parents=True, exist_ok=True)

    import pgserver

    started = time.perf_counter()
    # A data dir of its own, so two runs (a developer's and the test suite's) never collide.
    (ROOT / ".pgdata").mkdir(exist_ok=True)
    data_dir = Path(tempfile.mkdtemp(prefix="bench-peers-", dir=ROOT / ".pgdata"))
    url, stop = pgserver.start(data_dir / "data", ephemeral=True, settings=SERVER_SETTINGS)
    try:
        data = run(args, url)
    finally:
        stop()
        shutil.rmtree(data_dir, ignore_errors=True)
    data["run"]["wall_seconds"] = round(time.perf_counter() - started)
    # Issue 14's verdicts, machine-readable beside the figures they come from.
    data["targets"] = [v.as_dict() for v in targets.evaluate(data["systems"])]
    args.output.write_text(json.dumps(data, indent=2, default=str) + "\n")
    say(f"wrote {args.output}")
    missing = missing_metrics(data)
    for path in report.write(data, args.output.with_suffix(".md"), args.output.with_suffix(".png")):
        say(f"wrote {path}")
    if args.publish:
        docs = ROOT / "docs"
        report.write(data, docs / "benchmarks.md", docs / "benchmarks.png")
        (docs / "benchmarks.json").write_text(args.output.read_text())
        say("wrote docs/benchmarks.md, .png and .json")
    if missing:
        raise SystemExit(f"bench: not measured: {', '.join(missing)}")


if __name__ == "__main__":
    main()
