"""The chaos lane: a seeded, model-based fault-injection harness for awa_django.

``python -m tests.chaos.run --seed N`` starts PostgreSQL (or uses ``DATABASE_URL``), a few real
``awa_worker`` processes, producer threads that enqueue through every producer path, operator
actions and faults (SIGKILL/SIGSTOP of workers and of the maintenance leader, terminated
backends, PostgreSQL restarts, lock holders, pinned snapshots), then checks the queue's contract
from a ledger the handlers write (tests/chaos/ledger.sql) against awa's own tables
(tests/chaos/check.py). Everything random comes from the seed.
"""
