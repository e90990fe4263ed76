"""The worker runtime: ``manage.py awa_worker`` (see docs/worker.md)."""
