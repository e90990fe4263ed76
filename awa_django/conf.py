"""awa_django's settings: one ``AWA`` dict in Django settings, merged over :data:`DEFAULTS`.

Read them through :data:`awa_settings` (``awa_settings.POLL_INTERVAL``). The merged dict is
validated on first access and cached; the cache is dropped whenever Django's ``setting_changed``
signal reports a change of ``AWA`` (``override_settings`` in tests). Every problem raises
:class:`~django.core.exceptions.ImproperlyConfigured` naming the key: unknown keys (with a
did-you-mean hint), wrong types and out-of-range values. ``manage.py check`` reports the same
problems as ``awa.E005``. Every key is documented in docs/configuration.md.
"""

from __future__ import annotations

import difflib
import functools
import math
import reprlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from types import MappingProxyType
from typing import Any, Final, cast

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.dispatch import receiver
from django.utils.module_loading import import_string

from awa_django.exceptions import InvalidOptionError
from awa_django.limits import (
    ATTEMPTS_RANGE,
    FLOW_BURST_RANGE,
    FLOW_CONCURRENCY_RANGE,
    FLOW_RATE_MAX,
    FLOW_RATE_MIN,
    QUEUE_NAME_RE,
    check_descriptor,
    check_kind_name,
    check_schema_name,
)

__all__ = [
    "DEFAULTS",
    "AwaSettings",
    "KindSettings",
    "QueueSettings",
    "awa_settings",
    "import_job_middleware",
    "load_settings",
]


class _Kind(Enum):
    STR = "a non-empty str"
    SCHEMA = "a plain lower-case identifier (str)"
    INT = "an int"
    SECONDS = "a number of seconds (int or float)"
    RATE = "a number of jobs per second (int or float)"
    BOOL = "a bool (True or False)"
    MODULES = "a list of dotted module paths (str)"
    PATHS = "a list of dotted paths (str)"
    QUEUES = "a dict of queue name to a dict of queue settings"
    KINDS = "a dict of job kind to a dict of its flow limits"
    SCHEDULES = "a dict of schedule name to a dict (docs/periodic.md)"
    KEYS = "a list of secret keys (str of at least 32 characters each)"
    TESTING = "a dict with MODE ('off' or 'immediate') and RAISE_FAILURES (a bool)"


@dataclass(frozen=True, slots=True)
class _Spec:
    default: object
    kind: _Kind
    minimum: int | None = None
    maximum: int | None = None


