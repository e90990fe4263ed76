"""Per-job retry policies: how long a job waits before each retry, which exceptions retry at
all, and how old a job may grow before its retries stop.

A :class:`RetryPolicy` is given to ``@job(retry=...)``, ``Job.using(retry=...)``,
``awa_django.enqueue(..., retry=...)`` or a django.tasks ``@task(retry=...)`` (docs/jobs.md,
"Retry policies"). It is stored **with the job**, in its metadata under the reserved key
``"awa:retry"`` (:data:`RETRY_KEY`), so every retry path follows it wherever the retry is
decided: the worker (a handler raised), a callback resolved with an error, or the maintenance
leader's rescue (a dead worker, a passed deadline, a callback timeout). The wait itself is
always computed by the database (``awa._backoff_v2``), on its clock.

Guarantees:

* A policy is checked when it is built: anything PostgreSQL could not store or that makes no
  sense (NaN, infinity, ``1e300``, negative numbers, ``timedelta.max``, ``bool``, a string
  where a class goes) raises ``InvalidOptionError`` and nothing is written. The SQL functions
  check the stored form again (SQLSTATE 22023) for producers that write it by hand.
* ``retry_on`` and ``fail_on`` are stored as class names (``module.qualname``) and matched
  against the names of the raised exception's classes (its whole MRO). Nothing is ever
  imported from them.
* A job without a policy waits what it always waited: ``RETRY_BACKOFF_BASE * 2^attempt`` plus
  up to 25 % jitter, at most a day.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from datetime import timedelta
from typing import Any, Literal, TypeAlias

from awa_django.exceptions import InvalidOptionError, TerminalError
from awa_django.limits import MAX_SECONDS, check_seconds, check_text, show

__all__ = [
    "BACKOFFS",
    "MAX_BACKOFF_SECONDS",
    "MAX_EXCEPTION_NAMES",
    "RETRY_KEY",
    "Backoff",
    "RetryPolicy",
    "check_retry",
    "exception_names",
    "fails_at_once",
]

#: The metadata key a job's policy is stored under (``awa:`` keys are awa_django's own).
RETRY_KEY = "awa:retry"

#: The longest ``base`` and ``cap``: a day, in seconds (the cap every backoff always had).
MAX_BACKOFF_SECONDS = 86_400.0

#: The most exception classes in one of ``retry_on`` / ``fail_on``.
MAX_EXCEPTION_NAMES = 32

_NAME_MAX = 255

#: How the wait grows with the attempt number ``n`` (1 for the first failed attempt).
Backoff: TypeAlias = Literal["exponential", "linear", "constant"]

#: The shapes: ``base * 2^n``, ``base * n``, ``base``.
BACKOFFS: tuple[Backoff, ...] = ("exponential", "linear", "constant")

_Classes: TypeAlias = type[BaseException] | Iterable[type[BaseException]]


@dataclasses.dataclass(frozen=True, slots=True, init=False)
class RetryPolicy:
    """How a job is retried. Every field is optional.

    * ``backoff``: ``"exponential"`` (``base * 2^n`` seconds before the retry after attempt
      ``n``; the default), ``"linear"`` (``base * n``) or ``"constant"`` (``base``);
    * ``base``: seconds (a number or ``timedelta``, 0 to 86,400); ``None`` (the default) means
      ``AWA["RETRY_BACKOFF_BASE"]`` of the process that decides the retry;
    * ``jitter``: up to this fraction of the wait is added at random (0 to 1; default 0.25);
    * ``cap``: the longest wait, jitter included (0 to 86,400 seconds; default a day);
    * ``max_age``: no retry runs later than ``max_age`` after the job was created (above 0, at
      most 100 years): a retry that would is given up like exhausted attempts (the job fails,
      or goes to the DLQ). ``None`` (the default): no limit;
    * ``retry_on``: exception classes that retry; any other exception fails the job at once
      (one attempt, like ``TerminalError``). Empty (the default): every exception retries;
    * ``fail_on``: exception classes that fail the job at once, even when ``retry_on`` also
      matches.

    ``retry_on`` and ``fail_on`` take one class or an iterable of them, and apply to
    exceptions a handler raises; rescue and callback errors always retry (with the policy's
    backoff and ``max_age``). ``TerminalError`` always fails at once. Immutable and hashable;
    built values are normalised (seconds as ``float``, classes as tuples).
    """

    backoff: Backoff
    base: float | None
    cap: float
    jitter: float
    max_age: float | None
    retry_on: tuple[type[BaseException], ...]
    fail_on: tuple[type[BaseException], ...]

    def __init__(
        self,
        backoff: Backoff = "exponential",
        *,
        base: float | timedelta | None = None,
        cap: float | timedelta = MAX_BACKOFF_SECONDS,
        jitter: float = 0.25,
        max_age: float | timedelta | None = None,
        retry_on: _Classes = (),
        fail_on: _Classes = (),
    ) -> None:
        shape: object = backoff  # checked: callers need not be type-checked
        if type(shape) is not str or shape not in BACKOFFS:
            raise InvalidOptionError(
                "retry", f"backoff: {show(backoff)} is not one of {', '.join(BACKOFFS)}"
            )
        values = {
            "backoff": backoff,
            "base": None if base is None else _bounded("base", base, MAX_BACKOFF_SECONDS),
            "cap": _bounded("cap", cap, MAX_BACKOFF_SECONDS),
            "jitter": _fraction(jitter),
            "max_age": None if max_age is None else _max_age(max_age),
            "retry_on": _classes("retry_on", retry_on),
            "fail_on": _classes("fail_on", fail_on),
        }
        for name, value in values.items():
            object.__setattr__(self, name, value)

    def to_value(self) -> dict[str, Any]:
        """The JSON object stored under ``metadata["awa:retry"]`` (awa_django/sql/functions/
        retry.sql reads it)."""
        value: dict[str, Any] = {"backoff": self.backoff, "cap": self.cap, "jitter": self.jitter}
        if self.base is not None:
            value["base"] = self.base
        if self.max_age is not None:
            value["max_age"] = self.max_age
        if self.retry_on:
            value["retry_on"] = [_name(c) for c in self.retry_on]
        if self.fail_on:
            value["fail_on"] = [_name(c) for c in self.fail_on]
        return value

    @classmethod
    def from_option(cls, value: object, field: str = "retry") -> RetryPolicy | None:
        """A policy from an option: a ``RetryPolicy``, a mapping of its fields (as settings
        write it: ``{"backoff": "linear", "base": 5}``) or ``None``; ``InvalidOptionError``
        for anything else."""
        if value is None or isinstance(value, RetryPolicy):
            return value
        if isinstance(value, Mapping):
            unknown = sorted(set(value) - {f.name for f in dataclasses.fields(cls)}, key=str)
            if unknown:
                raise InvalidOptionError(field, f"unknown RetryPolicy field(s) {unknown}")
            return cls(**value)
        raise InvalidOptionError(
            field, f"{show(value)} is not a RetryPolicy (or a mapping of its fields)"
        )


def check_retry(value: object) -> RetryPolicy | None:
    """``value`` if it is a ``RetryPolicy`` or ``None``; ``InvalidOptionError`` otherwise."""
    if value is None or isinstance(value, RetryPolicy):
        return value
    raise InvalidOptionError("retry", f"{show(value)} is not a RetryPolicy")


def exception_names(exc: BaseException) -> frozenset[str]:
    """The names (``module.qualname``) of every class of ``exc``'s type, its MRO."""
    names = set()
    # Read through type's own descriptors: a metaclass whose __getattribute__ refuses to answer
    # (or lies) cannot hide the hierarchy.
    try:
        mro = _TYPE_MRO.__get__(type(exc))
    except Exception:  # pragma: no cover - every class has an MRO
        mro = (type(exc),)
    for cls in mro:
        try:
            names.add(f"{_TYPE_MODULE.__get__(cls)}.{_TYPE_QUALNAME.__get__(cls)}")
        except Exception:  # pragma: no cover - defensive
            continue
    return frozenset(names)


