"""Several worker hosts, simulated with Linux network namespaces (docs/several-hosts.md).

``python -m tests.fleet.run`` (root only) starts a PostgreSQL cluster that listens on one veth
address per simulated host, runs ``awa_worker --processes 2`` inside each host's namespace,
feeds them a steady load, cuts and heals hosts' links, and checks from a ledger that nothing is
lost and every extra execution is a recorded rescue. ``tests/fleet/test_several_worker_hosts.py``
runs it under pytest.
"""