# One line per key: default, type and bounds. Intervals are in seconds and must be > 0.
_SPECS: Final[Mapping[str, _Spec]] = {
    "DATABASE_ALIAS": _Spec("default", _Kind.STR),
    # The PostgreSQL schema of the queue's tables and functions (docs/schema.md); read once per
    # process: migrations, models, queries and workers all use the one set at start-up.
    "SCHEMA": _Spec("awa", _Kind.SCHEMA),
    # Where the admin's pages and awa_status read (a streaming replica); None: DATABASE_ALIAS.
    "READ_DATABASE_ALIAS": _Spec(None, _Kind.STR),
    "JOB_MODULES": _Spec((), _Kind.MODULES),
    # Code around every handler (docs/jobs.md, "Job middleware"): factories, outermost first.
    "JOB_MIDDLEWARE": _Spec((), _Kind.PATHS),
    "DEFAULT_QUEUE": _Spec("default", _Kind.STR),
    "MAX_ATTEMPTS": _Spec(25, _Kind.INT, *ATTEMPTS_RANGE),
    "ARGS_MAX_BYTES": _Spec(1_048_576, _Kind.INT, 1),
    "METADATA_MAX_BYTES": _Spec(65_536, _Kind.INT, 1),
    "RESULT_MAX_BYTES": _Spec(1_048_576, _Kind.INT, 1),
    "JSON_MAX_DEPTH": _Spec(32, _Kind.INT, 1, 256),
    "MAX_TAGS": _Spec(20, _Kind.INT, 0),
    "TAG_MAX_LENGTH": _Spec(100, _Kind.INT, 1),
    "ENQUEUE_SHARDS": _Spec(4, _Kind.INT, 1, 64),
    "PRIORITY_AGING_INTERVAL": _Spec(60.0, _Kind.SECONDS),
    "RETRY_BACKOFF_BASE": _Spec(1.0, _Kind.SECONDS),
    "CLAIM_BATCH_SIZE": _Spec(512, _Kind.INT, 1),
    "COMPLETION_BATCH_SIZE": _Spec(512, _Kind.INT, 1),
    "COMPLETION_FLUSH_INTERVAL": _Spec(0.002, _Kind.SECONDS),
    "POLL_INTERVAL": _Spec(0.2, _Kind.SECONDS),
    # The sweep of a worker's idle queues (docs/worker.md, "Many queues"): the longest a pass
    # over all of them may take, the longest pause between two of its statements, and the
    # longest back-off after failed ones.
    "SWEEP_MAX_INTERVAL": _Spec(10.0, _Kind.SECONDS),
    "SWEEP_MAX_PAUSE": _Spec(1.0, _Kind.SECONDS),
    "SWEEP_BACKOFF_MAX": _Spec(5.0, _Kind.SECONDS),
    "HEARTBEAT_INTERVAL": _Spec(30.0, _Kind.SECONDS),
    "HEARTBEAT_STALENESS": _Spec(90.0, _Kind.SECONDS),
    "PROMOTE_INTERVAL": _Spec(0.25, _Kind.SECONDS),
    "RESCUE_INTERVAL": _Spec(5.0, _Kind.SECONDS),
    "PRUNE_INTERVAL": _Spec(1.0, _Kind.SECONDS),
    "CLAIM_ROTATE_INTERVAL": _Spec(10.0, _Kind.SECONDS),
    "LEADER_ELECTION_INTERVAL": _Spec(5.0, _Kind.SECONDS),
    "RUNTIME_REFRESH_INTERVAL": _Spec(10.0, _Kind.SECONDS),
    "SHUTDOWN_TIMEOUT": _Spec(30.0, _Kind.SECONDS),
    "ABANDON_AFTER": _Spec(30.0, _Kind.SECONDS),
    "HISTORY_RETENTION": _Spec(86_400.0, _Kind.SECONDS),
    "DLQ_RETENTION": _Spec(2_592_000.0, _Kind.SECONDS),
    "WORKFLOW_RETENTION": _Spec(86_400.0, _Kind.SECONDS),
    "RUNTIME_RETENTION": _Spec(3_600.0, _Kind.SECONDS),
    # Descriptors no live worker has declared for this long are deleted (docs/descriptors.md).
    "DESCRIPTOR_RETENTION": _Spec(2_592_000.0, _Kind.SECONDS),
    "UNIQUE_SWEEP_INTERVAL": _Spec(60.0, _Kind.SECONDS),
    # Jobs one worker process runs at once across all its queues (its handler thread pool).
    "CONCURRENCY": _Spec(32, _Kind.INT, 1, 10_000),
    "PROCESSES": _Spec(1, _Kind.INT, 1, 256),
    "QUEUES": _Spec(MappingProxyType({}), _Kind.QUEUES),
    # Flow limits of job kinds (docs/flow.md, "Per kind"), beside @job(global_concurrency=...).
    "KINDS": _Spec(MappingProxyType({}), _Kind.KINDS),
    "NOTIFY": _Spec(True, _Kind.BOOL),
    # Periodic jobs: named schedules (each entry is checked by awa.E007, not here, so that
    # one bad schedule never makes the other settings unusable), and how often the leader
    # looks for due fires.
    "PERIODIC": _Spec(MappingProxyType({}), _Kind.SCHEDULES),
    "CRON_EVAL_INTERVAL": _Spec(1.0, _Kind.SECONDS),
    # OpenTelemetry (the awa-django[otel] extra; docs/observability.md): off, nothing imported.
    "OTEL_METRICS": _Spec(False, _Kind.BOOL),
    "OTEL_TRACES": _Spec(False, _Kind.BOOL),
    # The signed callback receiver (awa_django.urls, docs/callbacks.md): its keys (the first
    # signs, every one verifies; none: the receiver answers 404), how far a request's timestamp
    # may be from the database clock, and the largest body it reads.
    "CALLBACK_KEYS": _Spec((), _Kind.KEYS),
    "CALLBACK_TIMESTAMP_TOLERANCE": _Spec(300.0, _Kind.SECONDS),
    "CALLBACK_MAX_BYTES": _Spec(65_536, _Kind.INT, 1),
    # awa_django.testing (docs/testing.md): "immediate" runs each job when the transaction
    # that enqueued it commits, in-process; for test settings only.
    "TESTING": _Spec(MappingProxyType({"MODE": "off", "RAISE_FAILURES": True}), _Kind.TESTING),
}

