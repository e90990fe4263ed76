"""What a running awa_django shows to the tools that watch it (docs/observability.md).

* :mod:`awa_django.telemetry.logs`: the job fields of log records, and a JSON formatter;
* :mod:`awa_django.telemetry.health`: the health checks behind ``awa_health`` and the view;
* :mod:`awa_django.telemetry.metrics` and :mod:`awa_django.telemetry.tracing`: OpenTelemetry
  metrics and traces, with the optional ``awa-django[otel]`` extra. Nothing here imports
  OpenTelemetry unless those two are switched on.
"""

__all__: list[str] = []
