"""Run one scenario of one system against ``DATABASE_URL``; print its result as JSON.

    python -m benchmarks.peers.drive SYSTEM SCENARIO [options]

The orchestrator (``benchmarks.peers.orchestrate``) gives every call a fresh database cloned
from the system's template, so no scenario sees another's rows. Workers are real OS processes
started here with the system's own entry point; the producer runs in this process, apart from
them. Latencies are measured on the database clock (see ``queries.sql``: ``produced``/``done``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg

from benchmarks.peers import systems
from benchmarks.peers.sql import LEDGER_URL_ENV, query
from benchmarks.peers.systems.base import HANDLER_ENV, Params, Producer, System

ROOT = Path(__file__).resolve().parents[2]
WARMUP_KEYS = 20
FIRST_KEY = 1_000  # measured keys start here; warm-up keys are below
BULK_BATCH = 1_000


_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """SIGTERM this process when its parent dies, so no worker outlives an interrupted run."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def scalar(conn: psycopg.Connection[Any], sql: str, params: list[Any] | None = None) -> Any:
    row = conn.execute(sql, params).fetchone()
    assert row is not None
    return row[0]


class Workers:
    """The system's worker processes, each in its own session so a stop reaches its children."""

    def __init__(self, system: System, params: Params, mode: str, work_ms: float, log: Path):
        self.procs: list[subprocess.Popen[bytes]] = []
        env = {**os.environ, "BENCH_MODE": mode, "BENCH_WORK_MS": str(work_ms)}
        log.parent.mkdir(parents=True, exist_ok=True)
        self.log = log.open("ab")
        for argv in system.worker_commands(params):
            self.procs.append(
                subprocess.Popen(
                    argv,
                    cwd=ROOT,
                    env=env,
                    stdout=self.log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    preexec_fn=die_with_parent,
                )
            )

    def check(self) -> None:
        for proc in self.procs:
            if proc.poll() is not None:
                raise SystemExit(f"a worker exited early with status {proc.returncode}")

    def stop(self) -> None:
        for proc in self.procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 20
        for proc in self.procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        self.log.close()


@contextlib.contextmanager
def running(
    system: System, params: Params, mode: str, work_ms: float, log: Path
) -> Iterator[Workers]:
    workers = Workers(system, params, mode, work_ms, log)
    try:
        yield workers
    finally:
        workers.stop()


def window(conn: psycopg.Connection[Any], system: System) -> tuple[int, Any, Any]:
    row = conn.execute(query(f"{system.sql_prefix}_window")).fetchone()
    assert row is not None
    return int(row[0] or 0), row[1], row[2]


def finished_count(conn: psycopg.Connection[Any], system: System) -> int:
    """How many jobs finished so far, polled while the workers run: the system's
    ``*_finished`` query when it has one (a cheaper count than its window's), else its window's
    count. The poll shares the machine with the workers, so it must cost little."""
    try:
        sql = query(f"{system.sql_prefix}_finished")
    except KeyError:
        return window(conn, system)[0]
    row = conn.execute(sql).fetchone()
    assert row is not None
    return int(row[0] or 0)


async def scenario_enqueue(system: System, args: argparse.Namespace) -> dict[str, Any]:
    producer = await system.producer()
    try:
        start = time.perf_counter()
        for key in range(args.jobs):
            await producer.one(key)
        single = args.jobs / (time.perf_counter() - start)
        keys = list(range(10_000_000, 10_000_000 + args.bulk_jobs))
        start = time.perf_counter()
        for offset in range(0, len(keys), BULK_BATCH):
            await producer.many(keys[offset : offset + BULK_BATCH])
        bulk = args.bulk_jobs / (time.perf_counter() - start)
    finally:
        await producer.close()
    with psycopg.connect(os.environ["DATABASE_URL"]) as conn:
        stored = scalar(conn, query(f"{system.sql_prefix}_count"))
    if stored != args.jobs + args.bulk_jobs:
        raise SystemExit(f"enqueued {args.jobs + args.bulk_jobs} jobs, the database holds {stored}")
    return {
        "enqueue_single_jobs_per_s": single,
        "enqueue_bulk_jobs_per_s": bulk,
        "enqueue_single_jobs": args.jobs,
        "enqueue_bulk_jobs": args.bulk_jobs,
        "enqueue_bulk_batch": BULK_BATCH,
    }


async def preload(system: System, count: int) -> None:
    producer = await system.producer()
    try:
        keys = list(range(FIRST_KEY, FIRST_KEY + count))
        for offset in range(0, count, BULK_BATCH):
            await producer.many(keys[offset : offset + BULK_BATCH])
    finally:
        await producer.close()
    with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")  # every system starts from the same settled heap
        conn.execute("CHECKPOINT")


