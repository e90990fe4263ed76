"""The configuration of one worker process, from ``AWA`` settings and command-line options.

Concurrency is counted per process: ``--concurrency`` / ``AWA["CONCURRENCY"]`` is how many jobs
one worker process runs at once across all the queues it serves (the size of its handler thread
pool). A queue's own number (``--queue NAME=N``, ``AWA["QUEUES"][name]["concurrency"]``) caps
that queue within it, so that one busy queue cannot take every slot.

Queues: a worker given ``--queue`` serves exactly those. A worker without ``--queue`` serves
every queue that exists in the database (anything was ever enqueued to), finding new ones as
they appear (``WorkerConfig.discover``), plus the queues the configuration names, so that
whatever can be enqueued is run.

``OWN_CONNECTIONS``, ``own_connections`` and ``connection_budget`` are re-exported from
``awa_django.connection_budget``.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from types import MappingProxyType

from awa_django.conf import AwaSettings, QueueSettings, get_awa_settings
from awa_django.connection_budget import OWN_CONNECTIONS, connection_budget, own_connections
from awa_django.exceptions import InvalidOptionError
from awa_django.jobs import registered_kinds
from awa_django.limits import QUEUE_NAME_RE, check_queue_name

__all__ = [
    "MAX_PROCESSES",
    "MAX_SLOTS",
    "OWN_CONNECTIONS",
    "QueueConfig",
    "WorkerConfig",
    "build_config",
    "connection_budget",
    "own_connections",
    "parse_queue_option",
]

#: Most jobs one process runs at once (--concurrency, and each --queue NAME=N).
MAX_SLOTS = 10_000
#: Most worker processes under one supervisor (--processes).
MAX_PROCESSES = 256

_QUEUE_OPTION = re.compile(r"(?P<name>[^=]*)(?:=(?P<concurrency>.*))?", re.DOTALL)
_DECIMAL = re.compile(r"[+-]?[0-9]+")


@dataclasses.dataclass(frozen=True, slots=True)
class QueueConfig:
    """One queue a worker serves: the most of its jobs the process runs at once (never more
    than the process's own concurrency), and its default hard deadline in seconds."""

    name: str
    concurrency: int
    deadline: float | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class WorkerConfig:
    """Everything one worker process needs: what the command line decided, and the validated
    ``AWA`` settings (``settings.POLL_INTERVAL`` and so on; intervals in seconds) for the rest.

    ``concurrency`` is the most jobs the process runs at once across all its queues;
    ``queues`` are the queues it serves from the start; with ``discover`` it also serves every
    queue found in the database, at start and then every ``RUNTIME_REFRESH_INTERVAL`` (and at
    once when a wake-up names a queue it does not serve yet). ``processes`` is the size of the
    fleet this process belongs to (``--processes``), for the connection budget.
    """

    queues: tuple[QueueConfig, ...]
    #: The validated ``AWA`` settings every interval, batch size and bound is read from.
    settings: AwaSettings
    concurrency: int
    discover: bool = False
    queue_settings: Mapping[str, QueueSettings] = dataclasses.field(
        default_factory=lambda: MappingProxyType({})
    )
    processes: int = 1
    burst: bool = False
    maintenance: bool = True

    @property
    def total_concurrency(self) -> int:
        """The most jobs this process runs at once (the size of its handler thread pool)."""
        return self.concurrency

    def queue_config(self, name: str) -> QueueConfig:
        """The configuration of a queue found at run time: its ``AWA["QUEUES"]`` cap and
        deadline, if any, within the process's concurrency."""
        return _queue_config(name, None, self.queue_settings.get(name), self.concurrency)


def parse_queue_option(value: str) -> tuple[str, int | None]:
    """Parse ``NAME`` or ``NAME=CONCURRENCY`` (a ``--queue`` value); raise ``ValueError`` with
    a message that names the value and says what is expected."""
    match = _QUEUE_OPTION.fullmatch(value.strip())
    assert match is not None  # the pattern matches any text
    name, number = match["name"].strip(), match["concurrency"]
    if not name:
        raise ValueError(f"--queue {value!r}: no queue name; expected NAME or NAME=CONCURRENCY")
    try:
        check_queue_name(name)
    except InvalidOptionError:
        raise ValueError(
            f"--queue {value!r}: {name!r} is not a valid queue name (1-63 characters of "
            "a-z 0-9 _ . -); expected NAME or NAME=CONCURRENCY"
        ) from None
    if number is None:
        return name, None
    number = number.strip()
    if not _DECIMAL.fullmatch(number):
        raise ValueError(
            f"--queue {value!r}: the concurrency {number!r} is not a whole number; expected "
            f"NAME=N with N from 1 to {MAX_SLOTS}"
        )
    concurrency = int(number) if len(number) <= 30 else MAX_SLOTS + 1  # no huge int()
    if not 1 <= concurrency <= MAX_SLOTS:
        raise ValueError(f"--queue {value!r}: the concurrency must be from 1 to {MAX_SLOTS}")
    return name, concurrency


def _task_queues() -> set[str]:
    """Queues listed in ``TASKS`` for awa_django's django.tasks backend."""
    from django.conf import settings

    names: set[str] = set()
    for params in getattr(settings, "TASKS", {}).values():
        if str(params.get("BACKEND", "")).endswith("awa_django.backends.tasks.AwaTaskBackend"):
            names.update(q for q in params.get("QUEUES", ()) if QUEUE_NAME_RE.fullmatch(q))
    return names


def _queue_config(
    name: str, explicit: int | None, settings: QueueSettings | None, slots: int
) -> QueueConfig:
    cap = explicit or (settings.concurrency if settings else None) or slots
    return QueueConfig(
        name=name,
        concurrency=min(cap, slots),
        deadline=settings.deadline if settings else None,
    )


def build_config(
    *,
    queues: Sequence[tuple[str, int | None]] | None = None,
    concurrency: int | None = None,
    processes: int = 1,
    burst: bool = False,
    maintenance: bool = True,
) -> WorkerConfig:
    """Merge command-line options over ``AWA`` settings; raise ``ValueError`` for options that
    contradict each other.

    Without ``queues`` the worker discovers queues (see the module docstring) and starts with
    ``AWA["DEFAULT_QUEUE"]``, ``AWA["QUEUES"]``, every queue named by a registered kind and the
    ``QUEUES`` of awa_django's django.tasks backends in ``TASKS``.

    The process runs at most ``concurrency`` jobs at once; without it, ``AWA["CONCURRENCY"]``
    or, when larger, the sum of the numbers given with ``queues`` (``--queue a=20 --queue b=2``
    runs 20 of ``a`` and 2 of ``b`` at once). When every queue of a fixed list has a cap, the
    process never runs more than their sum. Each queue's cap comes from ``queues``, then
    ``AWA["QUEUES"][name]["concurrency"]``; a queue without one may use every slot.
    """
    cfg = get_awa_settings()
    listed = list(queues or ())
    discover = not listed
    seen: set[str] = set()
    for name, _ in listed:
        if name in seen:
            raise ValueError(f"--queue {name!r} is given twice")
        seen.add(name)
    if discover:
        names = {cfg.DEFAULT_QUEUE, *cfg.QUEUES, *_task_queues()}
        names.update(h.options.queue or cfg.DEFAULT_QUEUE for h in registered_kinds().values())
        listed = [(name, None) for name in sorted(names)]
    asked = sum(n for _, n in listed if n is not None)
    if concurrency is None:
        if asked > MAX_SLOTS:
            raise ValueError(
                f"the --queue numbers add up to {asked}, more than the {MAX_SLOTS} jobs one "
                "process can run at once; run more processes (--processes) instead"
            )
        slots = max(cfg.CONCURRENCY, asked)
    else:
        slots = concurrency
        for name, number in listed:
            if number is not None and number > concurrency:
                raise ValueError(
                    f"--queue {name}={number} asks for more jobs at once than --concurrency "
                    f"{concurrency} allows the whole process; raise --concurrency or lower it"
                )
    built = tuple(_queue_config(name, n, cfg.QUEUES.get(name), slots) for name, n in listed)
    if not discover and all(
        n is not None or (cfg.QUEUES.get(name) and cfg.QUEUES[name].concurrency)
        for name, n in listed
    ):
        slots = min(slots, sum(q.concurrency for q in built))
    return WorkerConfig(
        queues=built,
        settings=cfg,
        concurrency=slots,
        discover=discover,
        queue_settings=cfg.QUEUES,
        processes=processes,
        burst=burst,
        maintenance=maintenance,
    )
