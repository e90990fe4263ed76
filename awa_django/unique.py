"""Unique jobs: the options that make a job hold a key, checked once for every producer path.

A unique job holds a key in ``awa.unique_keys`` from its enqueue until it stops blocking
duplicates: while it is in one of the key's ``states`` (default: scheduled, available,
running, waiting_external, retryable) and, with ``unique_for``, until that many seconds after
it took the key. Keys are per job kind; the default key is the canonical JSON of the job's
arguments. PostgreSQL enforces the key in the producer's transaction (docs/jobs.md, "Unique
jobs").
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta
from typing import Literal, NamedTuple

from awa_django.exceptions import InvalidOptionError
from awa_django.limits import check_seconds, check_text
from awa_django.states import JobState

__all__ = [
    "DEFAULT_UNIQUE_STATES",
    "UNIQUE_KEY_MAX_LENGTH",
    "UniqueSpec",
    "states_tuple",
    "unique_spec",
]

#: The states in which a holder blocks a duplicate unless ``unique_states`` says otherwise:
#: every state of a job not finished yet.
DEFAULT_UNIQUE_STATES: tuple[str, ...] = (
    JobState.SCHEDULED.value,
    JobState.AVAILABLE.value,
    JobState.RUNNING.value,
    JobState.WAITING_EXTERNAL.value,
    JobState.RETRYABLE.value,
)
_STATES = frozenset(state.value for state in JobState)

#: The longest explicit key (its SHA-256 digest is what PostgreSQL indexes).
UNIQUE_KEY_MAX_LENGTH = 10_000

OnConflict = Literal["return", "raise"]


class UniqueSpec(NamedTuple):
    """The checked unique options of one request. ``key`` None means the default key (the
    arguments' canonical JSON); ``states`` None means :data:`DEFAULT_UNIQUE_STATES`."""

    key: str | None
    for_seconds: float | None
    states: tuple[str, ...] | None
    on_conflict: OnConflict


def unique_spec(
    unique: bool,
    key: object,
    unique_for: float | timedelta | None,
    states: Iterable[str] | None,
    on_conflict: object,
) -> UniqueSpec | None:
    """The checked spec, or None for a job that is not unique. An explicit ``key``,
    ``unique_for`` or ``unique_states`` makes the job unique; bad values raise
    ``InvalidOptionError`` (nothing is written)."""
    if type(unique) is not bool:
        raise InvalidOptionError("unique", f"must be True or False, got {type(unique).__name__}")
    if on_conflict not in ("return", "raise"):
        raise InvalidOptionError("on_conflict", f"{on_conflict!r} is not 'return' or 'raise'")
    if not unique and key is None and unique_for is None and states is None:
        return None
    if key is not None:
        check_text("unique_key", key, max_length=UNIQUE_KEY_MAX_LENGTH)
    seconds = None if unique_for is None else check_seconds("unique_for", unique_for)
    checked: tuple[str, ...] | None = None
    if states is not None:
        if isinstance(states, str) or not isinstance(states, Iterable):
            raise InvalidOptionError("unique_states", "must be a list of job states")
        checked = tuple(str(s) if isinstance(s, JobState) else s for s in states)
        bad = [s for s in checked if type(s) is not str or s not in _STATES]
        if bad or not checked:
            raise InvalidOptionError(
                "unique_states",
                f"{list(checked)!r}: must be a non-empty list of {', '.join(sorted(_STATES))}",
            )
        checked = tuple(dict.fromkeys(checked))
    return UniqueSpec(key, seconds, checked, on_conflict)  # type: ignore[arg-type]


def states_tuple(states: Iterable[str] | None) -> tuple[str, ...] | None:
    """``unique_states`` as a tuple (checked at enqueue); a str stays a str to be refused there
    rather than split into characters."""
    if states is None or isinstance(states, str):
        return states  # type: ignore[return-value]
    try:
        return tuple(states)
    except TypeError:
        return states  # type: ignore[return-value]
