"""Workers under faults and load with ``CLAIM_BATCH_SIZE`` at its default of 512.

A worker with 512 slots for a queue now claims up to 512 jobs in one ``claim_v3`` statement. These
tests run real ``awa_worker`` subprocesses against the test database and wait on database state: a
SIGKILL or SIGTERM with hundreds of attempts in flight, weights between the old and the new batch
bound and above it (with a global limit), hundreds of deadlines firing at once, 512 sync handlers at
once, hostile values of the setting and big arguments claimed 512 at a time. Handlers
(tests/jobs/claim_batches.py) log each attempt's start and end to a file, from which the tests check
that no attempt identity ``(job_id, run_lease)`` ran twice and that no limit was exceeded; the
ledger (``awa.done_entries``) says every job ended exactly once."""

from __future__ import annotations

import random
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest

from awa_django import enqueue_many
from tests.jobs import claim_batches, worker_env
from tests.support.database import pg
from tests.support.polling import wait_for
from tests.support.processes import ManagedProcess

pytestmark = [pytest.mark.worker, pytest.mark.usefixtures("clean_awa")]

Start = Callable[..., ManagedProcess]


def worker(
    manage_py: Start, log: Path, *args: str, settings: dict[str, Any] | None = None
) -> ManagedProcess:
    return manage_py(
        "awa_worker",
        *args,
        extra_env={
            **worker_env(claim_batches, **(settings or {})),
            "CB33_LOG": str(log),
        },
    )


def enqueue(handle: Any, n: int, *args: Any, **using: Any) -> list[int]:
    h = handle.using(**using) if using else handle
    ids: list[int] = []
    for lo in range(0, n, 2000):
        ids += [e.id for e in enqueue_many([h.prepare(*args) for _ in range(min(2000, n - lo))])]
    return ids


def ledger() -> dict[int, list[tuple[int, str]]]:
    """job_id -> [(run_lease, state)] of every terminal fact."""
    rows: dict[int, list[tuple[int, str]]] = defaultdict(list)
    with pg() as conn:
        for job_id, lease, state in conn.execute(
            "SELECT job_id, run_lease, state FROM awa.done_entries"
        ):
            rows[job_id].append((lease, state))
    return rows


def dlq_ids() -> list[int]:
    with pg() as conn:
        return [r[0] for r in conn.execute("SELECT job_id FROM awa.dlq_entries")]


def running(queue: str = "cb33") -> int:
    with pg() as conn:
        row = conn.execute(
            "SELECT count(*) FROM awa.live_jobs WHERE queue = %s AND state = 'running'", [queue]
        ).fetchone()
    return int(row[0]) if row else 0


def done_count() -> int:
    with pg() as conn:
        row = conn.execute("SELECT count(DISTINCT job_id) FROM awa.done_entries").fetchone()
    return int(row[0]) if row else 0


def events(log: Path) -> list[tuple[str, int, int, int, float, int]]:
    if not log.exists():
        return []
    out = []
    for line in log.read_text().splitlines():
        e, j, lease, pid, t, w = line.split()
        out.append((e, int(j), int(lease), int(pid), float(t), int(w)))
    return out


def attempts(log: Path) -> dict[tuple[int, int], dict[str, Any]]:
    """(job_id, run_lease) -> {pid, start, end, weight}; fails on an identity started twice."""
    runs: dict[tuple[int, int], dict[str, Any]] = {}
    twice = []
    for e, j, lease, pid, t, w in events(log):
        key = (j, lease)
        if e == "start":
            if key in runs:
                twice.append(key)
            runs[key] = {"pid": pid, "start": t, "end": None, "weight": w}
        elif key in runs:
            runs[key]["end"] = t
    assert not twice, f"attempt identities started twice: {twice[:10]}"
    return runs


def peak(intervals: Iterable[tuple[float, float, int]]) -> int:
    """The largest sum of weights of intervals open at one instant."""
    points = []
    for start, end, w in intervals:
        points.append((start, 1, w))
        points.append((end, 0, -w))  # ends sort before starts at the same instant
    level = top = 0
    for _, _, delta in sorted(points):
        level += delta
        top = max(top, level)
    return top


def assert_each_completed_once(ids: list[int]) -> dict[int, list[tuple[int, str]]]:
    facts = ledger()
    missing = [i for i in ids if i not in facts]
    twice = {i: facts[i] for i in ids if len(facts.get(i, ())) > 1}
    wrong = {i: facts[i] for i in ids if facts.get(i) and facts[i][0][1] != "completed"}
    assert not missing and not twice and not wrong, (missing[:10], twice, wrong)
    return facts


