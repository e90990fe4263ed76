"""``awa_worker --metrics-port``: this worker's metrics as a Prometheus scrape endpoint, through
OpenTelemetry's Prometheus exporter (the ``awa-django[otel]`` extra).

:func:`serve` makes an OpenTelemetry SDK ``MeterProvider`` with a ``PrometheusMetricReader``,
records awa_django's metrics into it (and makes it the global provider when none was set, so
that handlers' own metrics are served too), and serves ``/metrics`` from a daemon thread
(prometheus_client's HTTP server). A scrape reads in-memory aggregates only: it never queries
the database.
"""

from __future__ import annotations

import os
from typing import Any

from awa_django.telemetry.metrics import use_meter_provider

__all__ = ["serve", "slot_port"]


def slot_port(port: int) -> int:
    """The port of this process: ``port`` plus its slot under ``--processes N`` (the
    supervisor's ``AWA_WORKER_SLOT``), so that N children serve N ports."""
    slot = os.environ.get("AWA_WORKER_SLOT", "0")
    return port + (int(slot) if slot.isdigit() else 0)


def serve(port: int, host: str = "0.0.0.0") -> Any:
    """Serve Prometheus metrics on ``host:port``; return the ``MeterProvider``. Raises
    ``ImportError`` naming the extra when OpenTelemetry's SDK or exporter is missing, and
    ``OSError`` when the port cannot be bound."""
    try:
        from opentelemetry import metrics as api
        from opentelemetry.exporter.prometheus import PrometheusMetricReader
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.resources import Resource
        from prometheus_client import start_http_server
    except ImportError as exc:
        raise ImportError(
            f"--metrics-port needs OpenTelemetry: pip install 'awa-django[otel]' ({exc})"
        ) from exc
    start_http_server(port, addr=host)
    provider = MeterProvider(
        metric_readers=[PrometheusMetricReader()],
        resource=Resource.create({"service.name": "awa_worker"}),
    )
    if type(api.get_meter_provider()).__name__ in ("_ProxyMeterProvider", "NoOpMeterProvider"):
        api.set_meter_provider(provider)
    use_meter_provider(provider)
    return provider
