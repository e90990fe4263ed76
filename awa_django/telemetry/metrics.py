"""OpenTelemetry metrics (``AWA["OTEL_METRICS"]``, or ``awa_worker --metrics-port``).

Nothing here imports OpenTelemetry until :func:`active_metrics` finds metrics switched on; with
them off, the worker, the producer and the leader each pay one ``is None`` test where they
would record.

Recording costs almost nothing on the hot path, by design. OpenTelemetry's Python SDK spends
several microseconds per ``Counter.add`` or ``Histogram.record`` (about a tenth of a worker's
whole per-job budget), so:

* the job counters are plain dicts updated once per claim or finalize batch (per distinct
  queue and kind), read by **observable** counters when a reader collects: their values are
  exact cumulative counts;
* the handler-duration and queue-wait histograms record every job up to a budget per queue
  and kind (a token bucket: :data:`SAMPLE_BURST` values at once, :data:`SAMPLE_RATE` per
  second after that), so under heavy load each is a sample whose count is below the
  counters' (rates come from the counters; quantiles from the sample);
* batch sizes are recorded once per batch;
* queue depth, lag and live workers are observable gauges over a snapshot the maintenance
  leader reads from the database every ``RUNTIME_REFRESH_INTERVAL`` (``awa.queue_lag_v1``:
  lane cursors and one index probe per lane), so only the leader reports them and a scrape
  never queries the database.

Instrument names follow OpenTelemetry's semantic conventions for messaging where one fits
(``messaging.client.sent.messages``, ``messaging.client.consumed.messages``,
``messaging.process.duration``, attribute ``messaging.destination.name`` for the queue); the
others are ``awa.*``. docs/observability.md lists them with their Prometheus names.
"""

from __future__ import annotations

import dataclasses
import threading
import time
import weakref
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from operator import attrgetter
from typing import TYPE_CHECKING, Any, Final, Protocol

from awa_django._version import __version__
from awa_django.conf import get_awa_settings

if TYPE_CHECKING:
    from opentelemetry.metrics import CallbackOptions, MeterProvider, Observation

    from awa_django.db.storage import ClaimedJob, Finalization

__all__ = [
    "COUNTERS",
    "SAMPLE_BURST",
    "SAMPLE_RATE",
    "Metrics",
    "QueueSnapshot",
    "active_metrics",
    "use_meter_provider",
]

#: Event → instrument name of the job counters (observable, cumulative, unit ``{job}``).
COUNTERS: Final[Mapping[str, str]] = {
    "enqueued": "messaging.client.sent.messages",
    "claimed": "messaging.client.consumed.messages",
    "completed": "awa.jobs.completed",
    "failed": "awa.jobs.failed",
    "retried": "awa.jobs.retried",
    "rescued": "awa.jobs.rescued",
    "dead_lettered": "awa.jobs.dead_lettered",
    "cancelled": "awa.jobs.cancelled",
    "snoozed": "awa.jobs.snoozed",
}
_DESCRIPTIONS: Final[Mapping[str, str]] = {
    "enqueued": "Jobs enqueued by this process (counted when written; a rollback is not "
    "subtracted)",
    "claimed": "Attempts claimed by this worker process",
    "completed": "Attempts that completed",
    "failed": "Jobs that failed for good and stayed in history (their queue's DLQ is off)",
    "retried": "Attempts that failed and will be retried",
    "rescued": "Attempts rescued by the maintenance leader (dead worker, deadline, callback "
    "timeout)",
    "dead_lettered": "Jobs that failed for good and went to the dead letter queue",
    "cancelled": "Attempts that ended cancelled (Cancel returned)",
    "snoozed": "Attempts that snoozed",
}

#: Handler durations recorded at once per queue and kind, then per second (see the module doc).
SAMPLE_BURST = 200
SAMPLE_RATE = 100.0

#: Bucket bounds (seconds) of the duration histogram: 1 ms to 1 hour.
DURATION_BUCKETS: Final = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    300.0, 900.0, 3600.0,
)  # fmt: skip
#: Bucket bounds of the batch-size histograms.
BATCH_BUCKETS: Final = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)

