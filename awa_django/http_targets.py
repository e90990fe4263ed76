"""HTTP worker targets: a job kind whose handler is an HTTP endpoint (docs/http-targets.md).

``http_target(name, url=...)`` registers a job kind like ``@job`` does. A worker runs each of
its jobs by POSTing it, as JSON, to the URL, signed the way callback requests are
(docs/callbacks.md) with the first ``AWA["CALLBACK_KEYS"]`` key or the target's own
``signing_key``, so the target can tell it came from this queue. The whole exchange ends by the
attempt's deadline (a watchdog cuts a target that trickles its answer). The answer decides the
outcome:

* 2xx: completed, with the JSON body (or the text) as the result, or a summary of the body when
  it cannot be stored (too big, too deep, not storable);
* 202: the job waits for the callback whose id the request carried, which the target resolves
  later through the signed receiver (``X-Awa-Callback-Timeout: <seconds>`` in the answer may
  shorten the wait; default ``callback_timeout``);
* ``Retry-After`` (on a 429 or a 5xx): retried after that long, counting an attempt;
* 5xx, 408, 429, an interim 1xx, a timeout, a connection error: retried by the job's policy;
* any other 4xx or 3xx: failed at once (``TerminalError``). A 307 or 308 to the same origin is
  followed (up to three), signed again for its path; a redirect to another origin is refused,
  so the job never goes to a host the URL does not name.

Connections and timeouts are urllib3's (the ``awa-django[http]`` extra): one pool per process;
a connection whose answer was not read to the end is closed, never reused.
"""

from __future__ import annotations

import contextlib
import email.utils
import json
import math
import re
import socket
import threading
import time
from collections.abc import Iterable, Mapping
from datetime import UTC, timedelta
from typing import Any
from urllib.parse import unquote, urljoin

from django.core.exceptions import ImproperlyConfigured
from django.urls import NoReverseMatch, reverse

from awa_django import serialization
from awa_django.callbacks.signing import sign_request
from awa_django.conf import CALLBACK_KEY_MIN_LENGTH, get_awa_settings
from awa_django.context import JobContext
from awa_django.exceptions import InvalidOptionError, JobValidationError, TerminalError
from awa_django.jobs import Job, job
from awa_django.limits import (
    ATTEMPTS_RANGE,
    check_kind_name,
    check_seconds,
    check_text,
    clean_text,
)
from awa_django.outcomes import RetryAfter, WaitForCallback
from awa_django.retry import RetryPolicy

__all__ = ["HttpTargetError", "http_target"]

#: The request's time when the attempt has no deadline (seconds).
DEFAULT_TIMEOUT = 30.0
#: Same-origin 307/308 redirects followed before the job fails.
MAX_REDIRECTS = 3
#: Characters of an error answer's body quoted in the job's error.
_QUOTED = 500
_URL = re.compile(r"https?://[!-~]+", re.IGNORECASE)  # printable ASCII: punycode, %-encoding
_TIMEOUT_HEADER = "X-Awa-Callback-Timeout"
_SECONDS = re.compile(r"[0-9]{1,12}(\.[0-9]{1,9})?")

_pool: Any = None
_pool_lock = threading.Lock()
_targets: dict[str, str] = {}
_targets_lock = threading.Lock()
_current = threading.local()


class HttpTargetError(Exception):
    """An HTTP target could not be reached, ran past the attempt's deadline, or answered with a
    status that is retried (5xx, 408, 429, an interim 1xx): the job is retried by its retry
    policy."""


