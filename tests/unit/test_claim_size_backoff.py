"""``ClaimCap`` (awa_django/worker/slots.py): a claim that fails on one of the server's size
limits (the claimed rows passing 1 GB, out of memory) halves what the queue's next claims ask
for, down to one job; claims that go through double it back to ``CLAIM_BATCH_SIZE``. The
worker-level case (512 jobs of large arguments) is in tests/worker/test_large_claim_batches.py."""

from __future__ import annotations

import psycopg
import pytest
from psycopg import errors

from awa_django.worker.slots import CAP_GROW_AFTER, ClaimCap


@pytest.mark.parametrize(
    "exc",
    [
        errors.ProgramLimitExceeded("total size"),
        errors.StatementTooComplex("deep"),
        errors.OutOfMemory("oom"),
    ],
)
def test_a_size_failure_halves_the_cap_down_to_one(exc: psycopg.Error) -> None:
    cap = ClaimCap(512)
    assert cap.limit(600) == 512 and cap.limit(40) == 40 and cap.limit(0) == 0
    sizes = []
    while cap.failed(exc, cap.limit(512)):
        sizes.append(cap.cap)
    assert sizes == [256, 128, 64, 32, 16, 8, 4, 2, 1]
    assert not cap.failed(exc, 1)  # one job: nothing smaller to try; the caller backs off
    assert cap.limit(512) == 1


def test_the_cap_halves_what_was_asked_not_the_configured_size() -> None:
    cap = ClaimCap(512)
    assert cap.failed(errors.ProgramLimitExceeded("x"), 100)
    assert cap.cap == 50


@pytest.mark.parametrize(
    "exc",
    [
        errors.DeadlockDetected("d"),
        errors.QueryCanceled("c"),
        errors.UndefinedFunction("f"),
        psycopg.OperationalError("lost"),
        RuntimeError("not a database error"),
        ValueError("x"),
    ],
)
def test_other_failures_leave_the_cap_alone(exc: BaseException) -> None:
    cap = ClaimCap(512)
    assert not cap.failed(exc, 512)
    assert cap.cap == 512


def test_claims_that_go_through_double_the_cap_back_to_the_full_size() -> None:
    cap = ClaimCap(512)
    for _ in range(3):
        cap.failed(errors.ProgramLimitExceeded("x"), cap.limit(512))
    assert cap.cap == 64
    back = [cap.succeeded() for _ in range(3 * CAP_GROW_AFTER)]
    assert cap.cap == 512
    assert back.count(True) == 1 and back[-1]  # reported once, when the full size is back
    assert not cap.succeeded() and cap.cap == 512
    # A failure in between starts the count again.
    cap.failed(errors.ProgramLimitExceeded("x"), 512)
    for _ in range(CAP_GROW_AFTER - 1):
        cap.succeeded()
    cap.failed(errors.ProgramLimitExceeded("x"), 256)
    assert cap.cap == 128
    for _ in range(CAP_GROW_AFTER - 1):
        cap.succeeded()
    assert cap.cap == 128


def test_a_cap_never_goes_below_one_nor_above_the_configured_size() -> None:
    assert ClaimCap(0).cap == 1
    cap = ClaimCap(3)
    assert cap.failed(errors.ProgramLimitExceeded("x"), 3) and cap.cap == 1
    for _ in range(10 * CAP_GROW_AFTER):
        cap.succeeded()
    assert cap.cap == 3