_SYSTEM: Final = "awa"


@dataclasses.dataclass(frozen=True, slots=True)
class QueueSnapshot:
    """What the leader read last: per queue ``(depth, lag_seconds or None)``, live workers,
    and when (``time.monotonic()``)."""

    queues: Mapping[str, tuple[int, float | None]]
    workers: int
    read_at: float
    #: Workflows and batches per ``(kind, state)``: running, completed, failed.
    workflows: Mapping[tuple[str, str], int] = dataclasses.field(default_factory=dict)


class _Counted(Protocol):
    """A maintenance leader (``Maintenance``): its counters, and whether it leads."""

    counters: dict[str, int]
    lag: dict[str, float]

    def is_leader(self) -> bool: ...


class Metrics:
    """This process's instruments and the local aggregates behind them. Thread-safe: the
    producer counts from request threads, the worker from its event loop, and a reader
    collects from a thread of its own."""

    def __init__(self, provider: MeterProvider | None = None) -> None:
        from opentelemetry import metrics as api

        meter = (provider or api.get_meter_provider()).get_meter("awa_django", __version__)
        self._lock = threading.Lock()
        self.counts: dict[str, dict[tuple[str, str], int]] = {event: {} for event in COUNTERS}
        self._tokens: dict[tuple[str, str], list[float]] = {}
        self._quiet_until = 0.0
        self._leaders: weakref.WeakSet[Any] = weakref.WeakSet()
        self.snapshot: QueueSnapshot | None = None
        #: Snapshots older than this (seconds) are not reported (leadership went elsewhere).
        self.snapshot_ttl = 3 * float(get_awa_settings().RUNTIME_REFRESH_INTERVAL)
        #: Queues whose DLQ is off, and when that was read (``time.monotonic()``).
        self.dlq_off: frozenset[str] = frozenset()
        self.dlq_read_at: float | None = None
        for event, name in COUNTERS.items():
            meter.create_observable_counter(
                name,
                callbacks=[self._job_counter(event)],
                unit="{job}",
                description=_DESCRIPTIONS[event],
            )
        self.duration = meter.create_histogram(
            "messaging.process.duration",
            unit="s",
            description="How long handlers ran (sampled under heavy load: see the docs)",
            explicit_bucket_boundaries_advisory=list(DURATION_BUCKETS),
        )
        self.queue_wait = meter.create_histogram(
            "awa.queue.wait",
            unit="s",
            description="How long jobs waited from when they were due to their claim (database "
            "clock; sampled under heavy load like the duration)",
            explicit_bucket_boundaries_advisory=list(DURATION_BUCKETS),
        )
        self.claim_batch = meter.create_histogram(
            "awa.claim.batch_size",
            unit="{job}",
            description="Jobs per claim (claims that found nothing are not recorded)",
            explicit_bucket_boundaries_advisory=list(BATCH_BUCKETS),
        )
        self.finalize_batch = meter.create_histogram(
            "awa.finalize.batch_size",
            unit="{job}",
            description="Outcomes per finalize statement",
            explicit_bucket_boundaries_advisory=list(BATCH_BUCKETS),
        )
        meter.create_observable_counter(
            "awa.maintenance.events",
            callbacks=[self._maintenance_events],
            unit="{event}",
            description="Maintenance outcomes by event: promoted, rescued, rotate_<ring>_"
            "<outcome>, prune_<ring>_<outcome>, dlq_expired, cleaned, unique_released, "
            "cron_fired",
        )
        meter.create_observable_gauge(
            "awa.maintenance.lag",
            callbacks=[self._maintenance_lag],
            unit="s",
            description="How late each maintenance task last started after it was due (the "
            "leader's): promote, rescue, prune, rotate, ...",
        )
        meter.create_observable_gauge(
            "awa.queue.depth",
            callbacks=[self._depth],
            unit="{job}",
            description="Jobs waiting to be claimed, per queue (approximate; the leader's)",
        )
        meter.create_observable_gauge(
            "awa.queue.lag",
            callbacks=[self._lag],
            unit="s",
            description="Age of the oldest job waiting to be claimed, per queue (the leader's)",
        )
        meter.create_observable_gauge(
            "awa.workflows",
            callbacks=[self._workflows],
            unit="{workflow}",
            description="Workflows and batches by kind and state (running, completed, failed; "
            "finished ones until WORKFLOW_RETENTION; the leader's)",
        )
        meter.create_observable_gauge(
            "awa.workers.alive",
            callbacks=[self._workers],
            unit="{process}",
            description="Worker processes seen within the staleness bound (the leader's)",
        )

    # -- recording (hot paths: no OpenTelemetry call per job) -----------------------------------

    def count(self, event: str, pairs: Iterable[tuple[str, str]]) -> None:
        """Add one ``event`` per ``(queue, kind)`` in ``pairs``, from any thread (producers
        count from request threads: under the lock)."""
        counted = Counter(pairs)
        if not counted:
            return
        with self._lock:
            counts = self.counts[event]
            for pair, n in counted.items():
                counts[pair] = counts.get(pair, 0) + n

    def _add(self, event: str, pair: tuple[str, str], n: int = 1) -> None:
        # The worker's own events, from its event loop only: no lock (a reader copies a dict
        # with list(), which no other thread can interleave with, and only the loop writes it).
        counts = self.counts[event]
        counts[pair] = counts.get(pair, 0) + n

    def _take(self, key: tuple[str, str], now: float) -> bool:
        """Whether a value of series ``key`` may be recorded now (the sampling budget)."""
        bucket = self._tokens.get(key)
        if bucket is None:
            bucket = self._tokens[key] = [float(SAMPLE_BURST), now]
        else:
            bucket[0] = min(float(SAMPLE_BURST), bucket[0] + (now - bucket[1]) * SAMPLE_RATE)
            bucket[1] = now
        if bucket[0] >= 1.0:
            bucket[0] -= 1.0
            return True
        return False

    def _sampled(self, key: tuple[str, str], now: float) -> bool:
        """:meth:`_take` behind one comparison: once a series runs out, every series waits for
        one value's worth of budget (under load, the busy series share the budget)."""
        if now < self._quiet_until:
            return False
        if self._take(key, now):
            return True
        self._quiet_until = now + 1.0 / SAMPLE_RATE
        return False

    def claimed(self, queue: str, jobs: list[ClaimedJob]) -> None:
        """One claim batch, from the worker's event loop. Its size is recorded within the
        sampling budget: sync handlers free slots one by one, so a worker may claim almost as
        often as it runs a job, and this must cost next to nothing."""
        if len(jobs) == 1:
            self._add("claimed", (queue, jobs[0].kind))
        else:
            for kind, n in Counter(map(_KIND, jobs)).items():  # counted in C
                self._add("claimed", (queue, kind), n)
        now = time.monotonic()
        if self._sampled(("\x00claim", queue), now):
            self.claim_batch.record(len(jobs), {"messaging.destination.name": queue})
        for job in jobs:
            # Within the budget of the job's series (one comparison per job under load).
            if now < self._quiet_until:
                return
            key = ("\x00wait\x00" + job.queue, job.kind)
            if job.wait_secs is not None and self._sampled(key, now):
                self.queue_wait.record(max(job.wait_secs, 0.0), _attributes((job.queue, job.kind)))

    def handler_done(self, job: ClaimedJob, seconds: float, now: float) -> None:
        """A handler ended after ``seconds``, at ``now`` (a monotonic clock in seconds: the
        event loop's); recorded within the sampling budget."""
        if now < self._quiet_until:
            return  # the fast path under load: one comparison per job
        key = (job.queue, job.kind)
        if self._sampled(key, now):
            self.duration.record(seconds, _attributes(key))

    def written(
        self,
        batch: list[Finalization],
        jobs: list[ClaimedJob | None],
        stale: set[tuple[int, int]],
        fates: Mapping[tuple[int, int], str] | None = None,
    ) -> None:
        """A finalize batch was written, from the worker's event loop: count each outcome that
        was not stale (and whose attempt is known). ``fates`` maps ``(job_id, attempt)`` of the
        retry and fail outcomes that failed for good to ``dead_lettered`` or ``failed`` (the
        other retries were retried); without it they are told apart by attempt and
        :attr:`dlq_off`."""
        if self._sampled(("\x00finalize", ""), time.monotonic()):
            self.finalize_batch.record(len(batch))
        if stale or len(batch) < 8:
            for item, job in zip(batch, jobs, strict=True):
                if job is not None and (item.job_id, item.run_lease) not in stale:
                    self._outcome(item.outcome, job, fates)
            return
        try:
            # Counted in C (Counter over attribute getters): no Python code per job.
            keys = Counter(
                zip(map(_OUTCOME, batch), map(_QUEUE, jobs), map(_KIND, jobs), strict=True)
            )
        except AttributeError:  # an outcome without its attempt (None): not counted
            for item, job in zip(batch, jobs, strict=True):
                if job is not None:
                    self._outcome(item.outcome, job, fates)
            return
        retries = False
        for (outcome, queue, kind), n in keys.items():
            if outcome in ("retry", "fail"):
                retries = True  # retried, dead-lettered or failed: each job's fate tells
                continue
            event = _EVENTS.get(outcome)
            if event is None:
                continue  # wait: its callback decides later
            if event == "dead_lettered" and queue in self.dlq_off:
                event = "failed"
            self._add(event, (queue, kind), n)
        if retries:
            for item, job in zip(batch, jobs, strict=True):
                if item.outcome in ("retry", "fail") and job is not None:
                    self._outcome(item.outcome, job, fates)

    def _outcome(
        self,
        outcome: str,
        job: ClaimedJob,
        fates: Mapping[tuple[int, int], str] | None = None,
    ) -> None:
        """Count one written outcome (``fates`` as for :meth:`written`)."""
        if fates is not None and outcome in ("retry", "fail"):
            found_fate = fates.get((job.job_id, job.attempt))
            if found_fate is not None or outcome == "retry":
                self._add(found_fate or "retried", (job.queue, job.kind))
                return
        if outcome == "retry":
            if job.attempt < job.max_attempts:
                event = "retried"
            else:
                event = "failed" if job.queue in self.dlq_off else "dead_lettered"
        else:
            found = _EVENTS.get(outcome)
            if found is None:
                return  # wait: its callback decides later
            event = found
            if event == "dead_lettered" and job.queue in self.dlq_off:
                event = "failed"
        self._add(event, (job.queue, job.kind))

    def dlq_due(self, now: float, every: float = 10.0) -> bool:
        """Whether the DLQ policy of the queues should be read again."""
        return self.dlq_read_at is None or now - self.dlq_read_at >= every

    def set_dlq_off(self, queues: Iterable[str], now: float) -> None:
        self.dlq_off = frozenset(queues)
        self.dlq_read_at = now

    def watch(self, maintenance: _Counted) -> None:
        """Report this maintenance loop's counters (``awa.maintenance.events``)."""
        self._leaders.add(maintenance)

    # -- collection (a reader's thread) -----------------------------------------------------------

    def _job_counter(self, event: str) -> Callable[[CallbackOptions], Iterator[Observation]]:
        def observe(options: CallbackOptions) -> Iterator[Observation]:
            from opentelemetry.metrics import Observation

            with self._lock:
                items = list(self.counts[event].items())
            for key, value in items:
                yield Observation(value, _attributes(key))

        return observe

    def _maintenance_events(self, options: CallbackOptions) -> Iterator[Observation]:
        from opentelemetry.metrics import Observation

        totals: dict[str, int] = {}
        for leader in list(self._leaders):
            for name, value in list(leader.counters.items()):
                totals[name] = totals.get(name, 0) + value
        for name, value in sorted(totals.items()):
            yield Observation(value, {"awa.maintenance.event": name})

    def _maintenance_lag(self, options: CallbackOptions) -> Iterator[Observation]:
        from opentelemetry.metrics import Observation

        for leader in list(self._leaders):
            if not leader.is_leader():
                continue
            for name, value in sorted(dict(leader.lag).items()):
                yield Observation(value, {"awa.maintenance.task": name})

    def _fresh(self) -> QueueSnapshot | None:
        snap = self.snapshot
        if snap is None or time.monotonic() - snap.read_at > self.snapshot_ttl:
            return None
        return snap

    def _depth(self, options: CallbackOptions) -> Iterator[Observation]:
        from opentelemetry.metrics import Observation

        snap = self._fresh()
        for queue, (depth, _lag) in (snap.queues if snap else {}).items():
            yield Observation(depth, _queue_attributes(queue))

    def _lag(self, options: CallbackOptions) -> Iterator[Observation]:
        from opentelemetry.metrics import Observation

        snap = self._fresh()
        for queue, (_depth, lag) in (snap.queues if snap else {}).items():
            yield Observation(lag or 0.0, _queue_attributes(queue))

    def _workflows(self, options: CallbackOptions) -> Iterator[Observation]:
        from opentelemetry.metrics import Observation

        snap = self._fresh()
        for (kind, state), n in (snap.workflows if snap else {}).items():
            yield Observation(
                n,
                {
                    "messaging.system": _SYSTEM,
                    "awa.workflow.kind": kind,
                    "awa.workflow.state": state,
                },
            )

    def _workers(self, options: CallbackOptions) -> Iterator[Observation]:
        from opentelemetry.metrics import Observation

        snap = self._fresh()
        if snap is not None:
            yield Observation(snap.workers, {"messaging.system": _SYSTEM})