#: The shortest callback key (characters): 32, as for an HMAC-SHA256 key of 256 bits.
CALLBACK_KEY_MIN_LENGTH = 32

#: Settings whose values are secrets: never shown in a repr or an error message.
_SECRET = frozenset({"CALLBACK_KEYS"})

DEFAULTS: Final[Mapping[str, object]] = MappingProxyType(
    {name: spec.default for name, spec in _SPECS.items()}
)
"""Every AWA key with its default (read-only)."""

# Keys of one AWA["QUEUES"][name] dict.
_QUEUE_SPECS: Final[Mapping[str, _Spec]] = {
    "concurrency": _Spec(None, _Kind.INT, 1, 10_000),
    "deadline": _Spec(None, _Kind.SECONDS),
    "dlq": _Spec(None, _Kind.BOOL),
    "global_concurrency": _Spec(None, _Kind.INT, *FLOW_CONCURRENCY_RANGE),
    "rate_limit": _Spec(None, _Kind.RATE, 0, FLOW_RATE_MAX),
    "rate_burst": _Spec(None, _Kind.INT, *FLOW_BURST_RANGE),
}


class _FlowLimits:
    """What queue and kind settings share: their fleet-wide flow limits (docs/flow.md)."""

    __slots__ = ()
    global_concurrency: int | None
    rate_limit: float | None
    rate_burst: int | None

    @property
    def has_flow_limits(self) -> bool:
        """Whether any fleet-wide flow limit is set."""
        return self.global_concurrency is not None or self.rate_limit is not None

    def flow_limits(self) -> dict[str, float | int | None]:
        """The limits as ``awa.flow_sync_v1`` (queues) and ``awa.flow_kind_sync_v1`` (kinds)
        take them for one name."""
        return {
            "max_running": self.global_concurrency,
            "rate": self.rate_limit,
            "burst": self.rate_burst,
        }


@dataclass(frozen=True, slots=True)
class QueueSettings(_FlowLimits):
    """Overrides for one queue, from ``AWA["QUEUES"][name]``; None means "use the default".

    ``concurrency`` caps the jobs of this queue one worker process runs at once, within the
    process's ``CONCURRENCY`` (which counts jobs across all its queues; a higher cap is held to
    it, and ``manage.py check`` warns: awa.W001). ``deadline`` is the hard limit in seconds on
    one attempt, after which the attempt is rescued. ``dlq`` turns the queue's dead letter queue
    on or off (jobs that fail for good go to the DLQ, or to history as failed); every worker and
    maintenance process writes it to the database when it starts. A queue needs no entry to be
    served.

    Flow limits across every worker process and host (docs/flow.md): ``global_concurrency``
    is the most attempts of the queue running at once, counted by job weight;
    ``rate_limit`` the most jobs started per second, with bursts of up to ``rate_burst`` jobs
    (default: a tenth of a second's worth, at least 1). Workers write them to the database
    when they start; an operator may override them at runtime (admin, ``awa_queue limit``).
    """

    concurrency: int | None = None
    deadline: float | None = None
    dlq: bool | None = None
    global_concurrency: int | None = None
    rate_limit: float | None = None
    rate_burst: int | None = None
    #: What the queue is for (docs/descriptors.md): ``label``, ``description``, ``owner``,
    #: ``links``, as checked by :func:`awa_django.limits.check_descriptor`.
    descriptor: Mapping[str, object] = field(default_factory=dict, hash=False)


