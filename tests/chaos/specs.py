"""What producers enqueue: one ``JobSpec`` per job, fully drawn from a seeded RNG before any I/O.

Plain jobs go to the spread queues (``chaos-q000`` ...: dozens in CI, hundreds in a soak) or to
their kind's queue. Feature jobs: the flow-limited queues (``chaos-limit``: global concurrency,
weights 1-3; ``chaos-rate``: a rate; ``chaos-serial``: serial keys), the kind ``chaos.limited``
(a concurrency limit of its own, in spread queues), retry policies (exponential, linear,
constant; with and without jitter and cap) and unique keys. Callback waits carry how the
resolver resolves them (``plan["mode"]``).
"""

from __future__ import annotations

import dataclasses
import json
import random
from datetime import timedelta
from typing import Any

from awa_django import Job, RetryPolicy
from awa_django.types import EnqueuedJob, JobRequest
from tests.chaos import jobs
from tests.chaos.sabotage import broken

__all__ = [
    "LIMIT_QUEUE",
    "RATE_QUEUE",
    "SERIAL_QUEUE",
    "JobSpec",
    "make_flow_spec",
    "make_retry_spec",
    "make_spec",
    "make_unique_spec",
    "spread_queues",
]

LIMIT_QUEUE = "chaos-limit"
RATE_QUEUE = "chaos-rate"
SERIAL_QUEUE = "chaos-serial"
SERIAL_KEYS = 6
UNIQUE_KEYS = 8
TARGETS = {"sync": 50, "async": 35, "deadline": 7}
BEHAVIOURS: dict[str, dict[str, int]] = {
    "sync": {
        "ok": 30,
        "raise": 8,
        "raise_twice": 2,
        "terminal": 4,
        "retry_after": 6,
        "snooze": 6,
        "cancel": 3,
        "sys_exit": 2,
        "keyboard_interrupt": 2,
        "base_exception": 2,
        "bad_progress": 2,
        "callback_early": 4,
        "callback_late": 8,
        "callback_never": 4,
        "long": 8,
    },
    "async": {
        "ok": 40,
        "raise": 10,
        "raise_twice": 2,
        "terminal": 4,
        "retry_after": 6,
        "snooze": 6,
        "cancel": 3,
        "cancelled_error": 2,
        "base_exception": 2,
        "bad_progress": 2,
        "long": 8,
    },
    "deadline": {"ok": 2, "hang": 1},
    "task": {"ok": 3, "raise": 1},
}
# How the resolver resolves a late callback (tests/chaos/observer.py, Resolver).
CALLBACK_MODES = {
    "python": 3,
    "http": 1,
    "http_twice": 1,
    "dup": 2,
    "conflict": 1,
    "race": 2,
    "race_http": 1,
    "near_timeout": 1,
}
HANDLERS: dict[str, Job[Any, Any]] = {
    "sync": jobs.sync_job,
    "async": jobs.async_job,
    "deadline": jobs.deadline_job,
    "limited": jobs.limited_job,
}
KINDS = {"task": "chaos_task", **{target: job.kind for target, job in HANDLERS.items()}}


def spread_queues(count: int) -> tuple[str, ...]:
    """The plain jobs' queues: ``chaos-q000`` ... (``count`` of them)."""
    return tuple(f"chaos-q{i:03d}" for i in range(count))


@dataclasses.dataclass(frozen=True)
class JobSpec:
    """One job a producer means to enqueue. ``queue``, ``weight``, ``serial_key``, ``retry``
    (RetryPolicy arguments) and ``unique_key`` are what the producer asks for (None: the
    kind's default), recorded in the ledger for the checker."""

    token: str
    target: str
    behaviour: str
    plan: dict[str, Any]
    priority: int = 0
    max_attempts: int = 3
    delay: float | None = None
    queue: str | None = None
    weight: int | None = None
    serial_key: str | None = None
    retry: dict[str, Any] | None = None
    unique_key: str | None = None

    @property
    def kind(self) -> str:
        return KINDS[self.target]

    def ledger_row(self, job_id: int, path: str) -> list[Any]:
        """The parameters of ledger.sql's ``committed_insert`` for this job."""
        retry = None if self.retry is None else json.dumps(self.retry)
        return [
            job_id,
            self.token,
            path,
            self.kind,
            self.behaviour,
            self.queue,
            self.weight,
            self.serial_key,
            retry,
            self.unique_key,
        ]

    def _handle(self) -> Job[Any, Any]:
        options: dict[str, Any] = {
            "priority": self.priority,
            "max_attempts": self.max_attempts,
            "run_after": timedelta(seconds=self.delay) if self.delay else None,
        }
        if self.queue is not None:
            options["queue"] = self.queue
        if self.weight is not None:
            options["weight"] = self.weight
        if self.serial_key is not None and not broken("serial"):
            options["serial_key"] = self.serial_key
        if self.retry is not None:
            retry = dict(self.retry)
            if broken("retry"):
                retry["base"] = retry["base"] * 4
            options["retry"] = RetryPolicy(**retry)
        if self.unique_key is not None and not broken("unique"):
            options["unique_key"] = self.unique_key
        return HANDLERS[self.target].using(**options)

    def enqueue_handle(self) -> EnqueuedJob:
        """Enqueue it (in the caller's transaction, if any); the handle tells duplicates."""
        if self.target == "task":
            result = jobs.chaos_task.enqueue(self.token, self.behaviour)
            return EnqueuedJob(int(result.id), self.kind, "chaos", 0, "available", "default")
        return self._handle().enqueue(self.token, self.behaviour, self.plan)

    def enqueue(self) -> int:
        return self.enqueue_handle().id

    def prepare(self) -> JobRequest:
        return self._handle().prepare(self.token, self.behaviour, self.plan)