def test_sigkill_with_512_in_flight_rescued_and_finished_once(
    manage_py: Start, tmp_path: Path
) -> None:
    """A worker with 512 slots holds ~512 slow attempts; SIGKILL; another worker rescues and
    finishes them: each job completes exactly once, no attempt identity runs twice, the killed
    attempts come back with a new run_lease."""
    log = tmp_path / "runs.log"
    ids = enqueue(claim_batches.slow, 1100, 3.0)
    a = worker(manage_py, log, "--queue", "cb33=512")
    # Claimed attempts start on the handler threads a moment after their claim commits: the
    # kill waits until the handlers say so.
    wait_for(
        lambda: running() >= 500 and sum(e == "start" for e, *_ in events(log)) >= 400,
        timeout=30,
        message=a.output,
    )
    a.kill()
    killed = {k for k, v in attempts(log).items() if v["end"] is None}
    assert len(killed) >= 400
    b = worker(manage_py, log, "--queue", "cb33=512")
    wait_for(lambda: done_count() >= len(ids), timeout=45, message=b.output)
    facts = assert_each_completed_once(ids)
    runs = attempts(log)
    for job_id, lease in killed:
        assert facts[job_id][0][0] > lease, (job_id, lease, facts[job_id])
        assert runs[(job_id, lease)]["end"] is None
    b.send_signal(15)
    assert b.wait(20) == 0, b.output()


def test_sigterm_with_512_in_flight_finishes_them_all(manage_py: Start, tmp_path: Path) -> None:
    """SIGTERM while 512 attempts run: every one that started finishes on its first lease
    within SHUTDOWN_TIMEOUT, the worker exits 0, the rest stay available for the next worker."""
    log = tmp_path / "runs.log"
    ids = enqueue(claim_batches.slow, 800, 2.0)
    a = worker(manage_py, log, "--queue", "cb33=512")
    wait_for(lambda: running() >= 500, timeout=30, message=a.output)
    a.send_signal(15)
    assert a.wait(25) == 0, a.output()
    runs = attempts(log)
    assert all(v["end"] is not None for v in runs.values()), "an attempt was cut short"
    facts = ledger()
    started = {j for j, _ in runs}
    assert started <= set(facts), sorted(started - set(facts))[:10]
    assert all(facts[j] == [(1, "completed")] for j in started)
    b = worker(manage_py, log, "--queue", "cb33=512", "--burst")
    assert b.wait(40) == 0, b.output()
    assert_each_completed_once(ids)
    attempts(log)


def test_weights_between_and_above_the_batch_run_within_limits(
    manage_py: Start, tmp_path: Path
) -> None:
    """Weights 129-512, above 512 and 10,000, mixed with weight 1, on a queue with 512 slots in
    each of two processes and a global limit of 600: every job runs (none blocks for ever),
    a process never runs more than 512 units, the fleet never more than 600."""
    log = tmp_path / "runs.log"
    weights = [1] * 300 + [129] * 4 + [200] * 4 + [300] * 4 + [511, 512, 513, 600, 700, 10_000]
    random.Random(33).shuffle(weights)
    ids = []
    for w in weights:
        ids += enqueue(claim_batches.slow, 1, 0.3, weight=w, queue="cb33w")
    settings = dict(QUEUES={"cb33w": {"global_concurrency": 600}})
    a = worker(manage_py, log, "--queue", "cb33w=512", settings=settings)
    b = worker(manage_py, log, "--queue", "cb33w=512", settings=settings)
    wait_for(lambda: done_count() >= len(ids), timeout=50, message=lambda: a.output() + b.output())
    assert_each_completed_once(ids)
    runs = attempts(log)

    # What a job counts as: its weight, at most min(queue slots, CLAIM_BATCH_SIZE) = 512 and at
    # most the global limit (docs/flow.md, "Weights").
    def eff(w: int) -> int:
        return min(w, 512, 600)

    by_pid: dict[int, list[tuple[float, float, int]]] = defaultdict(list)
    for v in runs.values():
        by_pid[v["pid"]].append((v["start"], v["end"], eff(v["weight"])))
    for pid, spans in by_pid.items():
        assert peak(spans) <= 512, (pid, peak(spans))
    fleet = peak(s for spans in by_pid.values() for s in spans)
    assert fleet <= 600, fleet
    for p in (a, b):
        p.send_signal(15)
        assert p.wait(20) == 0, p.output()