# Keys of one AWA["QUEUES"][name] dict that describe the queue (docs/descriptors.md).
_DESCRIPTOR_KEYS = ("label", "description", "owner", "links")

# Keys of one AWA["KINDS"][kind] dict: the flow limits of the queue settings.
_KIND_SPECS: Final[Mapping[str, _Spec]] = {
    key: _QUEUE_SPECS[key] for key in ("global_concurrency", "rate_limit", "rate_burst")
}


@dataclass(frozen=True, slots=True)
class KindSettings(_FlowLimits):
    """Flow limits of one job kind across every queue, worker process and host (docs/flow.md,
    "Per kind"), from ``AWA["KINDS"][kind]`` or ``@job(global_concurrency=..., rate_limit=...,
    rate_burst=...)``: the most attempts of the kind running at once, counted by job weight;
    the most started per second, with bursts of up to ``rate_burst``. Workers write them to
    the database when they start; an operator may override them (``awa_queue limit --kind``,
    the admin)."""

    global_concurrency: int | None = None
    rate_limit: float | None = None
    rate_burst: int | None = None


class AwaSettings:
    """The validated, merged ``AWA`` settings. Intervals are floats in seconds."""

    DATABASE_ALIAS: str
    SCHEMA: str
    READ_DATABASE_ALIAS: str | None
    JOB_MODULES: tuple[str, ...]
    JOB_MIDDLEWARE: tuple[str, ...]
    DEFAULT_QUEUE: str
    MAX_ATTEMPTS: int
    ARGS_MAX_BYTES: int
    METADATA_MAX_BYTES: int
    RESULT_MAX_BYTES: int
    JSON_MAX_DEPTH: int
    MAX_TAGS: int
    TAG_MAX_LENGTH: int
    ENQUEUE_SHARDS: int
    PRIORITY_AGING_INTERVAL: float
    RETRY_BACKOFF_BASE: float
    CLAIM_BATCH_SIZE: int
    COMPLETION_BATCH_SIZE: int
    COMPLETION_FLUSH_INTERVAL: float
    POLL_INTERVAL: float
    SWEEP_MAX_INTERVAL: float
    SWEEP_MAX_PAUSE: float
    SWEEP_BACKOFF_MAX: float
    HEARTBEAT_INTERVAL: float
    HEARTBEAT_STALENESS: float
    PROMOTE_INTERVAL: float
    RESCUE_INTERVAL: float
    PRUNE_INTERVAL: float
    CLAIM_ROTATE_INTERVAL: float
    LEADER_ELECTION_INTERVAL: float
    RUNTIME_REFRESH_INTERVAL: float
    SHUTDOWN_TIMEOUT: float
    ABANDON_AFTER: float
    HISTORY_RETENTION: float
    DLQ_RETENTION: float
    WORKFLOW_RETENTION: float
    RUNTIME_RETENTION: float
    DESCRIPTOR_RETENTION: float
    UNIQUE_SWEEP_INTERVAL: float
    CONCURRENCY: int
    PROCESSES: int
    QUEUES: Mapping[str, QueueSettings]
    KINDS: Mapping[str, KindSettings]
    NOTIFY: bool
    PERIODIC: Mapping[str, Mapping[str, object]]
    CRON_EVAL_INTERVAL: float
    OTEL_METRICS: bool
    OTEL_TRACES: bool
    CALLBACK_KEYS: tuple[str, ...]
    CALLBACK_TIMESTAMP_TOLERANCE: float
    CALLBACK_MAX_BYTES: int
    TESTING: Mapping[str, object]

    def __init__(self, values: Mapping[str, object]) -> None:
        for name, value in values.items():
            object.__setattr__(self, name, value)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("awa_django settings are read-only; change settings.AWA instead")

    @property
    def read_alias(self) -> str:
        """Where the admin's pages and ``awa_status`` read: ``READ_DATABASE_ALIAS``, or
        ``DATABASE_ALIAS`` when it is None. Every write goes to ``DATABASE_ALIAS``."""
        return self.READ_DATABASE_ALIAS or self.DATABASE_ALIAS

    def __repr__(self) -> str:
        shown = (
            f"{k}=<{len(getattr(self, k))} secret(s)>"
            if k in _SECRET
            else f"{k}={getattr(self, k)!r}"
            for k in _SPECS
        )
        return f"AwaSettings({', '.join(shown)})"