def http_target(
    name: str,
    *,
    url: str,
    queue: str | None = None,
    priority: int = 0,
    max_attempts: int | None = None,
    deadline: float | timedelta | None = None,
    retry: RetryPolicy | None = None,
    callback_timeout: float | timedelta = 3600.0,
    signing_key: str | None = None,
    tags: Iterable[str] = (),
    label: str | None = None,
    description: str | None = None,
    owner: str | None = None,
    links: Mapping[str, str] | None = None,
) -> Job[..., Any]:
    """Register the job kind ``name`` run by POSTing each job to ``url`` (an http or https URL
    of up to 2,000 printable ASCII characters, with a host and without credentials); returns
    its ``Job``, enqueued as any other (``target.enqueue(*args, **kwargs)``). The options are
    ``@job``'s; ``callback_timeout`` (seconds or ``timedelta``) is the longest a job the target
    answered 202 waits for its callback; ``signing_key`` (at least 32 characters) signs the
    requests instead of the first ``AWA["CALLBACK_KEYS"]`` key, so that a target that never
    answers 202 holds no key of the receiver. Registering ``name`` again with another URL
    raises ``ImproperlyConfigured``; bad values raise ``InvalidOptionError`` at once."""
    check_kind_name(name, "name")
    _check_url(url)
    wait = check_seconds("callback_timeout", callback_timeout)
    if deadline is not None:
        check_seconds("deadline", deadline)
    if max_attempts is not None and (
        isinstance(max_attempts, bool)
        or not isinstance(max_attempts, int)
        or not ATTEMPTS_RANGE[0] <= max_attempts <= ATTEMPTS_RANGE[1]
    ):
        raise InvalidOptionError(
            "max_attempts", f"{max_attempts!r} is not an int from 1 to {ATTEMPTS_RANGE[1]}"
        )
    if signing_key is not None:
        check_text("signing_key", signing_key, max_length=1000)
        if len(signing_key) < CALLBACK_KEY_MIN_LENGTH:
            raise InvalidOptionError(
                "signing_key", f"a key needs at least {CALLBACK_KEY_MIN_LENGTH} characters"
            )
    with _targets_lock:
        known = _targets.get(name)
        if known is not None and known != url:
            raise ImproperlyConfigured(
                f"HTTP target {name!r} is already registered for another URL"
            )
        _targets[name] = url

    def call(ctx: JobContext, *args: Any, **kwargs: Any) -> Any:
        return _post(url, wait, signing_key, ctx, list(args), kwargs)

    call.__qualname__ = call.__name__ = f"http_target[{name}]"
    call.__module__ = __name__
    return job(
        name=name,
        takes_context=True,
        queue=queue,
        priority=priority,
        max_attempts=max_attempts,
        deadline=deadline,
        retry=retry,
        tags=tags,
        label=label,
        description=description or f"POSTs each job to {url}",
        owner=owner,
        links=links,
    )(call)


def _check_url(url: object) -> None:
    check_text("url", url, max_length=2000)
    assert isinstance(url, str)
    if _URL.fullmatch(url) is None:
        raise InvalidOptionError(
            "url", f"{url!r} is not an http(s) URL of printable ASCII (punycode, %-encode)"
        )
    import urllib3

    try:
        parsed = urllib3.util.parse_url(url)
    except urllib3.exceptions.LocationParseError as exc:
        raise InvalidOptionError("url", f"{url!r} cannot be parsed: {exc}") from None
    if not parsed.host:
        raise InvalidOptionError("url", f"{url!r} names no host")
    if parsed.auth:
        raise InvalidOptionError(
            "url", "credentials in the URL are not sent; use signing_key, or a header proxy"
        )


def _pool_manager() -> Any:
    global _pool
    with _pool_lock:
        if _pool is None:
            try:
                import urllib3
            except ImportError:
                raise ImproperlyConfigured(
                    "HTTP targets need urllib3: install awa-django[http]"
                ) from None
            _pool = urllib3.PoolManager(num_pools=32, maxsize=16)
            _pool.pool_classes_by_scheme = _watched_pools(urllib3)
        return _pool


def _watched_pools(urllib3: Any) -> dict[str, Any]:
    """Pools whose connections record their socket for the request's watchdog."""

    def watched(base: Any) -> Any:
        class Watched(base):  # type: ignore[misc]
            def request(self, *args: Any, **kwargs: Any) -> None:
                super().request(*args, **kwargs)
                holder = getattr(_current, "holder", None)
                if holder is not None:
                    holder["sock"] = self.sock

        return Watched

    http = type(
        "WatchedPool",
        (urllib3.HTTPConnectionPool,),
        {"ConnectionCls": watched(urllib3.connection.HTTPConnection)},
    )
    https = type(
        "WatchedTLSPool",
        (urllib3.HTTPSConnectionPool,),
        {"ConnectionCls": watched(urllib3.connection.HTTPSConnection)},
    )
    return {"http": http, "https": https}


