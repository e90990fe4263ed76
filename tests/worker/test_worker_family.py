"""One process of an ``awa_worker --processes N`` family answers NOTIFY (awa_django/worker/
family.py): the lock itself, and real supervised worker processes against real Postgres, with a
poll interval long enough that only wake-ups can explain a prompt claim, or short enough to
prove that a job nobody is woken for is still claimed within it."""

from __future__ import annotations

import collections
import logging
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from awa_django.worker.family import FAMILY_PREFIX, Family, sweep_family_files
from tests.jobs import common as testjobs
from tests.jobs import worker_env
from tests.support.database import pg
from tests.support.polling import wait_for
from tests.support.processes import ManagedProcess

Start = Callable[..., ManagedProcess]


# The lock ------------------------------------------------------------------------------------


def test_one_member_leads_and_another_takes_over_when_it_stops(tmp_path: Path) -> None:
    path = tmp_path / "family"
    path.touch()
    first, second = Family(str(path)), Family(str(path))
    assert not first.alone
    assert first.leads()
    assert first.leads()  # still (it holds the lock)
    assert not second.leads()
    first.release()
    assert not first.leads()  # a stopping process answers no note
    assert second.leads()
    second.release()


def test_a_supervisor_sweeps_the_lock_files_of_families_killed_whole(tmp_path: Path) -> None:
    """A family killed whole (supervisor and children by SIGKILL) leaves its lock file: the next
    supervisor removes the files whose supervisor pid is gone, and no other."""
    done = subprocess.Popen(["true"])
    done.wait()
    dead = done.pid  # a pid that has exited
    files = {
        "dead": tmp_path / f"{FAMILY_PREFIX}{dead}-abc",
        "live": tmp_path / f"{FAMILY_PREFIX}{os.getpid()}-abc",
        "no pid": tmp_path / f"{FAMILY_PREFIX}abc",
        "pid 0": tmp_path / f"{FAMILY_PREFIX}0-abc",
        "other": tmp_path / f"other-{dead}-abc",
    }
    for path in files.values():
        path.write_bytes(b"")
    assert sweep_family_files(str(tmp_path)) == 1
    assert {k for k, p in files.items() if p.exists()} == {"live", "no pid", "pid 0", "other"}


def test_a_process_without_a_family_answers_every_note() -> None:
    alone = Family(None)
    assert alone.alone
    assert alone.leads()
    assert Family("").alone


def test_an_unusable_lock_file_answers_every_note(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="awa_django.worker"):
        assert Family(str(tmp_path / "missing")).leads()
    assert "answers every NOTIFY" in caplog.text


def test_a_member_answers_notes_while_the_leader_stops_beating(tmp_path: Path) -> None:
    path = tmp_path / "family"
    path.touch()
    leader, member = Family(str(path), stale_after=0.2), Family(str(path), stale_after=0.2)
    assert Family(str(path)).leader_frozen() is False  # no beat written yet: nothing to judge
    assert leader.leads() and not member.leads()
    assert not member.leader_frozen()  # the leader beat when it took the lock
    assert not leader.leader_frozen()  # never for the leader itself
    wait_for(member.leader_frozen, timeout=10, message="the silent leader to count as frozen")
    leader.beat()
    assert not member.leader_frozen()
    leader.release()
    assert member.leads()


# Real workers --------------------------------------------------------------------------------


def overrides(poll: float) -> dict[str, str]:
    return worker_env(POLL_INTERVAL=poll)


def claimed_by(job_id: int) -> int | None:
    """The pid of the worker process that claimed ``job_id``'s latest attempt (None: not
    claimed yet). A killed process's claim statement in flight still commits on the server
    and its attempt is rescued and run again elsewhere: the latest attempt is the one that
    ran."""
    with pg() as conn:
        row = conn.execute(
            "SELECT r.pid FROM awa.claims c JOIN awa.runtime_instances r "
            "ON r.instance_id = c.worker_id WHERE c.job_id = %s "
            "ORDER BY c.run_lease DESC LIMIT 1",
            [job_id],
        ).fetchone()
    return int(row[0]) if row else None


def state(job_id: int) -> str:
    with pg() as conn:
        row = conn.execute("SELECT state FROM awa.jobs WHERE id = %s", [job_id]).fetchone()
    return str(row[0]) if row else "missing"


def children(count: int, proc: ManagedProcess) -> list[int]:
    """The pids of the family's worker processes, once ``count`` have registered."""
    pids: list[int] = []

    def registered() -> bool:
        with pg() as conn:
            rows = conn.execute("SELECT pid FROM awa.runtime_instances ORDER BY pid").fetchall()
        pids[:] = [int(r[0]) for r in rows]
        return len(pids) == count

    wait_for(registered, timeout=30, message=lambda: f"{count} workers; output:\n{proc.output()}")
    return pids


def leader_of(proc: ManagedProcess) -> int:
    """The pid of the family's leader, from its log line (after a first note)."""
    found = re.findall(r"awa worker pid (\d+) now answers NOTIFY", proc.output())
    assert len(found) == 1, proc.output()
    return int(found[0])


#: How long a claim prompted by a note may take on a loaded machine: well inside the poll
#: interval of 60 s that the tests below give the workers, so only a wake-up explains it.
WOKEN = 30.0


