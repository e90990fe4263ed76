"""Bounds on the values awa_django stores, checked where they enter (and again in SQL).

Every duration (``run_after`` delays, deadlines, ``RetryAfter``, ``Snooze``, callback timeouts)
must be a finite number of seconds of at most :data:`MAX_SECONDS`, so that the database can
always add it to ``now()``; every text awa_django stores must be valid UTF-8 without NUL, which
PostgreSQL cannot store. Queue names, priorities and attempt counts have one definition each
here; the SQL functions apply the same bounds, defined once in SQL too (``awa.valid_queue_name``,
``awa.valid_priority``, ``awa.valid_max_attempts`` in awa_django/sql/tables.sql).
"""

from __future__ import annotations

import math
import re
import uuid
from collections.abc import Iterable, Mapping
from datetime import timedelta
from typing import Any

from awa_django.exceptions import InvalidOptionError

__all__ = [
    "ATTEMPTS_RANGE",
    "CONTROL_CHARACTERS",
    "FLOW_BURST_RANGE",
    "FLOW_CONCURRENCY_RANGE",
    "FLOW_RATE_MAX",
    "FLOW_RATE_MIN",
    "KIND_NAME_MAX_LENGTH",
    "MAX_BIGINT",
    "MAX_SECONDS",
    "MAX_TEXT",
    "PRIORITY_RANGE",
    "QUEUE_NAME_RE",
    "RESERVED_METADATA_PREFIX",
    "SCHEMA_NAME_MAX_LENGTH",
    "SERIAL_KEY",
    "SERIAL_KEY_MAX_LENGTH",
    "WEIGHT_KEY",
    "WEIGHT_RANGE",
    "check_flow_limits",
    "check_id",
    "check_ids",
    "check_kind_name",
    "check_max_attempts",
    "check_metadata_keys",
    "check_no_control",
    "check_priority",
    "check_queue_name",
    "check_schema_name",
    "check_seconds",
    "check_serial_key",
    "check_text",
    "check_uuid",
    "check_weight",
    "clean_text",
    "rate_text",
    "show",
    "tag_tuple",
]

#: The longest delay, deadline or timeout: 100 years (36,525 days), in seconds.
MAX_SECONDS = 3_155_760_000.0

#: The longest reason or error text an operator or handler may pass (characters).
MAX_TEXT = 10_000

#: Job ids are PostgreSQL ``bigint``.
MAX_BIGINT = 2**63 - 1

#: The lowest and highest job priority (higher runs first, as in django.tasks).
PRIORITY_RANGE = (-100, 100)

#: The fewest and most attempts a job may be given (``max_attempts``).
ATTEMPTS_RANGE = (1, 1000)

#: A queue name: 1-63 characters of ``a-z 0-9 _ . -``. Queues are values, never identifiers,
#: everywhere in the schema; the rule keeps them short, printable and safe in JSON and URLs.
QUEUE_NAME_RE = re.compile(r"[a-z0-9_.-]{1,63}")


#: Metadata keys starting with this are awa_django's own (``awa:retry``, the job's retry
#: policy); a producer's metadata may not use them.
RESERVED_METADATA_PREFIX = "awa:"


#: The metadata key holding a job's weight (``weight=``), and the weights a job may have: the
#: execution slots and global-concurrency permits one attempt takes (docs/flow.md).
WEIGHT_KEY = "awa:weight"
WEIGHT_RANGE = (1, 10_000)


def check_weight(value: object, field: str = "weight") -> int:
    """``value`` if it is an ``int`` (not ``bool``) in :data:`WEIGHT_RANGE`."""
    low, high = WEIGHT_RANGE
    if type(value) is not int or not low <= value <= high:
        raise InvalidOptionError(field, f"{show(value)} is not an integer in {low}..{high}")
    return value


#: The metadata key holding a job's serial key (``serial_key=``): jobs of one queue with the
#: same key run one at a time, oldest first (docs/flow.md, "Per-key serialisation").
SERIAL_KEY = "awa:serial"
SERIAL_KEY_MAX_LENGTH = 255