def scenario_drain_like(
    system: System, args: argparse.Namespace, worker_system: Any
) -> dict[str, Any]:
    """Pre-enqueue N no-op jobs, start the workers, wait until the database counts N done."""
    asyncio.run(preload(system, args.jobs))
    params = Params(args.processes, args.concurrency, args.handler, args.defaults)
    with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as conn:
        start = time.perf_counter()
        with running(worker_system, params, "noop", 0, args.log) as workers:
            finished = 0
            while finished < args.jobs and time.perf_counter() - start < args.cap:
                time.sleep(0.2)
                workers.check()
                finished = finished_count(conn, system)
            wall = time.perf_counter() - start
        finished, first, last = window(conn, system)
    seconds = (last - first).total_seconds() if first and last else float("nan")
    return {
        "drain_handler": args.handler,
        "drain_defaults": args.defaults,
        "drain_concurrency": None if args.defaults else args.concurrency,
        "drain_jobs": args.jobs,
        "drain_finished": finished,
        "drain_capped": finished < args.jobs,
        "drain_jobs_per_s": finished / seconds if seconds > 0 else 0.0,
        "drain_wall_seconds": wall,
    }


async def paced(
    producer: Producer, ledger: psycopg.AsyncConnection[Any], rate: float, seconds: float
) -> int:
    """Enqueue one job per transaction at ``rate``/s for ``seconds`` (credit on real elapsed
    time); after each commit the ledger takes the database clock. Returns the job count."""
    total = int(rate * seconds)
    produced = query("produced")
    start = time.perf_counter()
    sent = 0
    while sent < total:
        due = min(total, int((time.perf_counter() - start) * rate) + 1)
        if sent >= due:
            await asyncio.sleep(max(0.0, (sent / rate) - (time.perf_counter() - start)))
            continue
        key = FIRST_KEY + sent
        await producer.one(key)
        await ledger.execute(produced, [key])
        sent += 1
    return total


async def run_paced(
    system: System, args: argparse.Namespace, conn: psycopg.Connection[Any], workers: Workers
) -> dict[str, Any]:
    producer = await system.producer()
    ledger = await psycopg.AsyncConnection.connect(os.environ["DATABASE_URL"], autocommit=True)
    await ledger.execute("SET synchronous_commit = off")
    try:
        # Warm-up: the workers are up and have run jobs before anything is measured.
        for key in range(WARMUP_KEYS):
            await producer.one(key)
        wait_done(conn, workers, 0, WARMUP_KEYS, 120)
        total = await paced(producer, ledger, args.rate, args.seconds)
    finally:
        await producer.close()
        await ledger.close()
    done = wait_done(conn, workers, FIRST_KEY, total, max(30.0, args.seconds))
    row = conn.execute(query("latency"), [FIRST_KEY]).fetchone()
    assert row is not None
    count, p50, p95, p99, e50, e95, e99, emax = row
    window_row = conn.execute(query("completed_in_span"), [FIRST_KEY, FIRST_KEY]).fetchone()
    assert window_row is not None
    span, finished_in_span = window_row
    return {
        "jobs": total,
        "finished": done,
        "offered_rate": args.rate,
        "completion_jobs_per_s": float(finished_in_span) / float(span) if span else 0.0,
        "pickup_p50_ms": p50,
        "pickup_p95_ms": p95,
        "pickup_p99_ms": p99,
        "e2e_p50_ms": e50,
        "e2e_p95_ms": e95,
        "e2e_p99_ms": e99,
        "e2e_max_ms": emax,
        "latency_samples": count,
    }


def wait_done(
    conn: psycopg.Connection[Any], workers: Workers, first: int, count: int, timeout: float
) -> int:
    deadline = time.monotonic() + timeout
    done = 0
    while time.monotonic() < deadline:
        done = scalar(conn, query("done_count"), [first])
        if done >= count:
            break
        workers.check()
        time.sleep(0.1)
    return int(done)


def table_stats(conn: psycopg.Connection[Any]) -> dict[str, dict[str, int]]:
    stats = {}
    for (table,) in conn.execute(query("system_tables")).fetchall():
        dead, live, size = conn.execute(query("table_stats"), [table, table]).fetchone() or (
            0,
            0,
            0,
        )
        stats[table] = {"dead": int(dead), "live": int(live), "bytes": int(size)}
    return stats


