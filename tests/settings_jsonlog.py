"""tests.settings with the JSON logging setup of docs/observability.md ("Structured logs")."""

from __future__ import annotations

from tests.settings import *  # noqa: F403

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {"awa_job": {"()": "awa_django.telemetry.logs.JobFieldsFilter"}},
    "formatters": {"json": {"()": "awa_django.telemetry.logs.JsonFormatter"}},
    "handlers": {
        "json": {
            "class": "logging.StreamHandler",
            "formatter": "json",
            "filters": ["awa_job"],
        },
    },
    "root": {"handlers": ["json"], "level": "INFO"},
}
