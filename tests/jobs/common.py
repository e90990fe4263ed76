"""Job kinds used by the test suite (imported by tests and by worker subprocesses)."""

from __future__ import annotations

from typing import Any

from awa_django import job


@job
def noop() -> None:
    """Do nothing."""


@job(queue="emails", priority=5, max_attempts=3, tags=["mail"])
def send_email(address: str, subject: str = "") -> str:
    return f"sent {subject} to {address}"


@job(name="tests.renamed", queue="other")
def renamed(value: Any) -> Any:
    return value


@job(queue="async")
async def async_echo(value: Any) -> Any:
    return value


@job(takes_context=True)
def with_ctx(ctx: Any, value: int) -> int:
    return value


# Jobs for worker tests: they record every execution in the Ledger table, so tests can prove
# "exactly once per attempt" from the database. -------------------------------------------------

import contextlib  # noqa: E402

from awa_django import Cancel, RetryAfter, Snooze, TerminalError  # noqa: E402


def _record(ctx: Any, note: str = "") -> None:
    from tests.testapp.models import Ledger

    Ledger.objects.create(
        job_id=ctx.id, run_lease=ctx.run_lease, attempt=ctx.attempt, queue=ctx.queue, note=note
    )


@job(takes_context=True, queue="work")
def ledger_sync(ctx: Any, n: int) -> int:
    _record(ctx)
    return n


@job(takes_context=True, queue="work-async")
async def ledger_async(ctx: Any, n: int) -> int:
    from asgiref.sync import sync_to_async

    await sync_to_async(_record)(ctx)
    return n


@job(takes_context=True, queue="work", max_attempts=5)
def flaky(ctx: Any, fail_times: int) -> str:
    _record(ctx)
    if ctx.attempt <= fail_times:
        raise ValueError(f"attempt {ctx.attempt} fails on purpose")
    return "ok"


@job(takes_context=True, queue="work", max_attempts=3)
def retry_later(ctx: Any, seconds: float) -> RetryAfter:
    _record(ctx)
    return RetryAfter(seconds)


@job(takes_context=True, queue="work", max_attempts=1)
def snoozer(ctx: Any, times: int) -> Any:
    _record(ctx)
    if ctx.run_lease <= times:
        return Snooze(0.01)
    return "awake"


@job(takes_context=True, queue="work")
def give_up(ctx: Any) -> Cancel:
    _record(ctx)
    return Cancel("nothing to do")


@job(takes_context=True, queue="work")
def terminal(ctx: Any) -> None:
    _record(ctx)
    raise TerminalError("cannot ever work")


@job(takes_context=True, queue="work", max_attempts=3)
def progress_then_retry(ctx: Any) -> Any:
    _record(ctx)
    if ctx.attempt == 1:
        ctx.set_progress(40, "halfway", step=2)
        raise RuntimeError("first attempt fails after progress")
    return ctx.progress


def _wait_cancel_sync(ctx: Any, seconds: float) -> str:
    import time

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if ctx.is_cancelled():
            _record(ctx, "saw-cancel")
            return "cancelled"
        time.sleep(0.01)
    _record(ctx, "finished")
    return "finished"


@job(takes_context=True, queue="slow")
def slow_sync(ctx: Any, seconds: float) -> str:
    return _wait_cancel_sync(ctx, seconds)


@job(takes_context=True, queue="slow")
def overlap_sync(ctx: Any, seconds: float) -> None:
    """Records when the handler starts and ends (ledger notes "start"/"end"): how many
    handlers ran at once is read from these, not from job states, which finish in batches."""
    import time

    _record(ctx, "start")
    time.sleep(seconds)
    _record(ctx, "end")


@job(takes_context=True, queue="slow")
async def slow_async(ctx: Any, seconds: float) -> str:
    import asyncio

    from asgiref.sync import sync_to_async

    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while loop.time() < deadline:
        if ctx.is_cancelled():
            await sync_to_async(_record)(ctx, "saw-cancel")
            return "cancelled"
        await asyncio.sleep(0.01)
    await sync_to_async(_record)(ctx, "finished")
    return "finished"