def check_serial_key(value: object, field: str = "serial_key") -> str:
    """``value`` if it is a ``str`` of 1 to :data:`SERIAL_KEY_MAX_LENGTH` characters that
    PostgreSQL can store (no NUL, no lone surrogate)."""
    key = check_text(field, value, max_length=SERIAL_KEY_MAX_LENGTH)
    if not key:
        raise InvalidOptionError(field, "must not be empty")
    return key


#: The bounds of a queue's flow limits (docs/flow.md), as ``AWA["QUEUES"]`` and the
#: ``awa.flow_limits`` table's checks have them: global concurrency, jobs per second (one per
#: 1,000 s at least, a million at most), burst.
FLOW_CONCURRENCY_RANGE = (1, 10_000)
FLOW_RATE_MIN = 0.001
FLOW_RATE_MAX = 1_000_000
FLOW_BURST_RANGE = (1, 1_000_000)


def check_flow_limits(
    global_concurrency: object, rate_limit: object, rate_burst: object
) -> tuple[int | None, float | None, int | None]:
    """One queue's flow limits, checked: ``global_concurrency`` an ``int`` (not ``bool``) in
    :data:`FLOW_CONCURRENCY_RANGE`, ``rate_limit`` a finite ``int`` or ``float`` (not
    ``bool``) in :data:`FLOW_RATE_MIN` .. :data:`FLOW_RATE_MAX`, ``rate_burst`` an ``int`` in
    :data:`FLOW_BURST_RANGE` and only with a rate; ``None`` is "not limited", and at least one
    of the two limits must be given. Returns them with the rate as a float;
    ``InvalidOptionError`` names the first bad one."""
    concurrency: int | None = None
    if global_concurrency is not None:
        low, high = FLOW_CONCURRENCY_RANGE
        if type(global_concurrency) is not int or not low <= global_concurrency <= high:
            raise InvalidOptionError(
                "global_concurrency",
                f"{show(global_concurrency)} is not an integer in {low}..{high}",
            )
        concurrency = global_concurrency
    rate: float | None = None
    if rate_limit is not None:
        # An int is compared as it is (float() of a huge int overflows); NaN fails every test.
        if type(rate_limit) not in (int, float) or not (
            FLOW_RATE_MIN <= rate_limit <= FLOW_RATE_MAX  # type: ignore[operator]
        ):
            raise InvalidOptionError(
                "rate_limit",
                f"{show(rate_limit)} is not a number of jobs per second from {FLOW_RATE_MIN} "
                f"to {FLOW_RATE_MAX:,}",
            )
        rate = float(rate_limit)  # type: ignore[arg-type]
    burst: int | None = None
    if rate_burst is not None:
        low, high = FLOW_BURST_RANGE
        if type(rate_burst) is not int or not low <= rate_burst <= high:
            raise InvalidOptionError(
                "rate_burst", f"{show(rate_burst)} is not an integer in {low}..{high}"
            )
        if rate is None:
            raise InvalidOptionError("rate_burst", "a burst needs a rate_limit")
        burst = rate_burst
    if concurrency is None and rate is None:
        raise InvalidOptionError(
            "limits", "give a global_concurrency, a rate_limit, or both (or clear them)"
        )
    return concurrency, rate, burst


#: The longest job kind name (characters), as ``awa.enqueue_v1`` and ``awa.flow_kind_limits``
#: have it.
KIND_NAME_MAX_LENGTH = 255


def check_kind_name(value: object, field: str = "kind") -> str:
    """``value`` if it can name a job kind that flow limits are set on: a ``str`` of 1 to
    :data:`KIND_NAME_MAX_LENGTH` characters that PostgreSQL can store (no NUL, no lone
    surrogate), not blank and without control characters (a name is printed on one line by
    ``awa_queue limits`` and ``awa_status``)."""
    kind = check_text(field, value, max_length=KIND_NAME_MAX_LENGTH)
    if not kind.strip():
        raise InvalidOptionError(field, "must name a job kind (not empty or blank)")
    check_no_control(field, kind)
    return kind


#: The longest ``AWA["SCHEMA"]`` (characters): PostgreSQL's 63-byte names less the longest
#: suffix awa_django adds to it (``_cancel``, the name of its cancel channel).
SCHEMA_NAME_MAX_LENGTH = 56

