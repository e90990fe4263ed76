"""The JSON-only codec for job arguments, metadata and results.

Job data is JSON and nothing else: no serialized Python objects, no code. Values are checked before
anything is written, so a bad value fails the one request with a clear error and never reaches
the queue. Accepted: ``dict`` (string keys), ``list``, ``tuple`` (stored as a list), ``str``
(valid UTF-8 without NUL), ``int`` (at most 4,300 digits), ``float`` (finite), ``bool`` and
``None``.
"""

from __future__ import annotations

import json
import math
from typing import Any

from awa_django.exceptions import InvalidArgumentsError, LimitExceededError

__all__ = ["check_json", "dumps", "encode", "fragment", "loads"]

_SCALARS = (int, bool, type(None))

#: Integers with more digits than this are refused (Python's own limit for int <-> str).
MAX_INT_DIGITS = 4300
_INT_LIMIT = 10**MAX_INT_DIGITS


def _bad_text(text: str) -> str | None:
    """Why PostgreSQL cannot store ``text`` (NUL, lone surrogate), or None."""
    if "\x00" in text:
        return "contains a NUL character"
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            return "contains a lone surrogate (not valid UTF-8)"
    return None


def check_json(value: Any, field: str, *, max_depth: int, envelope: int = 0) -> None:
    """Raise ``InvalidArgumentsError`` unless ``value`` is plain JSON within ``max_depth``.

    Depth counts nested non-empty containers: a scalar or an empty container is 0,
    ``[1]`` is 1, ``{"a": [1]}`` is 2. ``envelope`` levels of wrapping added by awa_django itself
    (the ``{"args": [...]}`` document) are not counted against the user's limit.
    """
    limit = max_depth + envelope
    # Iterative walk: (value, depth of value, path) — no recursion limit to hit.
    stack: list[tuple[Any, int, str]] = [(value, 0, field)]
    while stack:
        item, depth, path = stack.pop()
        kind = type(item)
        if kind is str:
            problem = _bad_text(item)
            if problem is not None:
                raise InvalidArgumentsError(field, f"{path} {problem}")
        elif kind is int:
            if not -_INT_LIMIT < item < _INT_LIMIT:
                raise InvalidArgumentsError(
                    field, f"{path} is an integer of more than {MAX_INT_DIGITS} digits"
                )
        elif kind is float:
            if not math.isfinite(item):
                raise InvalidArgumentsError(
                    field, f"{path} is {item!r}; JSON has no NaN or infinity"
                )
        elif kind is dict:
            if item:
                if depth + 1 > limit:
                    raise LimitExceededError(field, f"nesting deeper than {max_depth} levels")
                for key, child in item.items():
                    if type(key) is not str:
                        raise InvalidArgumentsError(
                            field,
                            f"{path} has a {type(key).__name__} key {key!r}; keys must be str",
                        )
                    problem = _bad_text(key)
                    if problem is not None:
                        raise InvalidArgumentsError(field, f"{path} has a key that {problem}")
                    stack.append((child, depth + 1, f"{path}[{key!r}]"))
        elif kind is list or kind is tuple:
            if item:
                if depth + 1 > limit:
                    raise LimitExceededError(field, f"nesting deeper than {max_depth} levels")
                for index, child in enumerate(item):
                    stack.append((child, depth + 1, f"{path}[{index}]"))
        elif kind not in _SCALARS:
            # Subclasses (enums, str subclasses, OrderedDict …) are refused on purpose: what is
            # stored must be exactly what the handler gets back.
            raise InvalidArgumentsError(
                field,
                f"{path} is a {type(item).__name__}, which is not JSON "
                "(use dict, list, str, int, float, bool or None)",
            )


def _plain(value: Any, limit: int) -> bool:
    """Fast check: True when ``value`` is plain JSON nested at most ``limit`` levels.

    False means "not sure": ``check_json`` then finds and reports the problem.
    """
    stack: list[tuple[Any, int]] = [(value, 0)]
    pop = stack.pop
    push = stack.append
    while stack:
        item, depth = pop()
        kind = type(item)
        if kind is str:
            if "\x00" in item:
                return False
        elif kind is int or kind is bool or item is None:
            continue
        elif kind is float:
            if item - item != 0.0:  # NaN or infinity
                return False
        elif kind is dict:
            if item:
                depth += 1
                if depth > limit:
                    return False
                for key, child in item.items():
                    if type(key) is not str or "\x00" in key:
                        return False
                    push((child, depth))
        elif kind is list or kind is tuple:
            if item:
                depth += 1
                if depth > limit:
                    return False
                for child in item:
                    push((child, depth))
        else:
            return False
    return True


#: The stdlib encoder: compact, UTF-8 text (non-ASCII characters as they are), NaN and infinity
#: refused. No circular-reference markers: values reach it only after ``_plain``/``check_json``,
#: whose depth limit already refuses cycles, or are built by awa_django itself.
_ENCODER = json.JSONEncoder(
    separators=(",", ":"), ensure_ascii=False, allow_nan=False, check_circular=False
)
_encode = _ENCODER.encode


def encode(value: Any) -> str:
    """Compact JSON text of a document awa_django builds itself from checked parts (a request
    of ``awa.enqueue_v1``, a batch of finalizations or heartbeats). No validation: every part
    was checked when it was made. Raises ``ValueError`` for NaN or infinity."""
    return _encode(value)


def fragment(text: str) -> Any:
    """The value of JSON text made by ``dumps`` (an argument, a result, progress), to nest it
    in a document for ``encode``: the text decodes to exactly the value it was encoded from,
    and encodes back to the same text."""
    return None if text == "null" else json.loads(text)


def dumps(value: Any, field: str, *, max_bytes: int, max_depth: int, envelope: int = 0) -> str:
    """Check ``value`` (see ``check_json``) and return its compact JSON text.

    Raises ``InvalidArgumentsError`` for anything that is not plain JSON and
    ``LimitExceededError`` when nesting exceeds ``max_depth`` or the UTF-8 text exceeds
    ``max_bytes``.
    """
    if not _plain(value, max_depth + envelope):
        check_json(value, field, max_depth=max_depth, envelope=envelope)
    try:
        text = _encode(value)
        size = len(text) if text.isascii() else len(text.encode("utf-8"))
    except (ValueError, UnicodeEncodeError):
        # A lone surrogate or an integer too long to print: the fast check lets both through.
        check_json(value, field, max_depth=max_depth, envelope=envelope)
        raise  # pragma: no cover - check_json has raised with the path
    if size > max_bytes:
        raise LimitExceededError(field, f"{size} bytes exceeds the limit of {max_bytes} bytes")
    return text


def loads(text: str | bytes) -> Any:
    """Decode JSON text produced by ``dumps`` (or read back from Postgres)."""
    return json.loads(text)
