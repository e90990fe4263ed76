"""Structured logs: the job fields every log record about a job carries, a filter that adds them
to the records a handler logs, and a JSON formatter.

Guarantees:

* Every record awa_django logs about one job (its start and end at DEBUG, a retry, a failure,
  an abandoned handler, a stale or refused finalization, a rescue, a periodic fire) carries the
  :data:`JOB_FIELDS` as attributes (logging's ``extra``): ``job_id``, ``kind``, ``queue``,
  ``attempt`` and ``run_lease``. A field that is not known where the line is logged is ``None``
  (a periodic fire has no attempt yet), never missing.
* :class:`JobFieldsFilter`, added to a handler (or a logger), gives the same fields to the
  records a job's own handler code logs while it runs, sync or async; records logged outside
  any job are left as they are.
* :class:`JsonFormatter` writes one valid JSON object per record on one line, whatever the
  record holds: a value JSON cannot encode (an object, NaN or infinity) is written as its
  ``repr``, a lone surrogate as a ``\\udcXX`` escape, a cycle or nesting deeper than 32 as a
  short stand-in; a message whose arguments do not fit its format string is written as both.
* awa_django's own one-line records about a job write the job's kind and error message with
  control characters escaped (:func:`one_line`): a kind or message with a newline cannot
  forge a log line.

docs/observability.md, "Structured logs", shows a ``LOGGING`` setting that uses both.
"""

from __future__ import annotations

import contextvars
import datetime
import json
import logging
import math
from typing import Any, Final, Protocol

from awa_django.limits import CONTROL_CHARACTERS

__all__ = [
    "JOB_FIELDS",
    "JobFieldsFilter",
    "JsonFormatter",
    "current_job_fields",
    "in_job",
    "job_fields",
    "job_log_fields",
    "one_line",
    "set_current_job",
]

#: The attributes a record about a job carries (the ``extra`` keys).
JOB_FIELDS: Final = ("job_id", "kind", "queue", "attempt", "run_lease")


class _Job(Protocol):
    """What :func:`job_log_fields` reads: a claimed attempt (``ClaimedJob``)."""

    @property
    def job_id(self) -> int: ...
    @property
    def kind(self) -> str: ...
    @property
    def queue(self) -> str: ...
    @property
    def attempt(self) -> int: ...
    @property
    def run_lease(self) -> int: ...


def job_fields(
    job_id: int | None,
    *,
    kind: str | None = None,
    queue: str | None = None,
    attempt: int | None = None,
    run_lease: int | None = None,
) -> dict[str, Any]:
    """The ``extra`` dict of a record about one job; every one of :data:`JOB_FIELDS` is set."""
    return {
        "job_id": job_id,
        "kind": kind,
        "queue": queue,
        "attempt": attempt,
        "run_lease": run_lease,
    }


def job_log_fields(job: _Job) -> dict[str, Any]:
    """The ``extra`` dict of a record about one claimed attempt."""
    return {
        "job_id": job.job_id,
        "kind": job.kind,
        "queue": job.queue,
        "attempt": job.attempt,
        "run_lease": job.run_lease,
    }


#: The attempt whose handler runs in this context (set by the worker for each attempt: in the
#: handler's own context when async, on its pool thread when sync). The attempt itself, not
#: its fields: setting it costs one ``ContextVar.set`` per job, and only a record that passes
#: through :class:`JobFieldsFilter` pays for the fields.
_current: contextvars.ContextVar[_Job | None] = contextvars.ContextVar(
    "awa_current_job", default=None
)

#: Set the attempt whose handler runs in this context (None: no job). For the worker.
set_current_job = _current.set


def in_job() -> bool:
    """Whether a job's handler runs in this context."""
    return _current.get() is not None


def current_job_fields() -> dict[str, Any] | None:
    """The job fields of the handler running in this context, or None outside a job."""
    job = _current.get()
    return None if job is None else job_log_fields(job)


