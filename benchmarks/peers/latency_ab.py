"""Latency only, interleaved: the steady and pickup scenarios of ``benchmarks/run`` for a few
systems (or one system from several source trees), round after round, on one embedded server.

    .venv/bench/bin/python -m benchmarks.peers.latency_ab \\
        [--variant awa_django] [--variant base=awa_django@/path/to/other/tree] \\
        [--variant pgqueuer_asyncpg] [--rounds 5] [--steady-seconds 15] [--pickup-seconds 8]

A variant is ``SYSTEM``, or ``LABEL=SYSTEM@ROOT`` to run the system's worker and producer from
another checkout (the driver runs with ``ROOT`` as its working directory, so ``awa_django`` is
imported from there: a before/after comparison in one run). Every scenario run gets a fresh
database cloned from the variant's template. Within a round the variants run in an order that
rotates from round to round, so drift on a shared machine falls on each of them alike.
Prints one line per run and, at the end, medians and per-round ratios to the first variant
that is not awa_django (the reference peer); writes everything as JSON to ``--output``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.peers.orchestrate import SERVER_SETTINGS, Bench

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

KEYS = {
    "steady": ("e2e_p50_ms", "e2e_p95_ms", "e2e_p99_ms", "pickup_p50_ms", "pickup_p95_ms"),
    "pickup": ("pickup_p50_ms", "pickup_p95_ms", "pickup_p99_ms"),
}


def say(message: str) -> None:
    print(f"latency_ab: {message}", file=sys.stderr, flush=True)


class Variant:
    def __init__(self, spec: str) -> None:
        label, _, rest = spec.partition("=")
        if not rest:
            rest, label = label, label
        system, _, root = rest.partition("@")
        self.label = label
        self.system = system
        self.root = Path(root).resolve() if root else ROOT


class Runner(Bench):
    """The databases of ``Bench`` (``db_url``, ``create``, ``drop``), with logs of its own."""

    def __init__(self, url: str, args: argparse.Namespace) -> None:
        super().__init__(url, args, {})
        self.logs = args.output.parent / "logs-ab"
        self.logs.mkdir(parents=True, exist_ok=True)

    def drive_variant(
        self, variant: Variant, scenario: str, url: str, *options: str, tag: str
    ) -> Any:
        log = self.logs / f"{variant.label}-{tag}.log"
        command = [
            sys.executable, "-m", "benchmarks.peers.drive", variant.system, scenario,
            "--processes", str(self.args.processes), "--concurrency", str(self.args.concurrency),
            "--log", str(log), *options,
        ]  # fmt: skip
        env = {**os.environ, "DATABASE_URL": url, "BENCH_LEDGER_URL": url}
        env.pop("DJANGO_SETTINGS_MODULE", None)
        env.pop("PYTHONPATH", None)
        done = subprocess.run(command, cwd=variant.root, env=env, capture_output=True, text=True)
        with log.open("a") as out:
            out.write(done.stderr)
        if done.returncode != 0:
            raise RuntimeError(f"{variant.label} {scenario} failed; see {log}")
        return json.loads(done.stdout.strip().splitlines()[-1])

    def fresh(self, variant: Variant, *options: str, tag: str) -> dict[str, Any]:
        name = f"run_{variant.label}"
        url = self.create(name, template=f"tpl_{variant.label}")
        try:
            result: dict[str, Any] = self.drive_variant(variant, "latency", url, *options, tag=tag)
            return result
        finally:
            self.drop(name)


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def run(args: argparse.Namespace, url: str) -> dict[str, Any]:
    runner = Runner(url, args)
    variants = [Variant(v) for v in args.variant]
    for variant in variants:
        runner.create(f"tpl_{variant.label}")
        runner.drive_variant(
            variant, "install", runner.db_url(f"tpl_{variant.label}"), tag="install"
        )
    rows: dict[str, dict[str, list[dict[str, Any]]]] = {
        v.label: {"steady": [], "pickup": []} for v in variants
    }
    scenarios = {
        "steady": ["--rate", str(args.steady_rate), "--seconds", str(args.steady_seconds),
                   "--work-ms", "1"],
        "pickup": ["--rate", str(args.pickup_rate), "--seconds", str(args.pickup_seconds)],
    }  # fmt: skip
    for round_no in range(args.rounds):
        shift = round_no % len(variants)
        order = variants[shift:] + variants[:shift]
        for scenario in args.scenarios:
            for variant in order:
                result = runner.fresh(variant, *scenarios[scenario], tag=f"{scenario}-{round_no}")
                keep = {k: result[k] for k in KEYS[scenario]}
                keep["unfinished"] = result["jobs"] - result["finished"]
                rows[variant.label][scenario].append(keep)
                say(
                    f"round {round_no} {scenario} {variant.label}: "
                    + ", ".join(f"{k}={v:.3f}" for k, v in keep.items())
                )
    return {"variants": [v.__dict__ | {"root": str(v.root)} for v in variants], "rows": rows}


def summarize(data: dict[str, Any], scenarios: list[str]) -> str:
    labels = [v["label"] for v in data["variants"]]
    systems = {v["label"]: v["system"] for v in data["variants"]}
    reference = next((lab for lab in labels if systems[lab] != "awa_django"), None)
    lines = []
    for scenario in scenarios:
        for key in KEYS[scenario]:
            cells = []
            for label in labels:
                values = [r[key] for r in data["rows"][label][scenario]]
                cell = f"{label} {median(values):.2f}"
                if reference and label != reference:
                    ref = [r[key] for r in data["rows"][reference][scenario]]
                    ratios = [a / b for a, b in zip(values, ref, strict=True) if b]
                    cell += f" ({median(ratios):.2f}x; {', '.join(f'{x:.2f}' for x in ratios)})"
                cells.append(cell)
            lines.append(f"{scenario} {key}: " + " | ".join(cells))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--variant", action="append", required=True)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--scenarios", default="steady,pickup")
    parser.add_argument("--steady-rate", type=float, default=200.0)
    parser.add_argument("--steady-seconds", type=float, default=15.0)
    parser.add_argument("--pickup-rate", type=float, default=50.0)
    parser.add_argument("--pickup-seconds", type=float, default=8.0)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=512)
    parser.add_argument("--output", type=Path, default=ROOT / "benchmarks/results/latency_ab.json")
    args = parser.parse_args()
    args.scenarios = [s for s in args.scenarios.split(",") if s]
    args.output = args.output.resolve()
    args.output.parent.mkdir(parents=True, exist_ok=True)

    import pgserver

    (ROOT / ".pgdata").mkdir(exist_ok=True)
    data_dir = Path(tempfile.mkdtemp(prefix="bench-ab-", dir=ROOT / ".pgdata"))
    url, stop = pgserver.start(
        data_dir / "data", ephemeral=True, settings=SERVER_SETTINGS, use_env=False
    )
    try:
        data = run(args, url)
    finally:
        stop()
        shutil.rmtree(data_dir, ignore_errors=True)
    args.output.write_text(json.dumps(data, indent=2) + "\n")
    print(summarize(data, args.scenarios))


if __name__ == "__main__":
    main()