@job(takes_context=True, queue="hang")
def hang_first(ctx: Any) -> str:
    """Hangs (until cancelled) on its first attempt only; completes on any later one."""
    _record(ctx)
    if ctx.attempt == 1:
        return _wait_cancel_sync(ctx, 120)
    return "done"


@job(takes_context=True, queue="stop")
def slow_first(ctx: Any) -> str:
    """Sleeps through its first attempt without looking at cancellation; later ones are quick."""
    import time

    _record(ctx)
    if ctx.attempt == 1:
        time.sleep(3.0)
        return "first"
    return "second"


@job(takes_context=True, queue="cb")
def await_callback(ctx: Any, timeout: float) -> Any:
    """Parks its first attempt until a callback resolves it (or it times out)."""
    from awa_django import WaitForCallback

    _record(ctx, str(ctx.callback_id))
    if ctx.attempt == 1:
        return WaitForCallback(ctx.callback_id, timeout=timeout)
    return "second attempt"


# Hostile handlers for the fault tests (tests/worker/test_worker_faults.py) ------------------------


class CustomBaseError(BaseException):
    """A BaseException that is not an Exception, raised by handler code."""


@job(takes_context=True, queue="hostile", max_attempts=1)
def hostile(ctx: Any, mode: str) -> Any:
    """Misbehaves as ``mode`` says: outcomes and values that cannot be stored as given."""
    import uuid

    from awa_django import WaitForCallback

    _record(ctx, mode)
    if mode == "nul_message":
        raise ValueError("bad \x00 text")
    if mode == "surrogate_message":
        raise ValueError("bad \ud800 text")
    if mode == "cancel_nul":
        return Cancel("why \x00")
    if mode == "retry_nan":
        return RetryAfter(float("nan"))
    if mode == "snooze_huge":
        return Snooze(1e300)
    if mode == "wait_inf":
        return WaitForCallback(ctx.callback_id, timeout=float("inf"))
    if mode == "wait_foreign":
        return WaitForCallback(uuid.uuid4(), timeout=60)
    if mode == "bad_progress":
        ctx.set_progress(10, "x", bad=object())
    if mode == "surrogate_result":
        return "\ud800"
    if mode == "huge_int_result":
        return 10**5000
    if mode == "system_exit":
        raise SystemExit(3)
    if mode == "keyboard_interrupt":
        raise KeyboardInterrupt
    if mode == "custom_base":
        raise CustomBaseError("not an Exception")
    return "fine"


@job(takes_context=True, queue="hostile-async", max_attempts=1)
async def hostile_async(ctx: Any, mode: str) -> Any:
    import asyncio

    from asgiref.sync import sync_to_async

    await sync_to_async(_record)(ctx, mode)
    if mode == "cancelled_error":
        raise asyncio.CancelledError
    if mode == "custom_base":
        raise CustomBaseError("not an Exception")
    if mode == "surrogate_result":
        return {"k": "\udfff"}
    return "fine"


@job(takes_context=True, queue="work")
def progress_garbage_then_finish(ctx: Any, seconds: float) -> str:
    """Sets progress that is not JSON (the refusal, when there is one, is caught), flushes it,
    and runs on for ``seconds`` without touching progress again."""
    import time

    _record(ctx, "start")
    with contextlib.suppress(ValueError):
        ctx.set_progress(5, "x", bad=object())
    ctx.flush_progress()
    time.sleep(seconds)
    return "done"


@job(takes_context=True, queue="stuck")
def stuck_sync(ctx: Any, hang: bool = True) -> str:
    """Ignores cancellation and sleeps far past any deadline on its first attempt (if hang)."""
    import time

    _record(ctx)
    if hang and ctx.attempt == 1:
        time.sleep(60)
    return "unstuck"


