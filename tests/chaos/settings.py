"""Django settings for the chaos lane (``DJANGO_SETTINGS_MODULE=tests.chaos.settings``).

The database comes from ``DATABASE_URL`` (the driver sets it to each run's fresh database).
Every awa_django interval is compressed so that heartbeats, rescue, promotion, rotation and
prune all happen many times within a one-minute run.
"""

from __future__ import annotations

import os
from typing import Any

import environ

env = environ.Env()

SECRET_KEY = "chaos-only-not-secret"
DEBUG = False
ALLOWED_HOSTS: list[str] = []
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"


def database_settings(url: str) -> dict[str, Any]:
    """DATABASES["default"] for a ``postgresql://`` URL: no persistent connections, and a short
    connect timeout so that a restarting server fails fast instead of hanging."""
    config: dict[str, Any] = env.db_url_config(url)
    config["CONN_MAX_AGE"] = 0
    config.setdefault("OPTIONS", {})["connect_timeout"] = 3
    return config


DATABASES = {
    "default": database_settings(
        os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
    ),
}

INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "awa_django",
]
try:
    import django.tasks  # noqa: F401
except ImportError:
    INSTALLED_APPS.append("django_tasks")

AWA: dict[str, Any] = {
    "JOB_MODULES": ["tests.chaos.jobs"],
    "POLL_INTERVAL": 0.05,
    "HEARTBEAT_INTERVAL": 0.2,
    "HEARTBEAT_STALENESS": 1.5,
    "RESCUE_INTERVAL": 0.2,
    "PROMOTE_INTERVAL": 0.05,
    "PRUNE_INTERVAL": 0.2,
    "CLAIM_ROTATE_INTERVAL": 0.5,
    "HISTORY_RETENTION": 15.0,
    "LEADER_ELECTION_INTERVAL": 0.2,
    "RUNTIME_REFRESH_INTERVAL": 0.5,
    "SHUTDOWN_TIMEOUT": 3.0,
    "RETRY_BACKOFF_BASE": 0.01,
    "ABANDON_AFTER": 1.0,
    "QUEUES": {"chaos-deadline": {"deadline": 2}},
}

TASKS = {
    "default": {
        "BACKEND": "awa_django.backends.tasks.AwaTaskBackend",
        "QUEUES": [],
        "OPTIONS": {"max_attempts": 3},
    }
}