def test_512_deadlines_firing_at_once(manage_py: Start, tmp_path: Path) -> None:
    """512 attempts with a 1 s deadline in one process: every handler is told through
    is_cancelled() (none runs on to its 30 s), and with max_attempts=1 each job ends exactly
    once: completed when its late result beat the rescue (the attempt was still open), else
    failed by the rescue."""
    log = tmp_path / "runs.log"
    ids = enqueue(claim_batches.deadline, 512, 30.0, max_attempts=1)
    a = worker(manage_py, log, "--queue", "cb33=512")

    def ended() -> bool:
        return len(set(ledger()) | set(dlq_ids())) >= len(ids)

    wait_for(ended, timeout=40, message=a.output)
    wait_for(
        lambda: sum(1 for e in events(log) if e[0] in ("told", "end")) >= len(ids),
        timeout=15,
        message="every handler to return",
    )
    facts = ledger()
    dlq = Counter(dlq_ids())
    for i in ids:
        n = len(facts.get(i, ())) + dlq[i]
        assert n == 1, (i, facts.get(i), dlq[i])
        if i in facts:
            assert facts[i][0] in ((1, "completed"), (1, "failed")), facts[i]
    runs = attempts(log)
    assert len(runs) == len(ids)
    told = [e for e in events(log) if e[0] == "told"]
    assert len(told) == len(ids), Counter(e[0] for e in events(log))
    assert max(v["end"] - v["start"] for v in runs.values()) < 15
    a.send_signal(15)
    assert a.wait(20) == 0, a.output()


def test_512_sync_handlers_at_once(manage_py: Start, tmp_path: Path) -> None:
    """Sync handlers with 512 slots: the thread pool grows to run hundreds at once, every job
    completes once."""
    log = tmp_path / "runs.log"
    ids = enqueue(claim_batches.sync_slow, 1024, 1.0)
    a = worker(manage_py, log, "--queue", "cb33=512")
    wait_for(lambda: done_count() >= len(ids), timeout=45, message=a.output)
    assert_each_completed_once(ids)
    runs = attempts(log)
    top = peak((v["start"], v["end"], 1) for v in runs.values())
    assert 300 <= top <= 512, top
    a.send_signal(15)
    assert a.wait(20) == 0, a.output()


@pytest.mark.parametrize("value", [0, -1, 1e9, "512", True, None, [512]])
def test_hostile_claim_batch_size_refused_at_start(
    manage_py: Start, tmp_path: Path, value: Any
) -> None:
    """A bad CLAIM_BATCH_SIZE stops the worker at start-up with a message naming it."""
    p = worker(manage_py, tmp_path / "runs.log", "--burst", settings=dict(CLAIM_BATCH_SIZE=value))
    code = p.wait(30)
    assert code != 0, p.output()
    assert "CLAIM_BATCH_SIZE" in p.output(), p.output()


def test_huge_claim_batch_size_is_bounded_by_the_slots(manage_py: Start, tmp_path: Path) -> None:
    """CLAIM_BATCH_SIZE 2**63 (no upper bound in the settings) behaves as 'no bound beyond the
    slots': the worker runs its jobs and exits cleanly."""
    log = tmp_path / "runs.log"
    ids = enqueue(claim_batches.slow, 600, 0.0)
    p = worker(
        manage_py, log, "--queue", "cb33=512", "--burst", settings=dict(CLAIM_BATCH_SIZE=2**63)
    )
    assert p.wait(40) == 0, p.output()
    assert_each_completed_once(ids)


def enqueue_big(n: int, elements: int) -> list[int]:
    """``n`` cb33.big jobs whose argument is a list of ``elements`` ones (2 bytes of JSON each,
    12 bytes of jsonb), through ``enqueue_many`` (COPY), 64 per transaction. One request is
    prepared and sent ``n`` times: checking the same big argument 512 times takes 20 s."""
    request = claim_batches.big.prepare([1] * elements)
    ids: list[int] = []
    for lo in range(0, n, 64):
        ids += [e.id for e in enqueue_many([request] * min(64, n - lo))]
    assert len(set(ids)) == n
    return ids


# 260,000 elements: 520 kB of JSON (half of ARGS_MAX_BYTES), 3.1 MB as jsonb. 384 of them are
# 1.2 GB in one claim, over PostgreSQL's 1 GB limit on one array; 256 of them are 800 MB.
BIG_ELEMENTS = 260_000


