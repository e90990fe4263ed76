"""Django settings of the benchmark's Django systems (``BENCH_SYSTEM`` picks the app)."""

from __future__ import annotations

import os

import environ

SECRET_KEY = "benchmarks-only"
USE_TZ = True
DATABASES = {"default": environ.Env().db_url_config(os.environ["DATABASE_URL"])}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
LOGGING_CONFIG = None

if os.environ.get("BENCH_SYSTEM") == "django_tasks_db":
    INSTALLED_APPS = ["django.contrib.contenttypes", "django_tasks", "django_tasks_db"]
    TASKS = {
        "default": {
            "BACKEND": "django_tasks_db.DatabaseBackend",
            "QUEUES": ["default"],
        }
    }
else:
    INSTALLED_APPS = ["django.contrib.contenttypes", "awa_django"]
    AWA = {"JOB_MODULES": ["benchmarks.peers.systems.awa_jobs"]}