class JobFieldsFilter(logging.Filter):
    """Adds the :data:`JOB_FIELDS` of the running job to each record logged inside a handler
    (a field the record already has is kept). Never drops a record."""

    def filter(self, record: logging.LogRecord) -> bool:
        job = _current.get()
        if job is not None:
            values = record.__dict__
            for name, value in job_log_fields(job).items():
                values.setdefault(name, value)
        return True


# The attributes every LogRecord has: anything else on a record came from ``extra``.
_STANDARD: Final = frozenset(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {
    "message",
    "asctime",
    "taskName",
}


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line.

    Keys: ``time`` (ISO 8601, UTC, milliseconds), ``level``, ``logger``, ``message`` (the
    formatted message), then every field the record got through ``extra`` or
    :class:`JobFieldsFilter` (the :data:`JOB_FIELDS` first, when present), then ``exception``
    and ``stack`` (text) when the record has them. ``fields`` (a sequence of attribute names)
    adds standard record attributes too, e.g. ``("process", "threadName")``.
    """

    def __init__(self, *args: Any, fields: tuple[str, ...] | list[str] = (), **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.fields = tuple(fields)

    def format(self, record: logging.LogRecord) -> str:
        try:
            message = record.getMessage()
        except Exception:  # a format string and arguments that do not match
            message = f"{_repr(record.msg)} % {_repr(record.args)} (could not be formatted)"
        out: dict[str, Any] = {
            "time": datetime.datetime.fromtimestamp(record.created, datetime.UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname,
            "logger": record.name,
            "message": _text(message),
        }
        values = record.__dict__
        for name in JOB_FIELDS:
            if name in values:
                out[name] = _jsonable(values[name])
        for name, value in values.items():
            if name not in _STANDARD and name not in out:
                out[_text(str(name))] = _jsonable(value)
        for name in self.fields:
            out[name] = _jsonable(values.get(name))
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            out["exception"] = _text(record.exc_text)
        if record.stack_info:
            out["stack"] = _text(self.formatStack(record.stack_info))
        return json.dumps(out, ensure_ascii=False, allow_nan=False)


#: How deep :func:`_jsonable` follows nested containers before writing the rest as a repr.
_MAX_DEPTH: Final = 32


def _text(value: str) -> str:
    """``value`` if it encodes as UTF-8; else with each lone surrogate as a ``\\udcXX`` escape
    (a UTF-8 stream could not write it)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    return value


def _repr(value: object) -> str:
    try:
        return _text(repr(value))
    except Exception:
        return f"<{type(value).__name__} whose repr failed>"


def _jsonable(value: object, depth: int = 0, seen: frozenset[int] = frozenset()) -> Any:
    """``value`` as JSON can hold it: strings made writable, non-finite floats and anything
    else JSON has no form for as text (a ``repr``), cycles and nesting past
    :data:`_MAX_DEPTH` cut off as a ``repr``. Never raises."""
    if value is None or isinstance(value, bool | int):
        return value
    if isinstance(value, str):
        return _text(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, dict | list | tuple):
        if depth >= _MAX_DEPTH or id(value) in seen:
            return _repr_short(value)
        inner = seen | {id(value)}
        if isinstance(value, dict):
            return {
                _text(k) if isinstance(k, str) else _repr(k): _jsonable(v, depth + 1, inner)
                for k, v in value.items()
            }
        return [_jsonable(v, depth + 1, inner) for v in value]
    return _repr(value)


def _repr_short(value: dict[Any, Any] | list[Any] | tuple[Any, ...]) -> str:
    """A bounded stand-in for a container too deep (or cyclic) to write out."""
    return f"<{type(value).__name__} of {len(value)} item(s), nested too deep or cyclic>"


# Bidirectional controls too (U+202E reverses what follows it on a terminal): a line must read
# as it was written.
_BIDI: Final = frozenset((0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A)))
_CONTROL: Final = {
    c: f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}" for c in CONTROL_CHARACTERS | _BIDI
}


def one_line(value: object) -> str:
    """``str(value)`` on one line: control characters (newlines included) and bidirectional
    controls as ``\\xNN`` / ``\\uNNNN`` escapes, so that a value from a producer or a handler (a
    job kind, an error message) cannot start a log line of its own or reorder one."""
    return _text(str(value)).translate(_CONTROL)