@job(takes_context=True, queue="stuck")
async def stuck_async(ctx: Any, hang: bool = True) -> str:
    """Swallows cancellation and sleeps far past any deadline on its first attempt (if hang)."""
    import asyncio

    from asgiref.sync import sync_to_async

    await sync_to_async(_record)(ctx)
    if hang and ctx.attempt == 1:
        for _ in range(600):
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(0.1)
    return "unstuck"


@job(takes_context=True, queue="cb")
def early_callback(ctx: Any) -> Any:
    """Resolves its own callback before returning WaitForCallback (an external system that
    answers before the handler has returned)."""
    import awa_django
    from awa_django import WaitForCallback

    _record(ctx)
    callback_id = ctx.callback_id
    assert awa_django.resolve_callback(callback_id, result={"early": True}) == "resolved"
    return WaitForCallback(callback_id, timeout=120)


@job(takes_context=True, queue="leaky", max_attempts=1)
def leaves_transaction_open(ctx: Any) -> str:
    """Enters an atomic block, writes, and returns without leaving it."""
    from django.db import transaction

    transaction.atomic().__enter__()
    _record(ctx, "uncommitted")
    return "returned"


@job(takes_context=True, queue="leaky")
def innocent(ctx: Any) -> int:
    from tests.testapp.models import Ledger

    _record(ctx, "innocent")
    return Ledger.objects.count()


@job(takes_context=True, queue="blocker", max_attempts=1)
async def blocks_the_loop(ctx: Any, seconds: float) -> str:
    """Blocks the event loop (a sync sleep in an async handler)."""
    import time

    from asgiref.sync import sync_to_async

    await sync_to_async(_record)(ctx, "blocking")
    time.sleep(seconds)
    return "unblocked"


@job(takes_context=True, queue="blocker", max_attempts=1)
async def ends_the_loop(ctx: Any, how: str) -> None:
    """Ends the worker's own event loop from handler code."""
    import asyncio

    from asgiref.sync import sync_to_async

    await sync_to_async(_record)(ctx, how)
    loop = asyncio.get_running_loop()
    if how == "system_exit":

        def boom() -> None:
            raise SystemExit(9)

        loop.call_soon(boom)
    elif how == "stop":
        loop.stop()
    await asyncio.sleep(5)


#: What context_probe saw, one entry per attempt (tests read it in-process).
CONTEXT_SEEN: list[dict[str, Any]] = []


@job(takes_context=True, queue="context", metadata={"tenant": "acme"}, tags=["probe"])
def context_probe(context: Any, fail: bool) -> str:
    """Record what the context shows (the first parameter need not be called ctx); fail the
    first attempt when asked."""
    CONTEXT_SEEN.append(
        {
            "type": type(context).__name__,
            "attempt": context.attempt,
            "metadata": context.metadata,
            "tags": context.tags,
            "errors": [e.get("message") for e in context.errors],
        }
    )
    if fail and context.attempt == 1:
        raise RuntimeError("first attempt fails")
    context.set_progress(10, "step 1", a=1, b=1)
    context.set_progress(50, "step 2", b=2)
    return "ok"


@job(queue="context")
def ctx_is_just_a_name(ctx: int) -> int:
    """A first parameter named ctx, without takes_context: an ordinary argument."""
    return ctx * 2


@job(queue="uniq", unique=True)
def unique_noop(n: int = 0) -> int:
    return n


# Retry policies (tests/worker/test_worker_retry.py) -----------------------------------------------

from awa_django import RetryPolicy  # noqa: E402


class Transient(Exception):
    """An error a picky job retries."""


class Permanent(Transient):
    """A Transient that a picky job's fail_on still fails at once."""


_PICKY_ERRORS: dict[str, type[BaseException]] = {
    "transient": Transient,
    "permanent": Permanent,
    "value": ValueError,
    "key": KeyError,
}