_TYPE_MRO: Any = type.__dict__["__mro__"]
_TYPE_MODULE: Any = type.__dict__["__module__"]
_TYPE_QUALNAME: Any = type.__dict__["__qualname__"]


def fails_at_once(metadata: object, exc: BaseException) -> bool:
    """Whether ``exc``, raised by the handler of a job with ``metadata``, fails it at once
    under the job's stored policy: a ``TerminalError``, an exception none of whose classes is
    in ``retry_on`` (when given), or one in ``fail_on``. Never raises; a job without a policy
    (or with one that is not a JSON object) retries every other exception."""
    if isinstance(exc, TerminalError):
        return True
    policy = metadata.get(RETRY_KEY) if isinstance(metadata, dict) else None
    if not isinstance(policy, dict):
        return False
    retry_on, fail_on = policy.get("retry_on"), policy.get("fail_on")
    if not retry_on and not fail_on:
        return False
    names = exception_names(exc)
    if isinstance(fail_on, list) and names.intersection(n for n in fail_on if type(n) is str):
        return True
    if isinstance(retry_on, list) and retry_on:
        return not names.intersection(n for n in retry_on if type(n) is str)
    return False


def _name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _bounded(field: str, value: object, high: float) -> float:
    """Seconds (a number or ``timedelta``) from 0 to ``high``."""
    try:
        seconds = check_seconds(field, value, allow_zero=True) if _is_seconds(value) else None
    except InvalidOptionError:
        seconds = None
    if seconds is None or seconds > high:
        raise InvalidOptionError(
            "retry", f"{field}: {show(value)} is not a number of seconds from 0 to {high:.0f}"
        )
    return seconds