def load_settings(raw: object) -> AwaSettings:
    """Validate a raw ``AWA`` value and merge it over :data:`DEFAULTS`.

    Raises ImproperlyConfigured for the first problem found; does not read Django settings.
    """
    if not isinstance(raw, Mapping):
        raise ImproperlyConfigured(f"AWA must be a dict, got {_describe(raw)}.")
    _reject_unknown("AWA", raw, _SPECS)
    values = {
        name: _validate(f"AWA[{name!r}]", raw.get(name, spec.default), spec)
        for name, spec in _SPECS.items()
    }
    tolerance = cast(float, values["CALLBACK_TIMESTAMP_TOLERANCE"])
    if not 1.0 <= tolerance <= 86_400.0:
        raise ImproperlyConfigured(
            f"AWA['CALLBACK_TIMESTAMP_TOLERANCE'] must be between 1 and 86400 seconds, got "
            f"{tolerance:g}: signed timestamps are whole seconds, and the window is at most a "
            "day."
        )
    if cast(float, values["DESCRIPTOR_RETENTION"]) < 3600:
        raise ImproperlyConfigured(
            "AWA['DESCRIPTOR_RETENTION'] must be at least 3600 seconds: a declaration's last "
            "sighting is written hourly, so a shorter retention would delete live ones."
        )
    interval = cast(float, values["HEARTBEAT_INTERVAL"])
    staleness = cast(float, values["HEARTBEAT_STALENESS"])
    if staleness <= interval:
        raise ImproperlyConfigured(
            f"AWA['HEARTBEAT_STALENESS'] ({staleness:g}) must be greater than "
            f"AWA['HEARTBEAT_INTERVAL'] ({interval:g}): live attempts would be rescued "
            "between two heartbeats."
        )
    return AwaSettings(values)


def _reject_unknown(where: str, raw: Mapping[object, object], specs: Mapping[str, object]) -> None:
    for key in raw:
        if key in specs:
            continue
        message = f"{where} has no setting {key!r}."
        if isinstance(key, str):
            folded = {name.casefold(): name for name in specs}
            close = difflib.get_close_matches(key.casefold(), folded, n=1)
            if close:
                message += f" Did you mean {folded[close[0]]!r}?"
        raise ImproperlyConfigured(
            f"{message} Known settings: {', '.join(specs)} (see docs/configuration.md)."
        )


def _validate(label: str, value: object, spec: _Spec) -> object:
    """Check one value against its spec; return it in its stored form."""
    kind = spec.kind
    if kind is _Kind.BOOL:
        if value is None and spec.default is None:
            return None
        if not isinstance(value, bool):
            raise _wrong_type(label, kind, value)
        return value
    if kind is _Kind.STR:
        if value is None and spec.default is None:
            return None
        if not isinstance(value, str) or not value:
            raise _wrong_type(label, kind, value)
        return value
    if kind is _Kind.SCHEMA:
        try:
            return check_schema_name(value, label)
        except ValueError as exc:
            raise ImproperlyConfigured(f"{exc}.") from None
    if kind is _Kind.INT:
        if value is None and spec.default is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise _wrong_type(label, kind, value)
        _check_range(label, value, spec)
        return value
    if kind is _Kind.SECONDS:
        if value is None and spec.default is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise _wrong_type(label, kind, value)
        if not math.isfinite(value) or value <= 0:
            raise ImproperlyConfigured(
                f"{label} must be a finite number greater than 0, got {value!r}."
            )
        return float(value)
    if kind is _Kind.RATE:
        if value is None and spec.default is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise _wrong_type(label, kind, value)
        if not math.isfinite(value) or not FLOW_RATE_MIN <= value <= (spec.maximum or math.inf):
            raise ImproperlyConfigured(
                f"{label} must be a number from {FLOW_RATE_MIN} to {spec.maximum:,}, got {value!r}."
            )
        return float(value)
    if kind is _Kind.MODULES or kind is _Kind.PATHS:
        if not isinstance(value, list | tuple) or not all(isinstance(m, str) and m for m in value):
            raise _wrong_type(label, kind, value)
        return tuple(value)
    if kind is _Kind.KEYS:
        return _validate_keys(label, value)
    if kind is _Kind.SCHEDULES:
        if not isinstance(value, Mapping):
            raise _wrong_type(label, kind, value)
        return MappingProxyType(dict(value))
    if kind is _Kind.KINDS:
        return _validate_kinds(label, value)
    if kind is _Kind.TESTING:
        return _validate_testing(label, value)
    return _validate_queues(label, value)


