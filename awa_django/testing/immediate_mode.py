"""Immediate mode: each job runs in-process when the transaction that enqueued it commits.

On with ``AWA["TESTING"]["MODE"] = "immediate"`` (test settings) or inside ``immediate()``.
"Commits" is what would commit outside a test:

* in autocommit (no ``atomic()`` block open), at once, after the enqueue;
* inside ``atomic()`` blocks, when the outermost block the code under test opened exits
  without an error; a block that rolls back runs nothing. In a ``TestCase`` (or a
  pytest-django ``db`` test) the test's own blocks never commit, so the release of the
  outermost other block's savepoint stands for the commit (a block opened with
  ``savepoint=False`` has none: the next block in has it); elsewhere
  (``TransactionTestCase``) it is the real commit (``transaction.on_commit``).

It runs the queue's available jobs (the new one among them) through ``drain()``, so in the
test's transaction with the handler's own savepoint, and jobs those jobs enqueue run too. A
job whose handler raised fails the commit's caller with ``ImmediateJobFailed`` (unless
``RAISE_FAILURES`` is False). Process-wide and for one thread at a time, as tests run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Iterator, Sequence
from typing import Any

from django.db import connections, transaction
from django.db.transaction import Atomic

from awa_django.conf import get_awa_settings
from awa_django.db import enqueue
from awa_django.testing.drain import JobRun, drain
from awa_django.types import EnqueuedJob

__all__ = ["ImmediateJobFailed", "immediate"]

#: The most jobs one commit runs (jobs that enqueue jobs included) before it gives up.
MAX_RUNS = 1000


class ImmediateJobFailed(Exception):
    """Jobs run in immediate mode failed (their handler raised, or returned no storable
    result). ``runs`` lists them, each with its ``error`` (type, message, traceback)."""

    def __init__(self, runs: Sequence[JobRun]) -> None:
        self.runs = list(runs)
        lines = []
        for run in self.runs:
            error = run.error or {}
            lines.append(
                f"job {run.id} ({run.kind}, queue {run.queue!r}) {run.outcome}: "
                f"{error.get('type', '?')}: {error.get('message', '')}"
            )
            if error.get("traceback"):
                lines.append(str(error["traceback"]).rstrip())
        super().__init__("\n".join(lines))


@dataclasses.dataclass(slots=True, eq=False)  # by identity: nested blocks look alike
class _Target:
    """Where one commit's runs go: the open ``immediate()`` block's list, and whether a
    failure raises."""

    runs: list[JobRun] | None
    raise_failures: bool


@dataclasses.dataclass(slots=True)
class _State:
    blocks: list[_Target] = dataclasses.field(default_factory=list)
    running: bool = False
    pending: dict[str, set[str]] = dataclasses.field(default_factory=dict)


_state = _State()


@contextlib.contextmanager
def immediate(*, raise_failures: bool = True) -> Iterator[list[JobRun]]:
    """Immediate mode inside the block; yields the list of the jobs run (``JobRun``), which
    fills as transactions commit. ``raise_failures=False``: a failed job is only listed."""
    if not isinstance(raise_failures, bool):
        raise TypeError(f"raise_failures must be a bool, got {raise_failures!r}")
    target = _Target([], raise_failures)
    _state.blocks.append(target)
    try:
        assert target.runs is not None
        yield target.runs
    finally:
        _state.blocks.remove(target)


def _target() -> _Target | None:
    """The immediate mode in force now, or None when it is off."""
    if _state.blocks:
        return _state.blocks[-1]
    testing = get_awa_settings().TESTING
    if testing["MODE"] != "immediate":
        return None
    return _Target(None, bool(testing["RAISE_FAILURES"]))


def _after_enqueue(using: str, jobs: Sequence[EnqueuedJob]) -> None:
    """Called after every enqueue (``awa_django.db.enqueue.after_enqueue``)."""
    target = _target()
    if target is None:
        return
    queues = {job.queue for job in jobs if not job.duplicate and job.state == "available"}
    if not queues:
        return  # scheduled: run by drain(with_scheduled=True), not at commit
    if _state.running:  # enqueued by a job running now: its run picks them up
        _state.pending.setdefault(using, set()).update(queues)
        return
    connection = connections[using]
    if not connection.in_atomic_block:
        _run(using, queues, target)  # autocommit (or manual transactions): run now
        return
    blocks: list[Atomic] = list(connection.atomic_blocks)
    if not any(_from_testcase(block) for block in blocks):
        _raise_after_commit_hooks(connection)
        transaction.on_commit(
            functools.partial(_run_at_commit, connection, using, queues, target), using=using
        )
        return
    # In a TestCase: the outermost block of the code under test stands for the commit. Its
    # savepoint is released when it exits (rolled back first when it failed).
    offset = len(blocks) - len(connection.savepoint_ids)
    sids = [
        connection.savepoint_ids[i - offset]
        for i, block in enumerate(blocks)
        if not _from_testcase(block) and i >= offset
    ]
    sid = next((sid for sid in sids if sid is not None), None)
    if sid is None:
        _run(using, queues, target)  # straight in the test: it would have committed
    else:
        _run_at_release(connection, sid, using, queues, target)


def _run_at_commit(connection: Any, using: str, queues: set[str], target: _Target) -> None:
    """The jobs, at the real commit: a failure is raised once every other ``on_commit``
    callback of the commit has run (the application's own are not skipped)."""
    try:
        _run(using, queues, target)
    except Exception as exc:
        connection.__dict__.setdefault("_awa_failures", []).append(exc)


def _raise_after_commit_hooks(connection: Any) -> None:
    """Make the connection's commit hooks raise, after all of them ran, what the jobs run at
    the commit raised (the first of them)."""
    if "run_and_clear_commit_hooks" in connection.__dict__:
        return
    run_hooks = connection.run_and_clear_commit_hooks

    def run_and_clear_commit_hooks() -> None:
        try:
            run_hooks()
        finally:
            failures = connection.__dict__.pop("_awa_failures", [])
        if failures:
            raise failures[0]

    connection.run_and_clear_commit_hooks = run_and_clear_commit_hooks


def _from_testcase(block: Atomic) -> bool:
    """Whether ``block`` is one a ``TestCase`` (or pytest-django) opened around the test."""
    return bool(getattr(block, "_from_testcase", False))


@dataclasses.dataclass(slots=True)
class _Release:
    """Jobs to run when the savepoint ``sid`` is released, unless it was rolled back first."""

    sid: str
    queues: set[str]
    target: _Target
    rolled_back: bool = False


def _run_at_release(
    connection: Any, sid: str, using: str, queues: set[str], target: _Target
) -> None:
    waiting: list[_Release] = connection.__dict__.setdefault("_awa_releases", [])
    live = set(connection.savepoint_ids)
    waiting[:] = [w for w in waiting if w.sid in live]  # of blocks gone by other ways
    for release in waiting:
        if release.sid == sid:
            release.queues.update(queues)
            return
    waiting.append(_Release(sid, set(queues), target))
    if "savepoint_commit" in connection.__dict__:
        return  # already watched
    commit = connection.savepoint_commit
    rollback = connection.savepoint_rollback

    def savepoint_rollback(sid: str) -> None:
        rollback(sid)
        for release in waiting:
            if release.sid == sid:
                release.rolled_back = True

    def savepoint_commit(sid: str) -> None:
        commit(sid)
        done = [release for release in waiting if release.sid == sid]
        if not done:
            return
        waiting[:] = [release for release in waiting if release.sid != sid]
        if not waiting:  # nothing more to watch: the connection's own methods again
            del connection.savepoint_commit, connection.savepoint_rollback
        for release in done:
            if not release.rolled_back:
                _run(using, release.queues, release.target)

    connection.savepoint_commit = savepoint_commit
    connection.savepoint_rollback = savepoint_rollback


def _run(using: str, queues: set[str], target: _Target) -> None:
    """Drain ``queues`` and what the jobs enqueue; raise for failures if asked to."""
    runs: list[JobRun] = []
    _state.running = True
    try:
        todo = {using: set(queues)}
        while todo:
            alias, names = todo.popitem()
            runs.extend(drain(sorted(names), using=alias, max_jobs=MAX_RUNS - len(runs) + 1))
            if len(runs) > MAX_RUNS:
                raise RuntimeError(
                    f"immediate mode ran more than {MAX_RUNS} jobs for one commit: does a job "
                    "enqueue itself? Use drain(max_jobs=...) to test it."
                )
            for alias, names in _state.pending.items():
                todo.setdefault(alias, set()).update(names)
            _state.pending.clear()
    finally:
        _state.running = False
        _state.pending.clear()
    if target.runs is not None:
        target.runs.extend(runs)
    failed = [run for run in runs if run.outcome in ("retry", "fail")]
    if failed and target.raise_failures:
        raise ImmediateJobFailed(failed)


enqueue.after_enqueue = _after_enqueue