_SCHEMA_NAME_RE = re.compile(r"[a-z_][a-z0-9_]*")

# PostgreSQL's keywords that are not "unreserved" (``pg_get_keywords()``, categories R, T and C,
# PostgreSQL 18): a schema named so could not qualify a type or function name without quoting.
# ``migrate`` checks the server's own list again before it creates the schema.
_SQL_RESERVED = frozenset(
    """all analyse analyze and any array as asc asymmetric authorization binary both case cast
    check collate collation column concurrently constraint create cross current_catalog
    current_date current_role current_schema current_time current_timestamp current_user default
    deferrable desc distinct do else end except false fetch for foreign freeze from full grant
    group having ilike in initially inner intersect into is isnull join lateral leading left like
    limit localtime localtimestamp natural not notnull null offset on only or order outer
    overlaps placing primary references returning right select session_user similar some
    symmetric system_user table tablesample then to trailing true union unique user using
    variadic verbose when where window with
    between bigint bit boolean char character coalesce dec decimal exists extract float
    greatest grouping inout int integer interval json json_array json_arrayagg json_exists
    json_object json_objectagg json_query json_scalar json_serialize json_table json_value least
    merge_action national nchar none normalize nullif numeric out overlay position precision
    real row setof smallint substring time timestamp treat trim values varchar xmlattributes
    xmlconcat xmlelement xmlexists xmlforest xmlnamespaces xmlparse xmlpi xmlroot xmlserialize
    xmltable""".split()  # noqa: SIM905
)


def check_schema_name(value: object, field: str = "AWA['SCHEMA']") -> str:
    """``value`` if it can be the schema awa_django installs into and reads from: a plain
    lower-case SQL identifier (``[a-z_][a-z0-9_]*``, at most :data:`SCHEMA_NAME_MAX_LENGTH`
    characters) that needs no quoting, is no SQL keyword but an unreserved one, and is none of
    PostgreSQL's own schemas (``public``, ``information_schema``, ``pg_*``), which a reversed
    migration would drop. Raises ``ValueError`` with a message that says what is wrong."""
    if not isinstance(value, str):
        raise ValueError(f"{field} must be a str naming a schema, got {show(value)}")
    if len(value) > SCHEMA_NAME_MAX_LENGTH or _SCHEMA_NAME_RE.fullmatch(value) is None:
        raise ValueError(
            f"{field} must be a plain lower-case identifier of 1 to {SCHEMA_NAME_MAX_LENGTH} "
            f"characters (letters a-z, digits and _, not starting with a digit), "
            f"got {show(value)}",
        )
    if value in _SQL_RESERVED:
        raise ValueError(f"{field} is {value!r}, a keyword of SQL; choose another name")
    if value in ("public", "information_schema") or value.startswith("pg_"):
        raise ValueError(
            f"{field} is {value!r}, PostgreSQL's own schema; awa_django needs one of its own"
        )
    return value


#: Control characters (code points): C0, DEL, C1 and the Unicode line and paragraph
#: separators. Names shown one per line refuse them (:func:`check_no_control`); log lines and
#: listings escape them (``awa_django.telemetry.logs.one_line``).
CONTROL_CHARACTERS: frozenset[int] = frozenset((*range(0x20), *range(0x7F, 0xA0), 0x2028, 0x2029))
_CONTROL = re.compile("[" + "".join(re.escape(chr(c)) for c in sorted(CONTROL_CHARACTERS)) + "]")


def check_no_control(field: str, value: str) -> str:
    """``value`` if it holds no control character (newline, carriage return, escape, ...):
    ``InvalidOptionError`` otherwise. For names shown one per line (kinds, actors)."""
    found = _CONTROL.search(value)
    if found is not None:
        raise InvalidOptionError(
            field, f"contains the control character {found.group()!r} at {found.start()}"
        )
    return value


def check_metadata_keys(metadata: Mapping[str, object]) -> None:
    """``InvalidOptionError`` when a key of ``metadata`` starts with
    :data:`RESERVED_METADATA_PREFIX` (keys that are not ``str`` are refused by the encoder)."""
    for key in metadata:
        if type(key) is str and key.startswith(RESERVED_METADATA_PREFIX):
            raise InvalidOptionError(
                "metadata",
                f"key {show(key)} is reserved: keys starting with {RESERVED_METADATA_PREFIX!r} "
                "are awa_django's own (a retry policy is given with retry=RetryPolicy(...))",
            )


