"""Drain throughput of ``awa_worker`` (embedded PostgreSQL 18 unless DATABASE_URL).

    .venv/dj52/bin/python benchmarks/drain.py [--jobs 50000] [--processes 2] [--rounds 3]
        [--concurrency 512 | --default] [--sync] [--compare-otel]

Each round pre-enqueues N no-op jobs (async by default), then runs
``manage.py awa_worker --burst --processes P --queue Q=C`` (with ``--default``: no ``--queue``,
the default settings, as a new user runs it) and measures, on the database clock,
the time from the first claim to the last completion (and the wall time of the whole command,
start-up included). Every round verifies that all N jobs completed exactly once. Durability is
untouched (fsync and synchronous_commit on). Prints JSON.

``--setting NAME=VALUE`` (repeatable; VALUE is JSON, e.g. ``--setting CLAIM_BATCH_SIZE=128``)
overrides an ``AWA`` setting for the run, the workers included.

``--compare-otel`` runs each round twice, interleaved (the order alternates): once as above,
once with OpenTelemetry metrics on and served for Prometheus (``--metrics-port``: the SDK, its
Prometheus reader and the HTTP server in every worker process), scraped every second during the
drain, and reports both medians and the difference (docs/observability.md, "What it costs").
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import statistics
import threading
import urllib.request

from common import drain, enqueue, with_server


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=50_000)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--default",
        action="store_true",
        help="run awa_worker without --queue: every queue, the default AWA settings",
    )
    parser.add_argument("--sync", action="store_true", help="sync no-op handlers (thread pool)")
    parser.add_argument(
        "--setting",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="override an AWA setting for the run (VALUE is JSON), the workers included",
    )
    parser.add_argument(
        "--compare-otel",
        action="store_true",
        help="each round without and with OpenTelemetry metrics (--metrics-port), interleaved",
    )
    parser.add_argument(
        "--otel-first",
        action="store_true",
        help="with --compare-otel: start the first round with metrics on",
    )
    args = parser.parse_args()
    overrides = {}
    for item in args.setting:
        name, sep, value = item.partition("=")
        if not sep or not name:
            parser.error(f"--setting {item!r}: expected NAME=VALUE")
        try:
            overrides[name] = json.loads(value)
        except ValueError as exc:
            parser.error(f"--setting {item!r}: VALUE is not JSON ({exc})")
    os.environ["AWA_BENCH_SETTINGS"] = json.dumps(overrides)
    with_server("bench", lambda: run(args))


def _free_port(count: int) -> int:
    """A port such that ``count`` consecutive ports from it were free a moment ago."""
    while True:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            base = int(probe.getsockname()[1])
        if base + count >= 65535:
            continue
        try:
            for port in range(base, base + count):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port))
        except OSError:
            continue
        return base


def _scrape_every_second(ports: list[int], stop: threading.Event, scraped: list[int]) -> None:
    while not stop.wait(1.0):
        for port in ports:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                    r.read()
                scraped.append(port)
            except OSError:
                pass  # not serving yet, or already gone


def compare_otel(args: argparse.Namespace) -> None:
    from benchmarks import benchjobs

    handle = benchjobs.noop if args.sync else benchjobs.anoop
    rates: dict[str, list[float]] = {"off": [], "on": []}
    cpu: dict[str, list[float]] = {"off": [], "on": []}
    scraped: list[int] = []
    for index in range(args.rounds):
        order = ("off", "on") if (index + args.otel_first) % 2 == 0 else ("on", "off")
        for mode in order:
            first = enqueue(handle, args.jobs)
            extra: tuple[str, ...] = ()
            stop = threading.Event()
            scraper = None
            if mode == "on":
                port = _free_port(args.processes)
                extra = ("--metrics-port", str(port), "--metrics-host", "127.0.0.1")
                ports = list(range(port, port + args.processes))
                scraper = threading.Thread(
                    target=_scrape_every_second, args=(ports, stop, scraped), daemon=True
                )
                scraper.start()
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            try:
                rate, _wall = drain(
                    handle.options.queue,
                    args.jobs,
                    first,
                    processes=args.processes,
                    concurrency=None if args.default else args.concurrency,
                    extra=extra,
                )
            finally:
                stop.set()
                if scraper is not None:
                    scraper.join()
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            rates[mode].append(rate)
            # CPU time of the worker processes (supervisor and children, start-up included) per
            # job: what the metrics cost the worker, whatever else the machine is doing.
            used = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
            cpu[mode].append(used / args.jobs * 1e6)
    off, on = statistics.median(rates["off"]), statistics.median(rates["on"])
    cpu_off, cpu_on = statistics.median(cpu["off"]), statistics.median(cpu["on"])
    print(
        json.dumps(
            {
                "jobs": args.jobs,
                "processes": args.processes,
                "concurrency": "default" if args.default else args.concurrency,
                "handlers": "sync" if args.sync else "async",
                "otel_off_jobs_per_s_rounds": [round(r) for r in rates["off"]],
                "otel_on_jobs_per_s_rounds": [round(r) for r in rates["on"]],
                "otel_off_median": round(off),
                "otel_on_median": round(on),
                "otel_cost_percent": round(100 * (off - on) / off, 1),
                "worker_cpu_us_per_job_off_rounds": [round(c, 1) for c in cpu["off"]],
                "worker_cpu_us_per_job_on_rounds": [round(c, 1) for c in cpu["on"]],
                "worker_cpu_cost_percent": round(100 * (cpu_on - cpu_off) / cpu_off, 1),
                "scrapes": len(scraped),
            },
            indent=2,
        )
    )


def run(args: argparse.Namespace) -> None:
    if args.compare_otel:
        compare_otel(args)
        return
    from benchmarks import benchjobs

    handle = benchjobs.noop if args.sync else benchjobs.anoop
    rates: list[float] = []
    walls: list[float] = []
    for _ in range(args.rounds):
        first = enqueue(handle, args.jobs)
        rate, wall = drain(
            handle.options.queue,
            args.jobs,
            first,
            processes=args.processes,
            concurrency=None if args.default else args.concurrency,
        )
        rates.append(rate)
        walls.append(wall)
    print(
        json.dumps(
            {
                "jobs": args.jobs,
                "processes": args.processes,
                "concurrency": "default" if args.default else args.concurrency,
                "handlers": "sync" if args.sync else "async",
                "settings": json.loads(os.environ.get("AWA_BENCH_SETTINGS", "{}")),
                "drain_jobs_per_s": round(statistics.median(rates)),
                "drain_jobs_per_s_rounds": [round(r) for r in rates],
                "wall_seconds_rounds": [round(w, 2) for w in walls],
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