def _validate_testing(label: str, value: object) -> Mapping[str, object]:
    if not isinstance(value, Mapping):
        raise _wrong_type(label, _Kind.TESTING, value)
    known = {"MODE", "RAISE_FAILURES"}
    unknown = [key for key in value if key not in known]
    if unknown:
        raise ImproperlyConfigured(
            f"{label} has no setting {unknown[0]!r}; known: MODE, RAISE_FAILURES."
        )
    mode = value.get("MODE", "off")
    if mode not in ("off", "immediate"):
        raise ImproperlyConfigured(f"{label}['MODE'] must be 'off' or 'immediate', got {mode!r}.")
    raise_failures = value.get("RAISE_FAILURES", True)
    if not isinstance(raise_failures, bool):
        raise _wrong_type(f"{label}['RAISE_FAILURES']", _Kind.BOOL, raise_failures)
    return MappingProxyType({"MODE": mode, "RAISE_FAILURES": raise_failures})


def _validate_keys(label: str, value: object) -> tuple[str, ...]:
    """Callback keys: the messages name the position of a bad key, never the key itself."""
    if isinstance(value, str | bytes) or not isinstance(value, list | tuple):
        raise ImproperlyConfigured(
            f"{label} must be {_Kind.KEYS.value}, got {type(value).__name__}."
        )
    for index, key in enumerate(value):
        if not isinstance(key, str):
            raise ImproperlyConfigured(f"{label}[{index}] must be a str, got {type(key).__name__}.")
        if len(key) < CALLBACK_KEY_MIN_LENGTH:
            raise ImproperlyConfigured(
                f"{label}[{index}] is {len(key)} characters long; a key needs at least "
                f"{CALLBACK_KEY_MIN_LENGTH} (e.g. secrets.token_urlsafe(32))."
            )
        if "\x00" in key or not key.isprintable():
            raise ImproperlyConfigured(f"{label}[{index}] must be printable text.")
    if len(set(value)) != len(value):
        raise ImproperlyConfigured(f"{label} lists the same key twice.")
    return tuple(value)


def _validate_queues(label: str, value: object) -> Mapping[str, QueueSettings]:
    if not isinstance(value, Mapping):
        raise _wrong_type(label, _Kind.QUEUES, value)
    queues = {}
    for queue, options in value.items():
        if not isinstance(queue, str) or not queue:
            raise ImproperlyConfigured(
                f"{label} keys must be non-empty queue names, got {queue!r}."
            )
        where = f"{label}[{queue!r}]"
        if not isinstance(options, Mapping):
            raise ImproperlyConfigured(f"{where} must be a dict, got {_describe(options)}.")
        described = {key: options[key] for key in _DESCRIPTOR_KEYS if key in options}
        options = {key: value for key, value in options.items() if key not in _DESCRIPTOR_KEYS}
        _reject_unknown(where, options, {**_QUEUE_SPECS, **dict.fromkeys(_DESCRIPTOR_KEYS)})
        checked: dict[str, object] = {
            key: _validate(f"{where}[{key!r}]", options.get(key), spec)
            for key, spec in _QUEUE_SPECS.items()
        }
        try:
            shown = check_descriptor(**described)
            checked["descriptor"] = MappingProxyType(
                {key: value for key, value in shown.items() if value is not None}
            )
        except InvalidOptionError as exc:
            raise ImproperlyConfigured(f"{where}: {exc}") from None
        if checked["rate_burst"] is not None and checked["rate_limit"] is None:
            raise ImproperlyConfigured(f"{where}['rate_burst'] needs a 'rate_limit'.")
        if not QUEUE_NAME_RE.fullmatch(queue):
            # No job can be enqueued into it; its dlq or flow limits could not be written (and
            # one bad name would stop the start-up sync of every other queue's).
            raise ImproperlyConfigured(
                f"{label} key {queue[:80]!r} is not a valid queue name (docs/jobs.md, queue names)."
            )
        queues[queue] = QueueSettings(**checked)  # type: ignore[arg-type]
    return MappingProxyType(queues)