def check_queue_name(queue: object, field: str = "queue") -> str:
    """``queue`` if it matches :data:`QUEUE_NAME_RE`, else ``InvalidOptionError``."""
    if type(queue) is not str or QUEUE_NAME_RE.fullmatch(queue) is None:
        raise InvalidOptionError(
            field, f"{show(queue)} is not a valid queue name (1-63 characters of a-z 0-9 _ . -)"
        )
    return queue


def check_priority(value: object, field: str = "priority") -> int:
    """``value`` if it is an ``int`` (not ``bool``) in :data:`PRIORITY_RANGE`."""
    low, high = PRIORITY_RANGE
    if type(value) is not int or not low <= value <= high:
        raise InvalidOptionError(field, f"{show(value)} is not an integer in {low}..{high}")
    return value


def check_max_attempts(value: object, field: str = "max_attempts") -> int:
    """``value`` if it is an ``int`` (not ``bool``) in :data:`ATTEMPTS_RANGE`."""
    low, high = ATTEMPTS_RANGE
    if type(value) is not int or not low <= value <= high:
        raise InvalidOptionError(field, f"{show(value)} is not an integer in {low}..{high}")
    return value


def check_seconds(field: str, value: Any, *, allow_zero: bool = False) -> float:
    """``value`` (a number or a ``timedelta``) as float seconds, or ``InvalidOptionError``.

    Accepted: finite, positive (or zero with ``allow_zero``), at most :data:`MAX_SECONDS`.
    ``bool`` is not a number here.
    """
    seconds = value.total_seconds() if isinstance(value, timedelta) else value
    if type(seconds) not in (int, float):
        raise InvalidOptionError(
            field, f"{show(value)} is not a number of seconds (int, float or timedelta)"
        )
    try:
        seconds = float(seconds)
    except OverflowError:
        seconds = math.inf
    low_ok = seconds >= 0 if allow_zero else seconds > 0
    if not (math.isfinite(seconds) and low_ok and seconds <= MAX_SECONDS):
        bound = "0" if allow_zero else "more than 0"
        raise InvalidOptionError(
            field,
            f"{show(value)} is not a number of seconds between {bound} and {MAX_SECONDS:.0f} "
            "(100 years)",
        )
    return seconds


def rate_text(per_second: float) -> str:
    """A flow rate as people read it: ``2``, ``0.5``, ``1,000,000`` (never ``1e+06``)."""
    if not math.isfinite(per_second):
        return str(per_second)  # never stored (the limits refuse it); never a 500 either
    if per_second == int(per_second):
        return f"{int(per_second):,}"
    return f"{per_second:,.6f}".rstrip("0")


def show(value: Any) -> str:
    """A short ``repr`` of a value for an error message (never raises, never huge)."""
    if type(value) is int and not -(10**30) < value < 10**30:
        return f"an integer of {value.bit_length()} bits"
    try:
        text = repr(value)
    except Exception:
        return f"a {type(value).__name__}"
    return text if len(text) <= 80 else text[:77] + "..."


def check_text(field: str, value: Any, *, max_length: int = MAX_TEXT) -> str:
    """``value`` if it is a ``str`` PostgreSQL can store (no NUL, no lone surrogate) of at most
    ``max_length`` characters; ``InvalidOptionError`` otherwise."""
    if type(value) is not str:
        raise InvalidOptionError(field, f"must be a str, got {type(value).__name__}")
    if "\x00" in value:
        raise InvalidOptionError(field, "contains a NUL character, which PostgreSQL cannot store")
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidOptionError(
                field, "contains a lone surrogate, which is not valid UTF-8"
            ) from None
    if len(value) > max_length:
        raise InvalidOptionError(
            field, f"{len(value)} characters exceeds the limit of {max_length}"
        )
    return value