def elect(proc: ManagedProcess) -> int:
    """Run quick jobs until a note made a process the leader (a job enqueued before the
    processes listen is found by their first sweep instead); return the leader's pid."""
    for _ in range(5):
        run_quick(proc, within=WOKEN)
        if "now answers NOTIFY" in proc.output():
            break
    return leader_of(proc)


def run_quick(proc: ManagedProcess, *, within: float) -> tuple[int, float]:
    """Enqueue one quick job on ``slow``; return the pid that claimed it and how long it took
    to complete, failing past ``within`` seconds."""
    job_id = testjobs.overlap_sync.enqueue(0).id
    started = time.monotonic()
    wait_for(
        lambda: state(job_id) == "completed",
        timeout=within,
        message=lambda: f"job {job_id} to complete; output:\n{proc.output()}",
    )
    pid = claimed_by(job_id)
    assert pid is not None
    return pid, time.monotonic() - started


@pytest.mark.worker
@pytest.mark.usefixtures("clean_awa")
def test_one_process_answers_the_notes_of_its_family(manage_py: Start) -> None:
    testjobs.overlap_sync.enqueue(0)  # the queue exists before the workers start
    # POLL_INTERVAL 60 s: a claim within seconds is a wake-up's.
    proc = manage_py("awa_worker", "--processes", "2", "--queue", "slow=4", extra_env=overrides(60))
    children(2, proc)
    first = elect(proc)  # a note made a process the leader
    pids = collections.Counter(run_quick(proc, within=WOKEN)[0] for _ in range(15))
    # The leader's, but for what the other's own claims at start-up may take: a dispatcher's
    # first empty claims are retried after 1 ms, 2, 4, ... up to the poll interval (slots.py,
    # BacklogRetry), and one that falls while a job waits for the leader takes it. Both
    # processes claiming on every note would split them about evenly.
    assert pids[first] >= 13, pids


@pytest.mark.worker
@pytest.mark.usefixtures("clean_awa")
def test_a_leader_without_a_free_slot_hands_the_note_on(manage_py: Start) -> None:
    testjobs.overlap_sync.enqueue(0)
    proc = manage_py("awa_worker", "--processes", "2", "--queue", "slow=1", extra_env=overrides(60))
    children(2, proc)
    leader = elect(proc)  # a note made a process the leader
    busy = testjobs.slow_sync.enqueue(60).id  # holds the one slot of the process claiming it
    wait_for(lambda: state(busy) == "running", timeout=10, message=proc.output)
    holder = claimed_by(busy)  # the leader's, unless the other's start-up claims took it
    pid, _ = run_quick(proc, within=WOKEN)  # a hand-off (or the leader's own claim), not a poll
    assert pid != holder
    assert leader in (holder, pid)


@pytest.mark.worker
@pytest.mark.usefixtures("clean_awa")
def test_the_next_note_finds_a_new_leader_when_the_leader_dies(manage_py: Start) -> None:
    testjobs.overlap_sync.enqueue(0)
    proc = manage_py("awa_worker", "--processes", "2", "--queue", "slow=4", extra_env=overrides(60))
    pids = children(2, proc)
    leader = elect(proc)  # a note made a process the leader
    (other,) = [p for p in pids if p != leader]
    os.kill(leader, signal.SIGKILL)  # the supervisor restarts it, a second later at the soonest
    # The other process (now the leader), or the restarted one if it came up first (its
    # start-up claims may take the job): woken either way, not at the 60 s poll.
    pid, _ = run_quick(proc, within=WOKEN)
    assert pid != leader, (pid, other)


@pytest.mark.worker
@pytest.mark.usefixtures("clean_awa")
def test_the_others_answer_notes_while_the_leader_is_frozen(manage_py: Start) -> None:
    """A leader stopped by SIGSTOP holds the family lock but answers nothing: the other
    process sees it stop beating and answers the notes itself, so jobs are claimed in seconds,
    not at the poll interval (60 s)."""
    testjobs.overlap_sync.enqueue(0)
    proc = manage_py("awa_worker", "--processes", "2", "--queue", "slow=4", extra_env=overrides(60))
    pids = children(2, proc)
    leader = elect(proc)
    (other,) = [p for p in pids if p != leader]
    os.kill(leader, signal.SIGSTOP)
    try:
        for _ in range(3):
            pid, _took = run_quick(proc, within=WOKEN)
            assert pid == other
        assert f"the family's leader (pid {leader}) has not beaten" in proc.output()
    finally:
        os.kill(leader, signal.SIGCONT)


@pytest.mark.worker
@pytest.mark.usefixtures("clean_awa")
def test_a_job_no_process_is_woken_for_is_claimed_within_the_poll_interval(
    manage_py: Start,
) -> None:
    """No lost wake-ups: with the leader frozen (alive, holding the lock, answering nothing),
    the other process still claims the job, on its poll interval or by answering the notes
    once it sees the leader frozen, whichever comes first."""
    testjobs.overlap_sync.enqueue(0)
    poll = 2.0
    proc = manage_py(
        "awa_worker", "--processes", "2", "--queue", "slow=4", extra_env=overrides(poll)
    )
    pids = children(2, proc)
    leader = elect(proc)  # a note made a process the leader
    (other,) = [p for p in pids if p != leader]
    os.kill(leader, signal.SIGSTOP)
    try:
        for _ in range(3):
            pid, _ = run_quick(proc, within=WOKEN)  # polls every 2 s; nobody is woken
            assert pid == other
    finally:
        os.kill(leader, signal.SIGCONT)
