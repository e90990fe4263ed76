"""The health view (``awa_django.urls``): JSON and a status code for load balancers and
probes that speak HTTP. The checks are those of ``awa_health`` (awa_django.telemetry.health).
"""

from __future__ import annotations

from django.core.exceptions import RequestDataTooBig, TooManyFieldsSent
from django.db import transaction
from django.http import HttpRequest, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_safe

from awa_django.exceptions import JobValidationError
from awa_django.telemetry.health import check_health, parse_lag_thresholds

__all__ = ["health"]

_FLAGS = {"1": True, "true": True, "yes": True, "0": False, "false": False, "no": False}


@csrf_exempt  # it never acts: other methods get 405, not the CSRF failure page
@never_cache
@require_safe
@transaction.non_atomic_requests
def health(request: HttpRequest) -> JsonResponse:
    """``GET`` (or ``HEAD``): 200 with ``{"status": "ok", "checks": {...}}`` when every check
    passes, 503 with ``"status": "unhealthy"`` when one fails (the database unreachable or
    not answering included: the probe gives up after 10 s), 400 with ``{"error": ...}`` for a
    bad parameter, 405 for other methods. Nothing is written.

    Parameters: ``leader`` (``1``, the default, or ``0``: check that a maintenance leader
    exists), ``host`` (check that a worker registered from that host name is heartbeating; by
    default no worker is checked: the web server's host is seldom a worker's), ``max_lag``
    (repeatable: ``SECONDS`` for every queue, ``QUEUE=SECONDS`` for one).
    """
    try:
        leader = _flag(request.GET.get("leader", "1"), "leader")
        host = request.GET.get("host") or None
        if host is not None and (len(host) > 255 or "\x00" in host):
            raise ValueError("host: a host name of at most 255 characters, without NUL")
        max_lag = parse_lag_thresholds(request.GET.getlist("max_lag"))
    except (ValueError, JobValidationError) as exc:
        return JsonResponse({"error": str(exc)}, status=400)
    except (TooManyFieldsSent, RequestDataTooBig) as exc:
        return JsonResponse({"error": f"bad request: {exc}"}, status=400)
    report = check_health(worker=host is not None, host=host, leader=leader, max_lag=max_lag)
    return JsonResponse(report.as_dict(), status=200 if report.ok else 503)


def _flag(value: str, name: str) -> bool:
    try:
        return _FLAGS[value.strip().lower()]
    except KeyError:
        raise ValueError(f"{name}: {value[:20]!r} is not 1 or 0") from None