@job(
    takes_context=True,
    queue="retry",
    max_attempts=5,
    retry=RetryPolicy(
        "constant", base=0, jitter=0, retry_on=[Transient, LookupError], fail_on=Permanent
    ),
)
def picky(ctx: Any, error: str, fail_times: int) -> str:
    """Raises ``error`` on its first ``fail_times`` attempts, then completes."""
    _record(ctx, error)
    if ctx.attempt <= fail_times:
        raise _PICKY_ERRORS[error](f"attempt {ctx.attempt}")
    return "done"


@job(takes_context=True, queue="retry", max_attempts=5)
def always_fails(ctx: Any) -> None:
    _record(ctx)
    raise RuntimeError(f"attempt {ctx.attempt} fails")


# Flow control (tests/worker/limits/test_queue_limits_workers.py) ----------------------------------


@job(takes_context=True, queue="flow")
def flow_sleep(ctx: Any, seconds: float) -> None:
    """Records its start (note "start:<weight>") and end: the ledger shows how many permits
    were in use at any time, across processes."""
    import time

    weight = (ctx.metadata or {}).get("awa:weight", 1)
    _record(ctx, f"start:{weight}")
    time.sleep(seconds)
    _record(ctx, "end")


@job(takes_context=True, queue="flow-rate")
async def flow_tick(ctx: Any) -> None:
    """A no-op that records nothing: its start time is the attempt's attempted_at."""


@job(takes_context=True, queue="flow")
def kind_free(ctx: Any, seconds: float) -> None:
    """A kind without flow limits beside flow_sleep in queue "flow": notes "free-start" and
    "free-end" (which tests.worker.limits.test_queue_limits_workers.max_overlap does not count)."""
    import time

    _record(ctx, "free-start")
    time.sleep(seconds)
    _record(ctx, "free-end")


@job(takes_context=True, queue="flow-kind", global_concurrency=2)
def kind_capped(ctx: Any, seconds: float) -> None:
    """A kind limited by its @job options (2 at once across the fleet): notes like
    flow_sleep."""
    import time

    _record(ctx, "start:1")
    time.sleep(seconds)
    _record(ctx, "end")


# Sequential callbacks (tests/worker/test_callback_waits.py) ---------------------------------------


@job(takes_context=True, queue="cb-steps")
def three_steps(ctx: Any, order: str) -> Any:
    """Waits for three callbacks in turn (WaitForCallback(resume=True)); each run carries on
    from its progress, with the last callback's result in ctx.callback_result."""
    from awa_django import WaitForCallback

    progress = ctx.progress if isinstance(ctx.progress, dict) else {}
    meta = progress.get("metadata") or {}
    step = int(meta.get("step", 0))
    results = list(meta.get("results", []))
    if step > 0:
        results.append(ctx.callback_result)
    if step == 3:
        return {"order": order, "results": results, "attempt": ctx.attempt}
    callback_id = ctx.callback_id
    _record(ctx, f"step {step + 1}: {callback_id}")
    ctx.set_progress(step * 33, f"waiting for step {step + 1} of 3", step=step + 1, results=results)
    return WaitForCallback(callback_id, timeout=60, resume=True)


@job(takes_context=True, queue="cb-steps")
def early_resume(ctx: Any) -> Any:
    """Resolves its own resume wait before returning it: the result resumes it at once."""
    import awa_django
    from awa_django import WaitForCallback

    _record(ctx, "resumed" if ctx.resumed_callback_id else "first")
    if ctx.resumed_callback_id is not None:
        return {"got": ctx.callback_result}
    callback_id = ctx.callback_id
    assert awa_django.resolve_callback(callback_id, result="early") == "resolved"
    return WaitForCallback(callback_id, timeout=60, resume=True)


# Per-key serialisation (tests/worker/limits/test_serial_keys_workers.py) --------------------------


@job(takes_context=True, queue="serial")
def serial_sleep(ctx: Any, seconds: float) -> None:
    """Records its start (note "start:<serial key>") and end: the ledger shows which jobs of a
    key ran when, across processes."""
    import time

    key = (ctx.metadata or {}).get("awa:serial")
    _record(ctx, f"start:{key}")
    time.sleep(seconds)
    _record(ctx, "end")
