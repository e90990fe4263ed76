"""The test harness, one module per job:

- :mod:`tests.support.polling`: ``wait_for``, the one place the tests sleep;
- :mod:`tests.support.processes`: the repository's root and the handle of a subprocess;
- :mod:`tests.support.database`: the test database's URL and connections;
- :mod:`tests.support.fixtures`: the ``clean_awa`` fixture (loaded by tests/conftest.py);
- :mod:`tests.support.awa_schema`: reading and emptying the awa schema;
- :mod:`tests.support.factories`: jobs in every state, staff users and their clients;
- :mod:`tests.support.admin_client`: admin actions through the confirmation page;
- :mod:`tests.support.callbacks`: signed callback requests and parked waits;
- :mod:`tests.support.claimer_sessions`: concurrent raw claimer sessions and their checks;
- :mod:`tests.support.kind_limit_model`: a model of kind limits that raw claimers are held to.

The job kinds are in the package :mod:`tests.jobs`.
"""
