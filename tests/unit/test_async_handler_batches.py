"""The async handlers of one claim run in one task (awa_django/worker/attempts.py,
``_run_async_batch``): a handler that finishes in its first step needs no task of its own; the
first one that suspends keeps the task for its whole run; the jobs after it go on in a new
task. In process, without a database: outcomes are read from the completion batcher's queue.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
from typing import Any

from awa_django.db.storage import ClaimedJob, Finalization
from awa_django.jobs import Job
from awa_django.worker.attempts import Running
from awa_django.worker.config import build_config
from awa_django.worker.runtime import WorkerRuntime

VAR: contextvars.ContextVar[str] = contextvars.ContextVar("awa_test_batch", default="unset")


def claimed(job_id: int, kind: str) -> ClaimedJob:
    return ClaimedJob(
        job_id, 1, 1, 25, 0, kind, '{"args": [], "kwargs": {}}', "q", 0, None, None, None
    )


async def run_batch(
    handlers: dict[str, Any], kinds: list[str], *, timeout: float = 10.0
) -> dict[int, Finalization]:
    """Start one claim of jobs 1..n (of ``kinds``) and wait until every one has an outcome."""
    runtime = WorkerRuntime(build_config(queues=[("q", 64)], concurrency=64, maintenance=False))
    runtime.attempts.bind(asyncio.get_running_loop())
    runtime.attempts.kinds = {
        kind: Job(func, kind, None, takes_context=False) for kind, func in handlers.items()
    }  # type: ignore[arg-type]
    queue = runtime.config.queues[0]
    runtime.slots.add(queue)
    jobs = [claimed(i + 1, kind) for i, kind in enumerate(kinds)]
    runtime.attempts.start_batch(jobs, queue)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while runtime.inflight:
        assert loop.time() < deadline, f"still running: {list(runtime.inflight)}"
        await asyncio.sleep(0.001)
    assert runtime.slots.active == 0
    return {item.job_id: item for item in runtime.batcher.pending}


def test_one_task_for_handlers_that_finish_at_once_and_own_task_for_one_that_suspends() -> None:
    seen: dict[str, list[Any]] = {}
    gate: asyncio.Event | None = None

    async def quick(*_: Any) -> str:
        seen.setdefault("quick", []).append((asyncio.current_task(), VAR.get()))
        VAR.set("quick was here")  # in the job's own context: never seen by the others
        return "ok"

    async def slow(*_: Any) -> None:
        assert gate is not None
        first = asyncio.current_task()
        VAR.set("slow")
        await gate.wait()
        seen["slow"] = [first, asyncio.current_task(), VAR.get()]

    async def opener(*_: Any) -> None:
        assert gate is not None
        await asyncio.sleep(0)
        gate.set()

    async def main() -> dict[int, Finalization]:
        nonlocal gate
        gate = asyncio.Event()
        return await run_batch(
            {"quick": quick, "slow": slow, "opener": opener},
            ["quick", "quick", "slow", "quick", "opener", "quick"],
        )

    outcomes = asyncio.run(main())
    assert sorted(outcomes) == [1, 2, 3, 4, 5, 6]
    assert {o.outcome for o in outcomes.values()} == {"completed"}
    assert outcomes[1].result_json == '"ok"'
    quick_runs = seen["quick"]
    # Jobs 1 and 2 ran in the claim's task, 4 in the task that took over after job 3 suspended.
    assert quick_runs[0][0] is quick_runs[1][0]
    assert quick_runs[2][0] is not quick_runs[0][0]
    assert all(var == "unset" for _, var in quick_runs)
    first, later, var = seen["slow"]
    assert first is later is quick_runs[0][0]  # one task from its first step to its end
    assert var == "slow"


def test_timeout_and_errors_in_a_shared_batch() -> None:
    async def timed(*_: Any) -> None:
        async with asyncio.timeout(0.01):
            await asyncio.sleep(5)

    async def quick(*_: Any) -> None:
        return None

    async def boom(*_: Any) -> None:
        raise SystemExit(3)

    async def selfcancel(*_: Any) -> None:
        task = asyncio.current_task()
        assert task is not None
        task.cancel()  # its own task: a handler may do that; the jobs after it are not hit

    async def sleeper(*_: Any) -> str:
        await asyncio.sleep(0.01)
        return "slept"

    outcomes = asyncio.run(
        run_batch(
            {
                "timed": timed,
                "quick": quick,
                "boom": boom,
                "selfcancel": selfcancel,
                "sleeper": sleeper,
            },
            ["quick", "timed", "quick", "boom", "selfcancel", "sleeper", "quick"],
        )
    )
    assert outcomes[1].outcome == "completed"
    assert outcomes[2].outcome == "retry"
    assert outcomes[2].error is not None and outcomes[2].error["type"] == "TimeoutError"
    assert outcomes[3].outcome == "completed"
    assert outcomes[4].outcome == "retry"
    assert outcomes[4].error is not None and outcomes[4].error["type"] == "SystemExit"
    assert outcomes[5].outcome == "completed"
    assert outcomes[6].outcome == "completed" and outcomes[6].result_json == '"slept"'
    assert outcomes[7].outcome == "completed"


def test_abandoned_before_its_first_step_never_runs() -> None:
    ran: list[int] = []

    async def record(*_: Any) -> None:
        ran.append(1)

    async def main() -> None:
        runtime = WorkerRuntime(build_config(queues=[("q", 8)], concurrency=8, maintenance=False))
        runtime.attempts.bind(asyncio.get_running_loop())
        runtime.attempts.kinds = {"record": Job(record, "record", None)}  # type: ignore[arg-type]
        queue = runtime.config.queues[0]
        runtime.slots.add(queue)
        runtime.attempts.start_batch([claimed(1, "record")], queue)
        [run] = runtime.inflight.values()
        assert isinstance(run, Running) and not run.began
        runtime.attempts._abandon(run, "test")  # before its task's first step
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10
        while not run.done:  # its task runs its first step and finds itself abandoned
            assert loop.time() < deadline, "the abandoned run never ended"
            await asyncio.sleep(0.001)
        assert run.done and not runtime.inflight
        assert runtime.batcher.pending == []  # left to the database, like a queued sync job

    asyncio.run(main())
    assert ran == []


def test_batch_json_fast_path_is_the_encoders_json() -> None:
    items = [
        Finalization(1, 2, 3, "completed", "null"),
        Finalization(4, 5, 6, "completed", '{"a":1}'),
        Finalization(7, 8, 9, "completed", "null", has_state=True),
        Finalization(10, 11, 12, "retry", None, {"type": "E", "message": "m"}, 1.5),
        Finalization(13, 14, 15, "completed", "null", progress_json='{"percent":1}'),
        Finalization(2**62, 2**40, 7, "completed", "null"),
    ]
    assert items[0].is_plain_completion() and not items[2].is_plain_completion()
    text = Finalization.batch_json(items)
    assert json.loads(text) == [item.to_value() for item in items]
    assert Finalization.batch_json(items[:1]) == "[" + items[0].to_json() + "]"
    assert Finalization.batch_json([]) == "[]"