def _cut(holder: dict[str, Any]) -> None:
    """The watchdog: the deadline passed; end the exchange (its socket) wherever it is."""
    holder["cut"] = True
    sock = holder.get("sock")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


def _post(
    url: str,
    wait: float,
    signing_key: str | None,
    ctx: JobContext,
    args: list[Any],
    kwargs: dict[str, Any],
) -> Any:
    import urllib3

    cfg = get_awa_settings()
    key = signing_key or (cfg.CALLBACK_KEYS[0] if cfg.CALLBACK_KEYS else None)
    if key is None:
        raise TerminalError(
            f"HTTP target {url}: AWA['CALLBACK_KEYS'] is empty and the target has no "
            "signing_key; its requests are signed"
        )
    pool = _pool_manager()
    callback_id = ctx.callback_id  # registered before the request: a fast answer is kept
    try:
        callback_path: str | None = reverse("awa_django:callback", args=[str(callback_id)])
    except NoReverseMatch:
        callback_path = None  # awa_django.urls is not included: no receiver to call back
    body = json.dumps(
        {
            "id": ctx.id,
            "kind": ctx.kind,
            "queue": ctx.queue,
            "attempt": ctx.attempt,
            "max_attempts": ctx.max_attempts,
            "args": args,
            "kwargs": kwargs,
            "metadata": ctx.metadata,
            "callback_id": str(callback_id),
            "callback_path": callback_path,
        },
        separators=(",", ":"),
    ).encode()
    timeout = _timeout(ctx)
    ends = time.monotonic() + timeout
    target = url
    for _ in range(MAX_REDIRECTS + 1):
        path = unquote(urllib3.util.parse_url(target).path or "/")  # as request.path reads it
        headers = {
            "Content-Type": "application/json",
            "Accept-Encoding": "identity",
            "User-Agent": "awa-django",
            **sign_request(str(ctx.id), body, path=path, key=key),
        }
        status, answer, data, complete = _exchange(pool, target, body, headers, ends, cfg)
        if status in (307, 308):
            target = _same_origin(target, answer.get("Location"))
            continue
        return _outcome(target, status, answer, data, complete, callback_id, wait, cfg)
    raise TerminalError(f"POST {url}: more than {MAX_REDIRECTS} redirects")


def _exchange(
    pool: Any, url: str, body: bytes, headers: dict[str, str], ends: float, cfg: Any
) -> tuple[int, Any, bytes, bool]:
    """One POST, cut by a watchdog when the deadline passes: the status, the headers, the body
    (at most ``RESULT_MAX_BYTES`` + 1 bytes) and whether it was read to its end."""
    import urllib3

    left = ends - time.monotonic()
    if left <= 0:
        raise HttpTargetError(f"POST {url}: the attempt's deadline passed")
    holder: dict[str, Any] = {}
    _current.holder = holder
    watchdog = threading.Timer(left, _cut, [holder])
    watchdog.daemon = True
    watchdog.start()
    try:
        response = pool.urlopen(
            "POST",
            url,
            body=body,
            headers=headers,
            timeout=urllib3.Timeout(connect=left, read=left),
            retries=False,
            redirect=False,
            preload_content=False,
        )
        try:
            limit = cfg.RESULT_MAX_BYTES
            data = response.read(limit + 1, decode_content=False)
            complete = len(data) <= limit and not (100 <= response.status < 200)
        finally:
            if "complete" in locals() and complete and not holder.get("cut"):
                response.release_conn()
            else:
                response.close()  # an answer not read to its end never serves another job
    except (urllib3.exceptions.HTTPError, OSError, ValueError) as exc:
        # The watchdog's cut, or a read that timed out as the deadline came: one outcome.
        if holder.get("cut") or time.monotonic() >= ends - 0.05:
            raise HttpTargetError(
                f"POST {url} ran past the attempt's deadline ({left:.3g} s left)"
            ) from None
        raise HttpTargetError(f"POST {url} failed: {type(exc).__name__}: {exc}") from None
    finally:
        watchdog.cancel()
        _current.holder = None
    if holder.get("cut"):
        raise HttpTargetError(f"POST {url} ran past the attempt's deadline ({left:.3g} s left)")
    return response.status, response.headers, data, complete


