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

# The signed callback receiver (awa_django.urls), called in-process by the resolver's HTTP
# resolutions through Django's test client (host "testserver").
ROOT_URLCONF = "tests.chaos.urls"
ALLOWED_HOSTS = ["testserver"]
CALLBACK_KEY = "chaos-only-callback-key-not-a-secret-0123456789"

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
    # Short, so that the queue ring rotates and prunes within a run; a soak keeps more. A
    # finished job's terminal row lives in the slot of its ready row, so a job that waited
    # longer than 6/7 of the retention may leave the history before the observer samples it,
    # and would be reported lost: at 15 s a loaded CI machine made one wait 24 s.
    "HISTORY_RETENTION": float(os.environ.get("AWA_CHAOS_HISTORY_RETENTION", "30")),
    "LEADER_ELECTION_INTERVAL": 0.2,
    "RUNTIME_REFRESH_INTERVAL": 0.5,
    "SHUTDOWN_TIMEOUT": 3.0,
    "RETRY_BACKOFF_BASE": 0.01,
    "ABANDON_AFTER": 1.0,
    "UNIQUE_SWEEP_INTERVAL": 1.0,
    "CRON_EVAL_INTERVAL": 0.2,
    "CONCURRENCY": 24,
    "CALLBACK_KEYS": [CALLBACK_KEY],
    # Flow limits (tests/chaos/flow.py): the operator thread changes them while the run goes on.
    "QUEUES": {
        "chaos-deadline": {"deadline": 2},
        "chaos-limit": {"global_concurrency": 4},
        "chaos-rate": {"rate_limit": 12, "rate_burst": 4},
    },
    # Periodic schedules (tests/chaos/jobs.py, chaos.tick): every second, catching up every
    # missed fire; and every two seconds, catching up only the latest.
    "PERIODIC": {
        "chaos-every-second": {
            "job": "chaos.tick",
            "cron": "* * * * * *",
            "catch_up": 1000,
            "args": ["chaos-every-second"],
        },
        "chaos-every-2s-latest": {
            "job": "chaos.tick",
            "cron": "*/2 * * * * *",
            "catch_up": "latest",
            "args": ["chaos-every-2s-latest"],
        },
    },
}

TASKS = {
    "default": {
        "BACKEND": "awa_django.backends.tasks.AwaTaskBackend",
        "QUEUES": [],
        "OPTIONS": {"max_attempts": 3},
    }
}