def clean_text(value: str, max_length: int | None = None) -> str:
    """``value`` made storable without refusing it: NUL and lone surrogates become visible
    escapes (``\\x00``, ``\\ud800``), and it is cut to its last ``max_length`` characters
    when given. For texts awa_django must record whatever they hold (exception messages and
    tracebacks)."""
    if "\x00" in value:
        value = value.replace("\x00", "\\x00")
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            value = value.encode("utf-8", "backslashreplace").decode("utf-8")
    if max_length is not None and len(value) > max_length:
        value = value[-max_length:]
    return value


def check_uuid(field: str, value: Any) -> uuid.UUID:
    """``value`` as a ``uuid.UUID`` (a UUID or its text), or ``InvalidOptionError``."""
    if isinstance(value, uuid.UUID):
        return value
    if type(value) is str:
        try:
            return uuid.UUID(value)
        except ValueError:
            pass
    raise InvalidOptionError(field, f"{show(value)} is not a UUID")


def check_id(field: str, value: object) -> int:
    """A job id (``int``, not ``bool``, within ``bigint``), or ``InvalidOptionError``."""
    if type(value) is not int or not -MAX_BIGINT <= value <= MAX_BIGINT:
        raise InvalidOptionError(field, f"{show(value)} is not a job id (an int)")
    return value


def check_ids(field: str, values: Any) -> list[int]:
    """Job ids (see :func:`check_id`) from a list or another iterable, or
    ``InvalidOptionError``; a str, bytes or a mapping is not a list of ids."""
    if isinstance(values, str | bytes | Mapping) or not hasattr(values, "__iter__"):
        raise InvalidOptionError(field, "must be a list of job ids")
    return [check_id(field, value) for value in values]


def tag_tuple(tags: Iterable[str]) -> tuple[str, ...]:
    """``tags`` as a tuple, or ``InvalidOptionError`` for a single string (which is not a list
    of tags), a mapping or a non-iterable. The tags themselves are checked at enqueue."""
    if isinstance(tags, str | bytes | Mapping) or not isinstance(tags, Iterable):
        raise InvalidOptionError("tags", f"must be a list of strings, got {type(tags).__name__}")
    return tuple(tags)


# Descriptors (docs/descriptors.md): what a queue or job kind is for. The same bounds hold in
# SQL (awa._descriptor_problem_v1).
LABEL_MAX_LENGTH = 200
DESCRIPTION_MAX_LENGTH = 4000
OWNER_MAX_LENGTH = 200
LINKS_MAX = 20
LINK_NAME_MAX_LENGTH = 100
LINK_URL_MAX_LENGTH = 2000
_URL = re.compile(r"https?://[!-~]+", re.IGNORECASE)  # printable ASCII, as in SQL


def check_descriptor(
    *, label: object = None, description: object = None, owner: object = None, links: object = None
) -> dict[str, Any]:
    """The checked descriptor fields, as the worker reports them: ``label`` (up to 200
    characters), ``description`` (4,000), ``owner`` (200), each text PostgreSQL can store or
    None, and ``links``: up to 20 names (1-100 characters) of http(s) URLs (up to 2,000).
    ``InvalidOptionError`` names the field otherwise."""
    checked: dict[str, Any] = {}
    for field, value, limit in (
        ("label", label, LABEL_MAX_LENGTH),
        ("description", description, DESCRIPTION_MAX_LENGTH),
        ("owner", owner, OWNER_MAX_LENGTH),
    ):
        checked[field] = None if value is None else check_text(field, value, max_length=limit)
    if links is None:
        checked["links"] = None
        return checked
    if not isinstance(links, Mapping):
        raise InvalidOptionError("links", f"must be a dict of names to URLs, got {links!r}")
    if len(links) > LINKS_MAX:
        raise InvalidOptionError("links", f"{len(links)} links exceeds the limit of {LINKS_MAX}")
    shown: dict[str, str] = {}
    for name, url in links.items():
        check_text("links", name, max_length=LINK_NAME_MAX_LENGTH)
        if not name:
            raise InvalidOptionError("links", "a link's name must not be empty")
        check_text(f"links[{name!r}]", url, max_length=LINK_URL_MAX_LENGTH)
        if _URL.fullmatch(url) is None:
            raise InvalidOptionError(f"links[{name!r}]", f"{url!r} is not an http(s) URL")
        shown[name] = url
    checked["links"] = shown
    return checked