def _same_origin(current: str, location: str | None) -> str:
    """The URL a 307/308 points to, when it is of the same origin (scheme, host and port);
    ``TerminalError`` otherwise."""
    import urllib3

    if not location:
        raise TerminalError(f"POST {current}: a redirect without a Location")
    try:
        target = urljoin(current, location)
        here, there = urllib3.util.parse_url(current), urllib3.util.parse_url(target)
    except (ValueError, urllib3.exceptions.LocationParseError):
        raise TerminalError(f"POST {current}: a redirect to an unreadable URL") from None
    if (here.scheme, here.host, here.port) != (there.scheme, there.host, there.port):
        raise TerminalError(
            f"POST {current}: a redirect to another origin ({there.scheme}://{there.host}) "
            "is refused: the job goes only where its URL says"
        )
    return str(target)


def _timeout(ctx: JobContext) -> float:
    """The attempt's time left before its deadline, or :data:`DEFAULT_TIMEOUT`."""
    if ctx.deadline_at is None:
        return DEFAULT_TIMEOUT
    left = ctx.deadline_at.timestamp() - time.time()
    return max(left, 0.1)


def _outcome(
    url: str,
    status: int,
    headers: Any,
    data: bytes,
    complete: bool,
    callback_id: Any,
    wait: float,
    cfg: Any,
) -> Any:
    quoted = clean_text(data[:_QUOTED].decode("utf-8", "replace"))
    if 100 <= status < 200:
        raise HttpTargetError(f"HTTP {status} from {url}: an interim answer is not supported")
    if status == 202:
        return WaitForCallback(callback_id, timeout=_callback_timeout(headers, wait))
    if 200 <= status < 300:
        return _result(status, headers, data, complete, cfg)
    after = _retry_after(headers.get("Retry-After"))
    if after is not None and (status == 429 or status >= 500):
        return RetryAfter(after)
    if status >= 500 or status in (408, 429):
        raise HttpTargetError(f"HTTP {status} from {url}: {quoted}")
    raise TerminalError(f"HTTP {status} from {url}: {quoted}")


def _result(status: int, headers: Any, data: bytes, complete: bool, cfg: Any) -> Any:
    """The answer's body as the job's result: its JSON value, or its text when it is not JSON,
    None when empty; a summary when it cannot be stored (the target acted: the job completes
    all the same)."""
    if not complete:
        size = headers.get("Content-Length")
        return _summary(
            status,
            int(size) if size and size.isascii() and size.isdigit() else None,
            f"the body is over RESULT_MAX_BYTES ({cfg.RESULT_MAX_BYTES})",
        )
    if not data.strip():
        return None
    text = data.decode("utf-8", "replace")
    try:
        value: Any = json.loads(text, parse_constant=_no_constant)
    except (ValueError, RecursionError):
        value = text
    try:
        serialization.dumps(
            value, "result", max_bytes=cfg.RESULT_MAX_BYTES, max_depth=cfg.JSON_MAX_DEPTH
        )
    except (JobValidationError, RecursionError) as exc:
        return _summary(status, len(data), str(exc))
    return value


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _summary(status: int, size: int | None, reason: str) -> dict[str, Any]:
    return {"http_status": status, "body_bytes": size, "stored": False, "reason": reason}


def _callback_timeout(headers: Any, wait: float) -> float:
    """The answer's ``X-Awa-Callback-Timeout`` (plain seconds), at least 1 s and at most
    ``wait`` (it may shorten the wait, never lengthen it); ``wait`` when absent or unreadable."""
    value = headers.get(_TIMEOUT_HEADER)
    if value is None or _SECONDS.fullmatch(value.strip()) is None:
        return wait
    return min(max(float(value), 1.0), wait)


def _retry_after(value: str | None) -> float | None:
    """``Retry-After`` in seconds (ASCII digits, or an HTTP date, GMT when it names no zone),
    at most 100 years; None when absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():
        seconds = float(value)
    else:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError, OverflowError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)  # asctime dates are GMT (RFC 9110)
        seconds = when.timestamp() - time.time()
    if not math.isfinite(seconds):
        return None
    return min(max(seconds, 0.0), 3_155_760_000.0)
