"""Job kinds of the workflow and batch tests (tests/workflows/): steps that return, add up
their dependencies' results, fail, or report a batch's counts."""

from __future__ import annotations

from typing import Any

from awa_django import TerminalError, job


@job(queue="wf")
def value(x: Any) -> Any:
    """Return ``x``."""
    return x


@job(queue="wf", takes_context=True)
def total(ctx: Any, extra: int = 0) -> int:
    """The sum of the dependencies' results, plus ``extra``."""
    return sum(int(v) for v in ctx.upstream.values()) + extra


@job(queue="wf", takes_context=True)
def seen(ctx: Any) -> dict[str, Any]:
    """How each dependency ended, and the results of those that completed."""
    return {"states": ctx.upstream_states, "results": ctx.upstream}


@job(queue="wf", max_attempts=1)
def boom(message: str = "boom") -> None:
    """Fail at once (the queue's DLQ decides where it goes)."""
    raise TerminalError(message)


@job(queue="wf", takes_context=True)
def counts(ctx: Any) -> dict[str, Any]:
    """A batch callback: the outcome counts of the batch's members."""
    step = ctx.workflow
    return {"id": step.id, "step": step.step, "counts": step.counts}


@job(queue="wf", takes_context=True)
def one_by_one(ctx: Any) -> list[Any]:
    """The dependencies' results read one at a time (what a large fan-in does)."""
    return [ctx.upstream_result(step) for step in sorted(ctx.upstream_states)]