def _pick(rng: random.Random, weights: dict[str, int]) -> str:
    return rng.choices(list(weights), weights=list(weights.values()))[0]


def _plan(rng: random.Random, behaviour: str) -> dict[str, Any]:
    plan: dict[str, Any] = {}
    if behaviour == "long":
        plan["seconds"] = round(rng.uniform(0.4, 2.0), 2)
    elif behaviour == "callback_late":
        mode = _pick(rng, CALLBACK_MODES)
        plan.update(delay=round(rng.uniform(0.1, 1.5), 2), error=rng.random() < 0.3, mode=mode)
        plan["timeout"] = 8.0
        if mode == "near_timeout":
            plan["timeout"] = round(rng.uniform(0.6, 1.2), 2)
            plan["delay"] = round(plan["timeout"] + rng.uniform(-0.15, 0.15), 3)
    elif behaviour == "callback_never":
        plan["timeout"] = round(rng.uniform(0.3, 1.0), 2)
    elif behaviour == "callback_early":
        plan.update(timeout=2.0, twice=rng.random() < 0.3)
    elif behaviour == "hang":
        plan["seconds"] = jobs.HANG_SECONDS
    return plan


def make_spec(
    rng: random.Random,
    token: str,
    target: str | None = None,
    queues: tuple[str, ...] = (),
) -> JobSpec:
    """Draw one plain job: where it goes (a spread queue, three times in four), what its
    handler does, its options."""
    target = target or _pick(rng, TARGETS)
    behaviour = _pick(rng, BEHAVIOURS[target])
    plan = _plan(rng, behaviour)
    delay = round(rng.uniform(0.05, 0.8), 3) if rng.random() < 0.15 else None
    spread = rng.random() < 0.75 and target in ("sync", "async") and bool(queues)
    queue = rng.choice(queues) if spread else None
    return JobSpec(
        token=token,
        target=target,
        behaviour=behaviour,
        plan=plan,
        priority=0 if target == "task" else rng.choice((-5, 0, 0, 0, 5)),
        max_attempts=rng.randint(3, 5),
        delay=None if target == "task" else delay,
        queue=queue,
    )


def make_flow_spec(rng: random.Random, token: str, what: str, queues: tuple[str, ...]) -> JobSpec:
    """A job of a flow-limited queue or kind: ``limit`` (chaos-limit, weight 1-3), ``rate``
    (chaos-rate), ``serial`` (chaos-serial, one of a few keys) or ``kind`` (chaos.limited in a
    spread queue). Short handlers, so that they overlap and limits bind."""
    seconds = round(rng.uniform(0.05, 0.3), 3)
    long_or_ok = rng.choice(("ok", "long", "long"))
    common = {"priority": 0, "max_attempts": 4}
    if what == "limit":
        return JobSpec(
            token,
            "sync",
            long_or_ok,
            {"seconds": seconds},
            queue=LIMIT_QUEUE,
            weight=rng.choice((1, 1, 2, 3)),
            **common,
        )
    if what == "rate":
        return JobSpec(token, "sync", "ok", {}, queue=RATE_QUEUE, **common)
    if what == "serial":
        behaviour = rng.choice(("ok", "long", "long", "raise", "snooze"))
        return JobSpec(
            token,
            "sync",
            behaviour,
            {"seconds": seconds},
            queue=SERIAL_QUEUE,
            serial_key=f"key-{rng.randrange(SERIAL_KEYS)}",
            **common,
        )
    queue = rng.choice(queues) if queues else None
    return JobSpec(token, "limited", long_or_ok, {"seconds": seconds}, queue=queue, **common)


def make_retry_spec(rng: random.Random, token: str, queues: tuple[str, ...]) -> JobSpec:
    """A job with a retry policy of its own whose handler fails once or twice (or asks for a
    RetryAfter, or fails through a callback error): short waits, so that the run ends."""
    backoff = rng.choice(("exponential", "linear", "constant"))
    retry: dict[str, Any] = {
        "backoff": backoff,
        "base": round(rng.uniform(0.02, 0.15), 3),
        "jitter": rng.choice((0.0, 0.1, 0.5, 1.0)),
    }
    if rng.random() < 0.3:
        retry["cap"] = round(rng.uniform(0.05, 0.3), 3)
    behaviour = rng.choice(("raise", "raise", "raise_twice", "raise_twice", "retry_after", "ok"))
    plan: dict[str, Any] = {}
    target = rng.choice(("sync", "async"))
    if target == "sync" and rng.random() < 0.15:
        behaviour = "callback_late"
        plan = {"delay": round(rng.uniform(0.1, 0.5), 2), "error": True, "mode": "python"}
        plan["timeout"] = 8.0
    return JobSpec(
        token,
        target,
        behaviour,
        plan,
        max_attempts=rng.randint(4, 6),
        queue=rng.choice(queues) if queues else None,
        retry=retry,
    )


def make_unique_spec(rng: random.Random, token: str, key: str | None = None) -> JobSpec:
    """A unique job (chaos.sync, default blocking states) with ``key`` or one of a few keys
    shared by every producer, so that producers race for them."""
    behaviour = rng.choice(("ok", "ok", "long", "raise", "snooze", "callback_late"))
    plan = _plan(rng, behaviour)
    if behaviour == "long":
        plan["seconds"] = round(rng.uniform(0.1, 0.6), 2)
    unique_key = key or f"shared-{rng.randrange(UNIQUE_KEYS)}"
    return JobSpec(token, "sync", behaviour, plan, max_attempts=4, unique_key=unique_key)
