"""HTTP worker targets: a job kind whose handler is an HTTP endpoint (docs/http-targets.md).

``http_target(name, url=...)`` registers a job kind like ``@job`` does. A worker runs each of
its jobs by POSTing it, as JSON, to the URL, signed with the first ``AWA["CALLBACK_KEYS"]``
key the way callback requests are (docs/callbacks.md), so the target can tell it came from
this queue; the attempt's deadline is the request's timeout. The answer decides the outcome:

* 2xx: completed, with the JSON body (or the text) as the result;
* 202: the job waits for the callback whose id the request carried, which the target
  resolves later through the signed receiver (``X-Awa-Callback-Timeout: <seconds>`` in the
  answer sets how long; default ``callback_timeout``);
* ``Retry-After`` (on a 429 or a 5xx): retried after that long, counting an attempt;
* 5xx, 408, 429, a timeout, a connection error: retried by the job's retry policy;
* any other 4xx, or redirects past three: failed at once (``TerminalError``).

Connections, timeouts and redirects are urllib3's (the ``awa-django[http]`` extra): one pool
per process, redirects followed up to three, the signature headers dropped when a redirect
leaves the host.
"""

from __future__ import annotations

import email.utils
import json
import math
import re
import threading
import time
from collections.abc import Iterable, Mapping
from datetime import timedelta
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.urls import NoReverseMatch, reverse

from awa_django.callbacks.signing import SIGNATURE_HEADER, TIMESTAMP_HEADER, sign_request
from awa_django.conf import get_awa_settings
from awa_django.context import JobContext
from awa_django.exceptions import InvalidOptionError, TerminalError
from awa_django.jobs import Job, job
from awa_django.limits import check_seconds, check_text
from awa_django.outcomes import RetryAfter, WaitForCallback
from awa_django.retry import RetryPolicy

__all__ = ["HttpTargetError", "http_target"]

#: The request's timeout when the attempt has no deadline (seconds).
DEFAULT_TIMEOUT = 30.0
#: Redirects followed before the job fails.
MAX_REDIRECTS = 3
#: Characters of an error answer's body quoted in the job's error.
_QUOTED = 500
_URL = re.compile(r"https?://[^\s/?#]+[^\s]*", re.IGNORECASE | re.ASCII)
_TIMEOUT_HEADER = "X-Awa-Callback-Timeout"

_pool: Any = None
_pool_lock = threading.Lock()


class HttpTargetError(Exception):
    """An HTTP target could not be reached, timed out, or answered with a status that is
    retried (5xx, 408, 429): the job is retried by its retry policy."""


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
    tags: Iterable[str] = (),
    label: str | None = None,
    description: str | None = None,
    owner: str | None = None,
    links: Mapping[str, str] | None = None,
) -> Job[..., Any]:
    """Register the job kind ``name`` run by POSTing each job to ``url`` (an http or https URL
    of up to 2,000 characters); returns its ``Job``, enqueued as any other
    (``target.enqueue(*args, **kwargs)``). The options are ``@job``'s; ``callback_timeout``
    (seconds or ``timedelta``) is how long a job the target answered 202 waits for its
    callback unless the answer says otherwise. Bad values raise ``InvalidOptionError`` at
    once."""
    check_text("url", url, max_length=2000)
    if _URL.fullmatch(url) is None:
        raise InvalidOptionError("url", f"{url!r} is not an http(s) URL")
    wait = check_seconds("callback_timeout", callback_timeout)

    def call(ctx: JobContext, *args: Any, **kwargs: Any) -> Any:
        return _post(url, wait, ctx, list(args), kwargs)

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
        return _pool


def _post(url: str, wait: float, ctx: JobContext, args: list[Any], kwargs: dict[str, Any]) -> Any:
    import urllib3

    cfg = get_awa_settings()
    if not cfg.CALLBACK_KEYS:
        raise TerminalError(
            f"HTTP target {url}: AWA['CALLBACK_KEYS'] is empty, and requests to HTTP targets "
            "are signed with its first key"
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
    path = urllib3.util.parse_url(url).path or "/"
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "awa-django",
        **sign_request(str(ctx.id), body, path=path, key=cfg.CALLBACK_KEYS[0]),
    }
    retries = urllib3.Retry(
        total=MAX_REDIRECTS,
        connect=0,
        read=0,
        status=0,
        other=0,
        redirect=MAX_REDIRECTS,
        raise_on_redirect=False,
        remove_headers_on_redirect=[
            *urllib3.Retry.DEFAULT_REMOVE_HEADERS_ON_REDIRECT,
            SIGNATURE_HEADER,
            TIMESTAMP_HEADER,
        ],
    )
    timeout = _timeout(ctx)
    try:
        response = pool.request(
            "POST",
            url,
            body=body,
            headers=headers,
            timeout=urllib3.Timeout(total=timeout),
            retries=retries,
            preload_content=False,
        )
        try:
            data = response.read(cfg.RESULT_MAX_BYTES + 1, decode_content=True)
        finally:
            response.release_conn()
    except urllib3.exceptions.HTTPError as exc:
        raise HttpTargetError(f"POST {url} failed after {timeout:g} s at most: {exc}") from None
    return _outcome(url, response.status, response.headers, data, callback_id, wait)


def _timeout(ctx: JobContext) -> float:
    """The attempt's time left before its deadline, or :data:`DEFAULT_TIMEOUT`."""
    if ctx.deadline_at is None:
        return DEFAULT_TIMEOUT
    left = ctx.deadline_at.timestamp() - time.time()
    return max(left, 0.1)


def _outcome(
    url: str, status: int, headers: Any, data: bytes, callback_id: Any, wait: float
) -> Any:
    quoted = data[:_QUOTED].decode("utf-8", "replace")
    if status == 202:
        return WaitForCallback(callback_id, timeout=_callback_timeout(headers, wait))
    if 200 <= status < 300:
        return _result(data)
    after = _retry_after(headers.get("Retry-After"))
    if after is not None and (status == 429 or status >= 500):
        return RetryAfter(after)
    if status >= 500 or status in (408, 429):
        raise HttpTargetError(f"HTTP {status} from {url}: {quoted}")
    raise TerminalError(f"HTTP {status} from {url}: {quoted}")


def _result(data: bytes) -> Any:
    """The answer's body: its JSON value, or its text when it is not JSON, None when empty."""
    if not data.strip():
        return None
    text = data.decode("utf-8", "replace")
    try:
        return json.loads(text)
    except ValueError:
        return text


def _callback_timeout(headers: Any, wait: float) -> float:
    value = headers.get(_TIMEOUT_HEADER)
    try:
        seconds = float(value) if value is not None else wait
        return check_seconds(_TIMEOUT_HEADER, seconds)
    except (ValueError, InvalidOptionError):
        return wait


def _retry_after(value: str | None) -> float | None:
    """``Retry-After`` in seconds (a number of seconds, or an HTTP date), at most 100 years;
    None when absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        seconds = float(value)
    else:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        seconds = when.timestamp() - time.time()
    if not math.isfinite(seconds):
        return None
    return min(max(seconds, 0.0), 3_155_760_000.0)
