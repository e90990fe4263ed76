"""Job kinds for tests/storage/test_kind_limit_claim_walks.py's worker fleet (queue ``kfast``).

Workers load them with ``worker_env(kind_limit_walks)`` (tests/jobs/__init__.py). Each records its
start (note ``start:<kind letter>:<weight>:<serial key>``) and end in the Ledger, so the test can
rebuild, per kind and per serial key, what ran at once across processes."""

from __future__ import annotations

import time
from typing import Any

from awa_django import job


def _run(ctx: Any, letter: str, seconds: float) -> None:
    from tests.testapp.models import Ledger

    meta = ctx.metadata or {}
    weight = meta.get("awa:weight", 1)
    key = meta.get("awa:serial", "")
    common = {"job_id": ctx.id, "run_lease": ctx.run_lease, "attempt": ctx.attempt}
    Ledger.objects.create(**common, queue=ctx.queue, note=f"start:{letter}:{weight}:{key}")
    time.sleep(seconds)
    Ledger.objects.create(**common, queue=ctx.queue, note="end")


@job(takes_context=True, queue="kfast")
def kfast_a(ctx: Any, seconds: float) -> None:
    """Limited by the test (AWA["KINDS"] and operator overrides)."""
    _run(ctx, "a", seconds)


@job(takes_context=True, queue="kfast")
def kfast_b(ctx: Any, seconds: float) -> None:
    """Limited by the test."""
    _run(ctx, "b", seconds)


@job(takes_context=True, queue="kfast")
def kfast_free(ctx: Any, seconds: float) -> None:
    """No limit."""
    _run(ctx, "f", seconds)
