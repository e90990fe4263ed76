"""Signatures of callback requests: HMAC-SHA256 over the request, with rotating keys.

A request to the receiver (``POST <prefix>/callbacks/<callback_id>/``) carries two headers:

* ``X-Awa-Timestamp``: when it was signed, in Unix seconds (ASCII digits);
* ``X-Awa-Signature``: ``v1=<hex>``, the HMAC-SHA256, under one of the receiver's keys, of::

      awa-callback-v1 \\n METHOD \\n PATH \\n CALLBACK_ID \\n TIMESTAMP \\n SHA256_HEX(BODY)

  where PATH is the request's path as Django sees it (``request.path``: percent-decoded,
  without the query string), CALLBACK_ID the id as it appears in that path, and BODY the exact
  bytes sent. Several ``v1=`` values may be given, separated by commas (at most 8).

So a signature covers what the request does and to which callback: changing the method, the
path, the id, the timestamp or one byte of the body makes it fail. Keys come from
``AWA["CALLBACK_KEYS"]``: the first signs, every one verifies, so a key is rotated by putting the
new one first, updating the senders, then removing the old one. Comparison is constant-time
(``hmac.compare_digest``) and every key is tried whichever matches.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import time
import uuid
from collections.abc import Sequence

__all__ = [
    "SIGNATURE_HEADER",
    "TIMESTAMP_HEADER",
    "body_digest",
    "message",
    "parse_signatures",
    "parse_timestamp",
    "sign_request",
    "signature",
    "signature_matches",
]

#: The header holding the signature(s): ``v1=<64 hex digits>``.
SIGNATURE_HEADER = "X-Awa-Signature"
#: The header holding the signing time, in Unix seconds.
TIMESTAMP_HEADER = "X-Awa-Timestamp"

_PREFIX = "awa-callback-v1"
_TIMESTAMP = re.compile(r"[0-9]{1,12}")
_V1 = re.compile(r"v1=([0-9a-fA-F]{64})")
_MAX_SIGNATURES = 8


def body_digest(body: bytes) -> bytes:
    """SHA-256 of the body bytes."""
    return hashlib.sha256(body).digest()


def message(method: str, path: str, callback_id: str, timestamp: str, body: bytes) -> bytes:
    """The bytes a signature covers (see the module docstring)."""
    text = "\n".join(
        (_PREFIX, method.upper(), path, callback_id, timestamp, body_digest(body).hex())
    )
    return text.encode("utf-8", "backslashreplace")


def _key_bytes(key: str | bytes) -> bytes:
    return key if isinstance(key, bytes) else key.encode("utf-8")


def signature(key: str | bytes, signed: bytes) -> str:
    """The ``v1=<hex>`` value of ``signed`` (from :func:`message`) under ``key``."""
    return "v1=" + hmac.new(_key_bytes(key), signed, hashlib.sha256).hexdigest()


def sign_request(
    callback_id: uuid.UUID | str,
    body: bytes | str,
    *,
    path: str,
    method: str = "POST",
    key: str | bytes | None = None,
    timestamp: int | None = None,
) -> dict[str, str]:
    """The headers that sign a request to the callback receiver: ``{"X-Awa-Timestamp": ...,
    "X-Awa-Signature": "v1=..."}``. Send them with exactly ``body`` (a str is sent as UTF-8).

    ``path`` is the URL path the request goes to (``callback_path(callback_id)`` in the
    project, e.g. ``/awa/callbacks/<id>/``), ``key`` one of the receiver's
    ``AWA["CALLBACK_KEYS"]`` (default: the first, read from Django's settings: give it
    explicitly outside a Django project), ``timestamp`` the signing time in Unix seconds
    (default: now). Pure computation: nothing is sent, nothing is read but the settings.
    """
    if key is None:
        from awa_django.conf import get_awa_settings

        keys = get_awa_settings().CALLBACK_KEYS
        if not keys:
            raise ValueError('sign_request: no key given and AWA["CALLBACK_KEYS"] is empty')
        key = keys[0]
    if not isinstance(key, str | bytes) or not key:
        raise TypeError("sign_request: key must be a non-empty str or bytes")
    if isinstance(body, str):
        body = body.encode("utf-8")
    if not isinstance(body, bytes):
        raise TypeError("sign_request: body must be bytes or str (the exact body sent)")
    sent_at = int(time.time()) if timestamp is None else timestamp
    if type(sent_at) is not int or not 0 <= sent_at < 10**12:
        raise ValueError("sign_request: timestamp must be Unix seconds (an int)")
    stamp = str(sent_at)
    signed = message(method, path, str(callback_id), stamp, body)
    return {TIMESTAMP_HEADER: stamp, SIGNATURE_HEADER: signature(key, signed)}


def parse_timestamp(value: str | None) -> int | None:
    """The timestamp header as Unix seconds, or None when it is missing or not 1-12 ASCII
    digits."""
    if value is None or _TIMESTAMP.fullmatch(value) is None:
        return None
    return int(value)


def parse_signatures(value: str | None) -> list[bytes] | None:
    """The ``v1`` signatures of a signature header as bytes, or None when the header is missing,
    malformed, or holds none (or more than 8)."""
    if not value or len(value) > 1024:
        return None
    parts = [part.strip() for part in value.split(",")]
    if len(parts) > _MAX_SIGNATURES:
        return None
    found = []
    for part in parts:
        match = _V1.fullmatch(part)
        if match is None:
            return None
        found.append(bytes.fromhex(match.group(1)))
    return found or None


def signature_matches(candidates: Sequence[bytes], keys: Sequence[str], signed: bytes) -> bool:
    """Whether one of ``candidates`` is the HMAC-SHA256 of ``signed`` under one of ``keys``.

    Every key is tried against every candidate with ``hmac.compare_digest``, whichever
    matches, so the time taken says nothing about which one did.
    """
    matched = False
    for key in keys:
        expected = hmac.new(_key_bytes(key), signed, hashlib.sha256).digest()
        for candidate in candidates:
            matched |= hmac.compare_digest(expected, candidate)
    return matched
