"""The configuration of one worker process, from ``AWA`` settings and command-line options."""

from __future__ import annotations

import dataclasses
import re

from awa_django.conf import get_awa_settings
from awa_django.db.identifiers import QUEUE_NAME_RE, validate_queue_name
from awa_django.jobs import registered_kinds

__all__ = ["MAX_PROCESSES", "MAX_SLOTS", "QueueConfig", "WorkerConfig", "parse_queue_option"]

#: Most jobs of one queue one process runs at once (--queue NAME=N, --concurrency).
MAX_SLOTS = 10_000
#: Most worker processes under one supervisor (--processes).
MAX_PROCESSES = 256

_QUEUE_OPTION = re.compile(r"^(?P<name>[^=]+)(?:=(?P<concurrency>\d+))?$")


@dataclasses.dataclass(frozen=True, slots=True)
class QueueConfig:
    """One queue a worker serves: how many of its jobs run at once, and its default deadline."""

    name: str
    concurrency: int
    deadline: float | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class WorkerConfig:
    """Everything one worker process needs; every interval is in seconds."""

    queues: tuple[QueueConfig, ...]
    alias: str
    burst: bool = False
    maintenance: bool = True
    claim_batch: int = 512
    completion_batch: int = 512
    completion_flush: float = 0.002
    poll_interval: float = 0.2
    heartbeat_interval: float = 30.0
    heartbeat_staleness: float = 90.0
    shutdown_timeout: float = 30.0
    abandon_after: float = 30.0
    runtime_refresh: float = 10.0
    aging_interval: float = 60.0
    notify: bool = True
    result_max_bytes: int = 1_048_576
    json_max_depth: int = 32
    backoff_base: float = 1.0

    @property
    def total_concurrency(self) -> int:
        return sum(q.concurrency for q in self.queues)


def parse_queue_option(value: str) -> tuple[str, int | None]:
    """Parse ``NAME`` or ``NAME=CONCURRENCY`` (a ``--queue`` value); raise ``ValueError``."""
    match = _QUEUE_OPTION.match(value.strip())
    if match is None:
        raise ValueError(f"--queue {value!r}: expected NAME or NAME=CONCURRENCY")
    name = validate_queue_name(match["name"])
    concurrency = int(match["concurrency"]) if match["concurrency"] else None
    if concurrency is not None and not 1 <= concurrency <= MAX_SLOTS:
        raise ValueError(f"--queue {value!r}: concurrency must be between 1 and {MAX_SLOTS}")
    return name, concurrency


def _task_queues() -> set[str]:
    """Queues listed in ``TASKS`` for awa_django's django.tasks backend."""
    from django.conf import settings

    names: set[str] = set()
    for params in getattr(settings, "TASKS", {}).values():
        if str(params.get("BACKEND", "")).endswith("awa_django.backends.tasks.AwaTaskBackend"):
            names.update(q for q in params.get("QUEUES", ()) if QUEUE_NAME_RE.fullmatch(q))
    return names


def build_config(
    *,
    queues: list[tuple[str, int | None]] | None = None,
    concurrency: int | None = None,
    burst: bool = False,
    maintenance: bool = True,
) -> WorkerConfig:
    """Merge command-line options over ``AWA`` settings.

    Without queues, the worker serves every queue named by a registered kind (plus
    ``AWA["QUEUES"]``, the default queue and the ``QUEUES`` of awa_django's django.tasks
    backends in ``TASKS``). Per-queue concurrency comes from the option, then
    ``AWA["QUEUES"][name]["concurrency"]``, then ``concurrency``/``AWA["CONCURRENCY"]``.
    """
    cfg = get_awa_settings()
    default_concurrency = concurrency or cfg.CONCURRENCY
    if not queues:
        names = {cfg.DEFAULT_QUEUE, *cfg.QUEUES, *_task_queues()}
        names.update(h.options.queue or cfg.DEFAULT_QUEUE for h in registered_kinds().values())
        queues = [(name, None) for name in sorted(names)]
    built = []
    for name, explicit in queues:
        per_queue = cfg.QUEUES.get(name)
        built.append(
            QueueConfig(
                name=name,
                concurrency=explicit
                or (per_queue.concurrency if per_queue and per_queue.concurrency else None)
                or default_concurrency,
                deadline=per_queue.deadline if per_queue else None,
            )
        )
    return WorkerConfig(
        queues=tuple(built),
        alias=cfg.DATABASE_ALIAS,
        burst=burst,
        maintenance=maintenance,
        claim_batch=cfg.CLAIM_BATCH_SIZE,
        completion_batch=cfg.COMPLETION_BATCH_SIZE,
        completion_flush=cfg.COMPLETION_FLUSH_INTERVAL,
        poll_interval=cfg.POLL_INTERVAL,
        heartbeat_interval=cfg.HEARTBEAT_INTERVAL,
        heartbeat_staleness=cfg.HEARTBEAT_STALENESS,
        shutdown_timeout=cfg.SHUTDOWN_TIMEOUT,
        abandon_after=cfg.ABANDON_AFTER,
        runtime_refresh=cfg.RUNTIME_REFRESH_INTERVAL,
        aging_interval=cfg.PRIORITY_AGING_INTERVAL,
        notify=cfg.NOTIFY,
        result_max_bytes=cfg.RESULT_MAX_BYTES,
        json_max_depth=cfg.JSON_MAX_DEPTH,
        backoff_base=cfg.RETRY_BACKOFF_BASE,
    )