def _validate_kinds(label: str, value: object) -> Mapping[str, KindSettings]:
    if not isinstance(value, Mapping):
        raise _wrong_type(label, _Kind.KINDS, value)
    kinds = {}
    for kind, options in value.items():
        try:
            check_kind_name(kind)
        except InvalidOptionError as exc:
            raise ImproperlyConfigured(f"{label} key {reprlib.repr(kind)}: {exc}") from None
        where = f"{label}[{kind!r}]"
        if not isinstance(options, Mapping):
            raise ImproperlyConfigured(f"{where} must be a dict, got {_describe(options)}.")
        _reject_unknown(where, options, _KIND_SPECS)
        checked = {
            key: _validate(f"{where}[{key!r}]", options.get(key), spec)
            for key, spec in _KIND_SPECS.items()
        }
        if checked["rate_burst"] is not None and checked["rate_limit"] is None:
            raise ImproperlyConfigured(f"{where}['rate_burst'] needs a 'rate_limit'.")
        kinds[kind] = KindSettings(**checked)  # type: ignore[arg-type]
    return MappingProxyType(kinds)


def _check_range(label: str, value: int, spec: _Spec) -> None:
    low, high = spec.minimum, spec.maximum
    if (low is not None and value < low) or (high is not None and value > high):
        if high is None:
            bounds = f"at least {low}"
        elif low is None:
            bounds = f"at most {high}"
        else:
            bounds = f"between {low} and {high}"
        raise ImproperlyConfigured(f"{label} must be {bounds}, got {value}.")


def _wrong_type(label: str, kind: _Kind, value: object) -> ImproperlyConfigured:
    return ImproperlyConfigured(f"{label} must be {kind.value}, got {_describe(value)}.")


def _describe(value: object) -> str:
    return f"{type(value).__name__} ({reprlib.repr(value)})"


def import_job_middleware(path: str) -> Callable[..., Any]:
    """The job middleware factory at ``path`` (an ``AWA["JOB_MIDDLEWARE"]`` entry);
    ``ImportError`` or ``TypeError`` saying which entry is wrong."""
    try:
        factory = import_string(path)
    except Exception as exc:  # ImportError, or what the module raised while it was imported
        raise ImportError(
            f"AWA['JOB_MIDDLEWARE'] entry {path!r} cannot be imported: {type(exc).__name__}: {exc}"
        ) from exc
    if not callable(factory):
        raise TypeError(f"AWA['JOB_MIDDLEWARE'] entry {path!r} is not callable")
    return factory  # type: ignore[no-any-return]


@functools.cache
def get_awa_settings() -> AwaSettings:
    """The validated settings, cached until ``AWA`` changes."""
    return load_settings(getattr(settings, "AWA", {}))


@receiver(setting_changed)
def _drop_cached_settings(*, setting: str, **kwargs: object) -> None:
    if setting == "AWA":
        get_awa_settings.cache_clear()


class _LazyAwaSettings:
    """Reads through to :func:`get_awa_settings` on every attribute access."""

    def __getattr__(self, name: str) -> object:
        return getattr(get_awa_settings(), name)

    def __dir__(self) -> list[str]:
        return list(_SPECS)


# Typed as AwaSettings so that ``awa_settings.POLL_INTERVAL`` is a float to mypy; at run time
# every attribute read goes through the cache, so overrides are seen without re-importing.
awa_settings: Final[AwaSettings] = cast(AwaSettings, _LazyAwaSettings())