def _max_age(value: object) -> float:
    if not _is_seconds(value):
        raise InvalidOptionError("retry", f"max_age: {show(value)} is not a number of seconds")
    try:
        return check_seconds("max_age", value)
    except InvalidOptionError:
        raise InvalidOptionError(
            "retry",
            f"max_age: {show(value)} is not a number of seconds above 0 and at most "
            f"{MAX_SECONDS:.0f} (100 years)",
        ) from None


def _is_seconds(value: object) -> bool:
    return type(value) in (int, float) or isinstance(value, timedelta)


def _fraction(value: object) -> float:
    if type(value) not in (int, float) or not (
        math.isfinite(value) and 0 <= value <= 1  # type: ignore[arg-type, operator]
    ):
        raise InvalidOptionError("retry", f"jitter: {show(value)} is not a number from 0 to 1")
    return float(value)  # type: ignore[arg-type]


def _classes(field: str, value: object) -> tuple[type[BaseException], ...]:
    items = (value,) if isinstance(value, type) else value
    if isinstance(items, str | bytes | Mapping) or not isinstance(items, Iterable):
        raise InvalidOptionError(
            "retry", f"{field}: {show(value)} is not an exception class or a list of them"
        )
    classes = tuple(items)
    for cls in classes:
        if not (isinstance(cls, type) and issubclass(cls, BaseException)):
            raise InvalidOptionError(
                "retry", f"{field}: {show(cls)} is not an exception class (a class, not a name)"
            )
        if len(_name(cls)) > _NAME_MAX:
            raise InvalidOptionError(
                "retry", f"{field}: the name of {show(cls)} is longer than {_NAME_MAX} characters"
            )
        try:  # stored as text: no NUL, no lone surrogate (refused now, not at every enqueue)
            check_text("retry", _name(cls))
        except InvalidOptionError as exc:
            raise InvalidOptionError(
                "retry", f"{field}: the name of {show(cls)} cannot be stored ({exc})"
            ) from None
    if len(classes) > MAX_EXCEPTION_NAMES:
        raise InvalidOptionError(
            "retry", f"{field}: {len(classes)} classes exceeds the limit of {MAX_EXCEPTION_NAMES}"
        )
    return classes
