"""Django settings of the fleet test (``DJANGO_SETTINGS_MODULE=tests.fleet.settings``).

The database comes from ``DATABASE_URL``: each simulated host reaches PostgreSQL at its own veth
address. Heartbeat, rescue and election intervals are compressed so that a cut link is noticed
within a few seconds.
"""

from __future__ import annotations

import os
from typing import Any

import environ

env = environ.Env()

SECRET_KEY = "fleet-only-not-secret"
DEBUG = False
ALLOWED_HOSTS: list[str] = []
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

_db: dict[str, Any] = env.db_url_config(
    os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
)
_db["CONN_MAX_AGE"] = None  # handler threads keep their connection: the budget's worst case
_db.setdefault("OPTIONS", {})["connect_timeout"] = 3
DATABASES = {"default": _db}

INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "awa_django",
]
try:
    import django.tasks  # noqa: F401
except ImportError:
    INSTALLED_APPS.append("django_tasks")

#: Handler threads per worker process.
CONCURRENCY = 4

AWA: dict[str, Any] = {
    "JOB_MODULES": ["tests.fleet.jobs"],
    "CONCURRENCY": CONCURRENCY,
    "POLL_INTERVAL": 0.2,
    "HEARTBEAT_INTERVAL": 0.5,
    "HEARTBEAT_STALENESS": 3.0,
    "RESCUE_INTERVAL": 0.5,
    "LEADER_ELECTION_INTERVAL": 0.5,
    "RUNTIME_REFRESH_INTERVAL": 0.5,
    "SHUTDOWN_TIMEOUT": 3.0,
}
