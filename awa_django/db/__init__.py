"""Database access below the worker and the maintenance leader: connections (``connection``, the
self-healing ``links``), transactions, enqueue (``enqueue``, ``bulk``), claims, heartbeats and
finalizations (``storage``), roles and the engine's migrations. Nothing here imports
``awa_django.maintenance`` or ``awa_django.worker`` (tests/unit/test_import_graph.py)."""