def scenario_latency(system: System, args: argparse.Namespace) -> dict[str, Any]:
    """Pickup, steady and pinned: paced single enqueues against idle/loaded ledger workers."""
    params = Params(args.processes, args.concurrency)
    url = os.environ["DATABASE_URL"]
    with psycopg.connect(url, autocommit=True) as conn:
        before = table_stats(conn)
        with contextlib.ExitStack() as stack:
            holder = None
            if args.pin:
                holder = stack.enter_context(psycopg.connect(url))
                for statement in query("pin").split(";"):
                    if statement.strip():
                        holder.execute(statement)
            workers = stack.enter_context(running(system, params, "ledger", args.work_ms, args.log))
            result = asyncio.run(run_paced(system, args, conn, workers))
            after = table_stats(conn)  # still pinned, workers still up
            if holder is not None:
                holder.rollback()
    result.update(
        {
            "work_ms": args.work_ms,
            "pinned": args.pin,
            "dead_tuples": sum(t["dead"] for t in after.values()),
            "table_bytes_before": sum(t["bytes"] for t in before.values()),
            "table_bytes_after": sum(t["bytes"] for t in after.values()),
            "tables": after,
        }
    )
    return result


def scenario_floor(system: System, args: argparse.Namespace) -> dict[str, Any]:
    """awa_django's claim and finalize functions in a bare loop (no worker, no handler)."""
    from benchmarks.peers import floor

    result = scenario_drain_like(system, args, floor.FloorWorkers())
    return {"floor_jobs_per_s": result["drain_jobs_per_s"], "floor_jobs": result["drain_finished"]}


async def describe(system: System, args: argparse.Namespace) -> dict[str, Any]:
    """Version, handler flavours and the configuration of every run shape: the main one
    (``config``), sync handlers at ``--sync-concurrency`` and default settings per flavour."""
    shape = Params(args.processes, args.concurrency)
    variants = {}
    if "sync" in system.handlers:
        variants["sync"] = system.config(Params(args.processes, args.sync_concurrency, "sync"))
    for handler in system.handlers:
        variants[f"default_{handler}"] = system.config(
            Params(args.processes, args.concurrency, handler, defaults=True)
        )
    return {
        "version": system.version(),
        "handlers": list(system.handlers),
        "config": system.config(shape),
        "variants": variants,
    }


async def install(system: System, args: argparse.Namespace) -> dict[str, Any]:
    await system.install()
    async with await psycopg.AsyncConnection.connect(
        os.environ["DATABASE_URL"], autocommit=True
    ) as conn:
        await conn.execute(query("ledger_schema"))
    return {}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("system", choices=systems.NAMES)
    parser.add_argument(
        "scenario",
        choices=[
            "install", "describe", "enqueue", "drain", "latency", "floor", "enqueue_atomic",
            "claim_one",
        ],
    )  # fmt: skip
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=128)
    parser.add_argument("--jobs", type=int, default=1_000)
    parser.add_argument("--bulk-jobs", type=int, default=10_000)
    parser.add_argument("--cap", type=float, default=60.0, help="drain: give up after (s)")
    parser.add_argument("--rate", type=float, default=50.0)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--work-ms", type=float, default=0.0)
    parser.add_argument("--pin", action="store_true")
    parser.add_argument(
        "--handler", choices=["async", "sync"], help="default: the system's first flavour"
    )
    parser.add_argument(
        "--defaults", action="store_true", help="drain: workers at the system's own defaults"
    )
    parser.add_argument("--sync-concurrency", type=int, default=64, help="describe only")
    parser.add_argument("--log", type=Path, default=ROOT / "benchmarks/results/logs/worker.log")
    args = parser.parse_args()
    die_with_parent()
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(143))  # runs the finally blocks

    os.environ.setdefault(LEDGER_URL_ENV, os.environ["DATABASE_URL"])
    os.environ["BENCH_SYSTEM"] = args.system
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.peers.django_settings")
    # The producer is one sequential coroutine; Django's sync API inside it is safe here.
    os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    system = systems.get(args.system)
    args.handler = args.handler or system.handlers[0]
    if args.handler not in system.handlers:
        raise SystemExit(f"{args.system} has no {args.handler} handlers")
    os.environ[HANDLER_ENV] = args.handler  # the producer and the workers read it
    result: dict[str, Any]
    if args.scenario == "install":
        result = asyncio.run(install(system, args))
    elif args.scenario == "describe":
        result = asyncio.run(describe(system, args))
    elif args.scenario == "enqueue":
        result = asyncio.run(scenario_enqueue(system, args))
    elif args.scenario == "drain":
        result = scenario_drain_like(system, args, system)
    elif args.scenario == "floor":
        result = scenario_floor(system, args)
    elif args.scenario in ("enqueue_atomic", "claim_one"):
        from benchmarks.peers import awa_probes

        if args.system != "awa_django":
            raise SystemExit(f"{args.scenario} measures awa_django only")
        if args.scenario == "enqueue_atomic":
            result = awa_probes.enqueue_atomic(args.jobs)
        else:
            asyncio.run(preload(system, args.jobs))
            result = awa_probes.claim_one(os.environ["DATABASE_URL"], args.jobs)
    else:
        result = scenario_latency(system, args)
    sys.stdout.write(json.dumps(result, default=str) + "\n")


if __name__ == "__main__":
    main()