_KIND = attrgetter("kind")
_QUEUE = attrgetter("queue")
_OUTCOME = attrgetter("outcome")
#: Outcome → event, but for ``retry`` (which depends on the attempt) and ``wait``.
_EVENTS: Final[Mapping[str, str]] = {
    "completed": "completed",
    "fail": "dead_lettered",
    "cancel": "cancelled",
    "snooze": "snoozed",
}


def _attributes(key: tuple[str, str]) -> dict[str, str]:
    return {
        "messaging.system": _SYSTEM,
        "messaging.destination.name": key[0],
        "awa.job.kind": key[1],
    }


def _queue_attributes(queue: str) -> dict[str, str]:
    return {"messaging.system": _SYSTEM, "messaging.destination.name": queue}


_metrics: Metrics | None = None
_provider: MeterProvider | None = None
_forced = False
_create_lock = threading.Lock()


def use_meter_provider(provider: MeterProvider | None, *, force: bool = True) -> None:
    """Record into ``provider`` from now on (None: the global one), with metrics on whatever
    ``AWA["OTEL_METRICS"]`` says when ``force`` (``awa_worker --metrics-port`` does this; so can
    a test with an in-memory reader). Instruments made before are dropped."""
    global _metrics, _provider, _forced
    with _create_lock:
        _provider, _forced, _metrics = provider, force, None


def active_metrics() -> Metrics | None:
    """This process's :class:`Metrics` when metrics are on (made on first use), else None.

    Raises ``ImproperlyConfigured`` when they are on but OpenTelemetry is not installed."""
    global _metrics
    if not (_forced or get_awa_settings().OTEL_METRICS):
        return None
    found = _metrics
    if found is not None:
        return found
    with _create_lock:
        if _metrics is None:
            try:
                _metrics = Metrics(_provider)
            except ImportError as exc:
                from django.core.exceptions import ImproperlyConfigured

                raise ImproperlyConfigured(
                    "AWA['OTEL_METRICS'] needs OpenTelemetry: pip install 'awa-django[otel]' "
                    f"({exc})"
                ) from exc
        return _metrics
