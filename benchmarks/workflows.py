"""What workflows and batches cost next to plain jobs, measured side by side in one run.

    .venv/bench/bin/python benchmarks/workflows.py [--chains 1000] [--batch 100000] [--rounds 5]

On a fresh embedded PostgreSQL 18 (durability on), one database, interleaved rounds (ABAB):

* chain: ``--chains`` chains of 10 steps (one ``awa.workflow_enqueue_v1`` per chain) against
  the same number of plain jobs enqueued 10 per ``awa.enqueue_v1`` call (``chain``), and one
  per call of ``awa.enqueue_one_v2``, the statement of ``Job.enqueue()`` (``chain1``); each
  side claimed (256 per call) and finalized as a worker does until nothing is left. Reports
  server CPU (the backend's user+system time) and wall time per job, and the ratio
  chain/plain.
* fan: one workflow of a root, 998 parallel steps and a sink (1,000 steps) against 1,000 plain
  jobs, the same way.
* batch: one batch of ``--batch`` members and an ``on_complete`` callback against as many plain
  jobs (enqueued 500 per call); members' throughput, ratio, and how long after the last
  member's completion the callback was in its queue (its run_at against that finalize).
* pinned: the chain round again while another session holds a snapshot (the MVCC horizon
  pinned): the dead tuples each workflow table holds after it, per workflow and per step.
* release latency (``--latency N``): an idle ``awa_worker``, N two-step chains and N plain jobs
  enqueued alternately at 20/s: the plain job's pickup (claim minus enqueue) against the second
  step's (claim minus the first step's finalize), p50/p95 in ms.

Prints medians and ratios; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from common import ROOT, with_server

STEP = {"kind": "benchmarks.benchjobs.noop", "queue": "wfbench"}


class Session:
    """One autocommit connection and its backend's CPU clock."""

    def __init__(self) -> None:
        import psycopg
        from django.db import connection

        connection.ensure_connection()
        self.conn = psycopg.connect(os.environ["DATABASE_URL"], autocommit=True)
        self.pid = self.conn.execute("SELECT pg_backend_pid()").fetchone()[0]  # type: ignore[index]

    def cpu(self) -> float:
        fields = Path(f"/proc/{self.pid}/stat").read_text().split()
        return (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK")

    def drain(self) -> int:
        """Claim and finalize (completed) until neither the queue nor a workflow has work."""
        from awa_django.db import storage
        from awa_django.db.storage import Finalization

        n = 0
        while True:
            claimed = storage.claim(self.conn, "wfbench", 256)
            if not claimed:
                waiting = self.conn.execute("SELECT count(*) FROM awa.workflow_waiting").fetchone()
                if not waiting or not waiting[0]:
                    return n
                continue
            done = [Finalization(c.job_id, c.run_lease, c.claim_slot, "completed") for c in claimed]
            if storage.finalize(self.conn, done):
                raise SystemExit("a finalization was refused as stale")
            n += len(claimed)

    def measure(self, enqueue: Any) -> tuple[float, float, int, float]:
        """Server CPU and wall seconds of ``enqueue()`` plus the drain, jobs run, and the
        server CPU of the enqueue alone."""
        c0, w0 = self.cpu(), time.perf_counter()
        enqueue()
        c1 = self.cpu()
        n = self.drain()
        return self.cpu() - c0, time.perf_counter() - w0, n, c1 - c0


def chain_spec(i: int) -> str:
    steps = [{"step": "s0", "job": STEP}]
    steps += [{"step": f"s{k}", "job": STEP, "after": [f"s{k - 1}"]} for k in range(1, 10)]
    return json.dumps({"name": f"chain {i}", "steps": steps})


def fan_spec() -> str:
    steps: list[dict[str, Any]] = [{"step": "root", "job": STEP}]
    steps += [{"step": f"m{k}", "job": STEP, "after": ["root"]} for k in range(998)]
    steps.append({"step": "sink", "job": STEP, "after": [f"m{k}" for k in range(998)]})
    return json.dumps({"name": "fan", "steps": steps})


Rounds = list[tuple[float, float, float]]


def rounds(s: Session, a: Any, b: Any, n: int) -> tuple[Rounds, Rounds]:
    out: tuple[Rounds, Rounds] = ([], [])
    for r in range(n):
        for side in (0, 1) if r % 2 == 0 else (1, 0):
            cpu, wall, jobs, enq = s.measure((a, b)[side])
            out[side].append((cpu / jobs * 1e6, wall / jobs * 1e6, enq / jobs * 1e6))
        s.conn.execute("VACUUM awa.workflow_waiting, awa.workflows")
    return out


def report(label: str, plain: Rounds, flow: Rounds) -> None:
    pc, pw, pe = (statistics.median(x[i] for x in plain) for i in range(3))
    fc, fw, fe = (statistics.median(x[i] for x in flow) for i in range(3))
    print(
        f"{label:6} per job: plain {pc:6.1f} us CPU (enqueue {pe:5.1f}) {pw:6.1f} us wall | "
        f"workflow {fc:6.1f} us CPU (enqueue {fe:5.1f}) {fw:6.1f} us wall | ratio CPU "
        f"{fc / pc:.2f} wall {fw / pw:.2f}  "
        "(wall by round: "
        + ", ".join(f"{f[1] / p[1]:.2f}" for p, f in zip(plain, flow, strict=True))
        + ")"
    )


def run(args: argparse.Namespace) -> None:
    s = Session()
    ten = json.dumps([STEP] * 10)
    specs = [chain_spec(i) for i in range(args.chains)]

    def plain_chains() -> None:
        for _ in range(args.chains):
            s.conn.execute("SELECT count(*) FROM awa.enqueue_v1(%s::jsonb)", [ten])

    def chains() -> None:
        for spec in specs:
            s.conn.execute("SELECT count(*) FROM awa.workflow_enqueue_v1(%s::jsonb)", [spec])

    from awa_django.db.enqueue import _one_values, sql_limit_values
    from awa_django.sql import query
    from benchmarks import benchjobs

    single = query("enqueue_one")
    values = _one_values(benchjobs.noop.using(queue="wfbench").prepare(0), sql_limit_values())

    def plain_singles() -> None:
        for _ in range(args.chains * 10):
            s.conn.execute(single, values)

    s.measure(plain_chains)  # warm-up
    s.measure(chains)
    s.measure(plain_singles)
    plain, flow = rounds(s, plain_chains, chains, args.rounds)
    report("chain", plain, flow)
    plain, flow = rounds(s, plain_singles, chains, args.rounds)
    report("chain1", plain, flow)

    fan, thousand = fan_spec(), json.dumps([STEP] * 1000)
    plain, flow = rounds(
        s,
        lambda: s.conn.execute("SELECT count(*) FROM awa.enqueue_v1(%s::jsonb)", [thousand]),
        lambda: s.conn.execute("SELECT count(*) FROM awa.workflow_enqueue_v1(%s::jsonb)", [fan]),
        args.rounds,
    )
    report("fan", plain, flow)

    members = json.dumps(
        {
            "name": "batch",
            "kind": "batch",
            "steps": [{"job": STEP}] * args.batch
            + [{"step": "on_complete", "job": STEP, "after": "*", "on_failure": "run"}],
        }
    )
    five_hundred = json.dumps([STEP] * 500)

    def plain_batch() -> None:
        for _ in range(args.batch // 500):
            s.conn.execute("SELECT count(*) FROM awa.enqueue_v1(%s::jsonb)", [five_hundred])

    def one_batch() -> None:
        s.conn.execute("SELECT count(*) FROM awa.workflow_enqueue_v1(%s::jsonb)", [members])

    plain, flow = rounds(s, plain_batch, one_batch, max(3, args.rounds // 2))
    report("batch", plain, flow)
    lag = s.conn.execute(
        "SELECT extract(epoch FROM r.run_at - (SELECT max(d.finalized_at) FROM awa.done_entries d "
        " JOIN awa.workflow_steps m ON m.job_id = d.job_id AND m.workflow_id = st.workflow_id "
        " WHERE m.step <> 'on_complete')) * 1000 "
        "FROM awa.workflow_steps st JOIN awa.ready_entries r ON r.job_id = st.job_id "
        "WHERE st.step = 'on_complete' ORDER BY st.job_id DESC LIMIT 1"
    ).fetchone()
    print(f"batch  callback in its queue {lag[0]:.1f} ms after the last member's finalize")  # type: ignore[index]

    pinned(s, specs[: args.chains])
    if args.latency:
        latency(args.latency)


def pinned(s: Session, specs: list[str]) -> None:
    import psycopg

    tables = ("workflows", "workflow_steps", "workflow_edges", "workflow_waiting")
    s.conn.execute("VACUUM " + ", ".join(f"awa.{t}" for t in tables))

    def dead() -> dict[str, int]:
        s.conn.execute("SELECT pg_stat_force_next_flush()")
        rows = s.conn.execute(
            "SELECT relname, n_dead_tup FROM pg_stat_user_tables WHERE schemaname = 'awa' "
            "AND relname = ANY(%s)",
            [list(tables)],
        ).fetchall()
        return dict(rows)

    before = dead()
    with psycopg.connect(os.environ["DATABASE_URL"]) as holder:
        holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        holder.execute("SELECT count(*) FROM awa.workflows").fetchone()  # the snapshot, held
        s.measure(
            lambda: [
                s.conn.execute("SELECT count(*) FROM awa.workflow_enqueue_v1(%s::jsonb)", [x])
                for x in specs
            ]
        )
        after = dead()
        holder.rollback()
    grew = {t: after.get(t, 0) - before.get(t, 0) for t in tables}
    steps = 10 * len(specs)
    print(
        f"pinned {len(specs)} chains of 10 under a held snapshot: dead tuples "
        + ", ".join(f"{t} {n}" for t, n in grew.items())
        + f"; {sum(grew.values()) / len(specs):.1f} per workflow, "
        f"{sum(grew.values()) / steps:.2f} per step (edges: 9 per chain)"
    )


def latency(n: int) -> None:
    from django.db import connection

    from awa_django import chain
    from benchmarks import benchjobs

    benchjobs.anoop.enqueue(-1)
    command = [sys.executable, "-m", "django", "awa_worker", "--no-maintenance"]
    worker = subprocess.Popen(
        [*command, "--queue", "bench-async=16"],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        time.sleep(3)
        plain, second = [], []
        for i in range(n):
            plain.append(benchjobs.anoop.enqueue(i).id)
            run = chain(benchjobs.anoop.prepare(i), benchjobs.anoop.prepare(i)).enqueue()
            second.append((run.jobs["anoop"].id, run.jobs["anoop-2"].id))
            time.sleep(0.05)
        time.sleep(3)
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT percentile_cont(ARRAY[0.5, 0.95]) WITHIN GROUP (ORDER BY ms) FROM ("
                "SELECT extract(epoch FROM c.claimed_at - r.created_at) * 1000 AS ms "
                "FROM awa.claims c JOIN awa.ready_entries r ON r.job_id = c.job_id "
                "AND r.lane_id = c.lane_id AND r.lane_seq = c.lane_seq "
                "WHERE c.job_id = ANY(%s)) x",
                [plain],
            )
            p = cursor.fetchone()[0]
            cursor.execute(
                "SELECT percentile_cont(ARRAY[0.5, 0.95]) WITHIN GROUP (ORDER BY ms) FROM ("
                "SELECT extract(epoch FROM c.claimed_at - d.finalized_at) * 1000 AS ms "
                "FROM unnest(%s::bigint[], %s::bigint[]) AS u(a, b) "
                "JOIN awa.done_entries d ON d.job_id = u.a JOIN awa.claims c ON c.job_id = u.b) x",
                [[a for a, _ in second], [b for _, b in second]],
            )
            q = cursor.fetchone()[0]
    finally:
        worker.terminate()
        worker.wait(30)
    print(
        f"latency plain pickup p50 {p[0]:.1f} ms p95 {p[1]:.1f} ms | chain release to start "
        f"p50 {q[0]:.1f} ms p95 {q[1]:.1f} ms ({n} each)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--chains", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--latency", type=int, default=200, help="chains for the latency (0: off)")
    args = parser.parse_args()
    with_server("bench-workflows", lambda: run(args))


if __name__ == "__main__":
    main()