def test_half_megabyte_arguments_past_the_array_limit_of_one_claim(
    manage_py: Start, tmp_path: Path
) -> None:
    """384 jobs whose arguments are each half of ARGS_MAX_BYTES (520 kB of JSON: a list of
    small integers, which jsonb stores 6 times larger) on a queue with 512 slots and the default
    CLAIM_BATCH_SIZE: they must run, not fail the claim statement for ever.

    ``claim_v3`` gathers the claimed rows, arguments included, in one array, which PostgreSQL
    caps at 1 GB: a claim of all 384 fails (ProgramLimitExceeded) and writes nothing. The
    worker halves what its claims ask for until they fit (``ClaimCap``) and says so."""
    log = tmp_path / "runs.log"
    ids = enqueue_big(384, BIG_ELEMENTS)
    p = worker(manage_py, log, "--queue", "cb33=512", settings=dict(HEARTBEAT_STALENESS=60.0))
    wait_for(lambda: done_count() >= len(ids), timeout=90, message=p.output)
    assert_each_completed_once(ids)
    out = p.output()
    assert "was too big for the server (ProgramLimitExceeded" in out, out[-2000:]
    assert "claiming at most 256 at a time for now" in out, out[-2000:]
    p.send_signal(15)
    assert p.wait(30) == 0, p.output()


def test_three_processes_share_a_slow_backlog(manage_py: Start, tmp_path: Path) -> None:
    """Three 512-slot processes on one backlog of 1 s jobs: every job completes once; a claim
    never takes more than its free slots, so no process holds jobs it has not started (each
    attempt starts within a second of its claim). The split between processes is reported in
    the assertion message only (balance is not the contract)."""
    log = tmp_path / "runs.log"
    ids = enqueue(claim_batches.slow, 3000, 1.0)
    procs = [worker(manage_py, log, "--queue", "cb33=512") for _ in range(3)]
    wait_for(lambda: done_count() >= len(ids), timeout=45, message=procs[0].output)
    assert_each_completed_once(ids)
    runs = attempts(log)
    split = Counter(v["pid"] for v in runs.values())
    assert len(runs) == len(ids), split
    with pg() as conn:
        late = conn.execute(
            "SELECT count(*), max(extract(epoch FROM attempted_at)) FROM awa.done_entries"
        ).fetchone()
    assert late and late[0] == len(ids)
    for v in runs.values():
        assert v["end"] - v["start"] < 10, v
    for pid, spans in _by_pid(runs).items():
        assert peak(spans) <= 512, (pid, peak(spans), split)
    for p in procs:
        p.send_signal(15)
        assert p.wait(20) == 0, p.output()


def _by_pid(runs: dict[tuple[int, int], dict[str, Any]]) -> dict[int, list[Any]]:
    out: dict[int, list[Any]] = defaultdict(list)
    for v in runs.values():
        out[v["pid"]].append((v["start"], v["end"], 1))
    return out


def test_global_limit_and_serial_keys_with_big_claims(manage_py: Start, tmp_path: Path) -> None:
    """A queue with 512 slots per process and a global limit of 40 on two processes, with
    serial keys: the fleet never runs more than 40 at once, a key never runs two at once,
    every job completes once."""
    log = tmp_path / "runs.log"
    ids = enqueue(claim_batches.slow, 200, 0.1, queue="cb33g")
    keyed: dict[int, str] = {}
    for k in range(8):
        for i in enqueue(claim_batches.slow, 15, 0.05, queue="cb33g", serial_key=f"k{k}"):
            keyed[i] = f"k{k}"
    ids += list(keyed)
    settings = dict(QUEUES={"cb33g": {"global_concurrency": 40}})
    procs = [worker(manage_py, log, "--queue", "cb33g=512", settings=settings) for _ in range(2)]
    wait_for(lambda: done_count() >= len(ids), timeout=45, message=procs[0].output)
    assert_each_completed_once(ids)
    runs = attempts(log)
    fleet = peak((v["start"], v["end"], 1) for v in runs.values())
    assert fleet <= 40, fleet
    for key in set(keyed.values()):
        spans = [(v["start"], v["end"], 1) for (j, _), v in runs.items() if keyed.get(j) == key]
        assert peak(spans) == 1, key
    for p in procs:
        p.send_signal(15)
        assert p.wait(20) == 0, p.output()


def test_512_long_attempts_heartbeated_not_rescued(manage_py: Start, tmp_path: Path) -> None:
    """512 async and then 512 sync attempts in one process each outlive HEARTBEAT_STALENESS
    (2 s in the test settings) twice over: one heartbeat statement keeps them all alive, so
    none is rescued and each completes on its first lease."""
    log = tmp_path / "runs.log"
    ids = enqueue(claim_batches.slow, 512, 4.5) + enqueue(claim_batches.sync_slow, 512, 4.5)
    a = worker(manage_py, log, "--queue", "cb33=512")
    wait_for(lambda: done_count() >= len(ids), timeout=40, message=a.output)
    facts = assert_each_completed_once(ids)
    assert all(facts[i] == [(1, "completed")] for i in ids), "a live attempt was rescued"
    assert "rescued" not in a.output(), a.output()[-2000:]
    runs = attempts(log)
    assert len(runs) == len(ids)
    a.send_signal(15)
    assert a.wait(20) == 0, a.output()
