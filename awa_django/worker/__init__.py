"""The worker runtime: ``manage.py awa_worker`` (see docs/worker.md).

``runtime.WorkerRuntime`` runs one process and is composed of its parts, each given what it
needs: ``dispatch`` (the claims, queue after queue), ``attempts`` (the in-flight attempts:
start, finish, abandon), ``heartbeats``, ``wakeups`` (answering ``NOTIFY``, handing wake-ups on
to the family whose lock ``family`` holds) and ``batcher`` (outcomes written in batches). An
attempt is ``prepared`` (handler resolved, arguments decoded), run (sync handlers on
``threads``), and what its handler did becomes a ``Finalization`` (``finalizations``).
``slots`` and ``flow`` bound what a process claims; ``guards`` end a process that hangs;
``config`` is what it serves; ``supervisor`` runs ``--processes N`` of them.

Imports run one way: the worker imports ``awa_django.maintenance`` (it runs the elected
leader) and ``awa_django.db``; neither imports the worker (tests/unit/test_import_graph.py).
"""
