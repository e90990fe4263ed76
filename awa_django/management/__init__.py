"""awa_django's management commands (``awa_worker``, ``awa_status``, ``awa_queue``, ...)."""
