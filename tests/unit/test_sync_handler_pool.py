"""The sync handler pool (awa_django.worker.threads.HandlerThreads), in-process.

A claim's sync attempts are handed over as one batch: short handlers run back to back on one
thread, an item queued behind a slow handler gets a thread of its own within about
``STEAL_AFTER``, finished items are handed back to the event loop in bulk and never held
behind the next job. tests/worker/test_worker.py and tests/worker/test_worker_faults.py check the
same pool inside real worker processes. Nothing here sleeps: handlers block on events, the test
awaits delivery with a timeout.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

import pytest

import awa_django.worker.threads as threads_module
from awa_django.worker.threads import HandlerThreads


class Item:
    def __init__(self, gate: threading.Event | None = None) -> None:
        self.gate = gate
        self.ran_on: str | None = None
        self.runs = 0


def run(item: Item) -> None:
    item.ran_on = threading.current_thread().name
    item.runs += 1
    if item.gate is not None:
        item.gate.wait(30)


async def delivered_until(
    pool: HandlerThreads[Item], items: list[Item], done: Callable[[list[Item]], bool]
) -> list[Item]:
    got: list[Item] = []
    event = asyncio.Event()

    def deliver(item: Item) -> None:
        got.append(item)
        if done(got):
            event.set()

    pool.bind(asyncio.get_running_loop(), deliver)
    pool.submit_many(items)
    await asyncio.wait_for(event.wait(), 10)
    return got


def test_a_batch_of_short_handlers_runs_on_one_thread_and_each_is_delivered_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A steal interval well above a scheduler hiccup: on a loaded machine (the full parallel
    # suite) a thread descheduled for over 1 ms looks stuck and the loop starts others, which
    # is the pool doing its job, not a thread per job.
    monkeypatch.setattr(threads_module, "STEAL_AFTER", 0.05)
    pool: HandlerThreads[Item] = HandlerThreads(8, run)
    items = [Item() for _ in range(500)]
    got = asyncio.run(delivered_until(pool, items, lambda got: len(got) == len(items)))
    pool.shutdown()
    assert sorted(map(id, got)) == sorted(map(id, items))
    assert all(item.runs == 1 for item in items)
    # Short handlers are left to the thread getting through them: no thread per job.
    assert pool.threads() <= 2


def test_a_job_queued_behind_a_slow_one_gets_a_thread_of_its_own() -> None:
    gate = threading.Event()
    pool: HandlerThreads[Item] = HandlerThreads(4, run)
    slow, quick = Item(gate), Item()
    try:
        # The batch goes to one thread first; the quick item must not wait for the slow one.
        got = asyncio.run(delivered_until(pool, [slow, quick], lambda got: quick in got))
        assert got == [quick]
        assert quick.ran_on != slow.ran_on
    finally:
        gate.set()
        pool.shutdown()


def test_a_finished_item_is_delivered_while_its_thread_runs_the_next_one() -> None:
    gate = threading.Event()
    pool: HandlerThreads[Item] = HandlerThreads(1, run)
    first, slow = Item(), Item(gate)
    try:
        # One thread: the slow item never returns until the end, yet the first is delivered.
        got = asyncio.run(delivered_until(pool, [first, slow], lambda got: first in got))
        assert got == [first]
    finally:
        gate.set()
        pool.shutdown()


def test_a_queued_item_can_be_cancelled_and_a_retired_thread_is_replaced() -> None:
    gate = threading.Event()
    pool: HandlerThreads[Item] = HandlerThreads(1, run)
    stuck, dropped, later = Item(gate), Item(), Item()

    async def scenario() -> list[Item]:
        got: list[Item] = []
        event = asyncio.Event()

        def deliver(item: Item) -> None:
            got.append(item)
            event.set()

        pool.bind(asyncio.get_running_loop(), deliver)
        pool.submit_many([stuck, dropped, later])

        async def taken() -> None:  # the pool's only thread takes the stuck item
            while stuck.ran_on is None:
                await asyncio.sleep(0.001)

        await asyncio.wait_for(taken(), 10)
        assert pool.cancel(dropped)  # still queued: it never runs
        assert not pool.cancel(stuck)  # running: too late
        thread = next(t for t in threading.enumerate() if t.name == stuck.ran_on)
        pool.retire(thread)  # no longer counted: a new thread takes the waiting item
        await asyncio.wait_for(event.wait(), 10)
        assert got == [later] and pool.threads() == 1
        event.clear()
        gate.set()  # the retired thread's handler returns: still delivered, then it exits
        await asyncio.wait_for(event.wait(), 10)
        return got

    try:
        got = asyncio.run(scenario())
    finally:
        gate.set()
        pool.shutdown()
    assert got == [later, stuck]
    assert dropped.runs == 0


def test_a_runner_that_raises_still_hands_its_item_back() -> None:
    # The runner (awa_django.worker.attempts.run_sync) catches everything a handler raises; a
    # bug in it must still not keep a slot forever.
    def broken(item: Item) -> None:
        item.runs += 1
        raise SystemExit("bug")

    pool: HandlerThreads[Item] = HandlerThreads(2, broken)
    items = [Item(), Item()]
    got = asyncio.run(delivered_until(pool, items, lambda got: len(got) == 2))
    pool.shutdown()
    assert sorted(map(id, got)) == sorted(map(id, items))
