"""The AWA settings dict: defaults, loud validation, and cache invalidation."""

from __future__ import annotations

import ast
import re
import typing
from types import MappingProxyType

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from awa_django.conf import DEFAULTS, AwaSettings, QueueSettings, awa_settings, load_settings


def test_empty_awa_gives_the_documented_defaults() -> None:
    loaded = load_settings({})
    for name, default in DEFAULTS.items():
        assert getattr(loaded, name) == default, name
    assert loaded.POLL_INTERVAL == 0.2
    assert loaded.MAX_ATTEMPTS == 25
    assert loaded.NOTIFY is True
    assert loaded.JOB_MODULES == ()
    assert dict(loaded.QUEUES) == {}


def test_every_default_has_a_typed_attribute() -> None:
    assert set(typing.get_type_hints(AwaSettings)) == set(DEFAULTS)


#: A row of a table under "All keys" in docs/configuration.md: `` | `KEY` | type | `default` |
#: meaning | ``, the default written as a Python literal.
_DOCUMENTED_ROW = re.compile(r"^\| `([A-Z][A-Z0-9_]*)` \| [^|\n]* \| `([^`\n]*)` \|", re.M)


def documented_defaults() -> dict[str, object]:
    """Each key of the "All keys" tables of docs/configuration.md, with its default."""
    from tests.support.processes import REPO

    doc = (REPO / "docs" / "configuration.md").read_text()
    section = doc[doc.index("\n## All keys\n") :]
    section = section[: section.index("\n## ", 1)]
    rows = _DOCUMENTED_ROW.findall(section)
    documented = {name: ast.literal_eval(default) for name, default in rows}
    assert len(documented) == len(rows), "a key has two rows"
    return documented


def as_written(value: object) -> object:
    """A default as the docs write it: a tuple as a list, a read-only mapping as a dict."""
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, MappingProxyType):
        return dict(value)
    return value


def wrong_defaults(documented: dict[str, object]) -> dict[str, tuple[object, object]]:
    """``{key: (documented, default)}`` for every key whose documented default is not its
    default, in value or in type (``1`` for ``True``, ``60`` for ``60.0``)."""
    return {
        name: (documented[name], default)
        for name, default in DEFAULTS.items()
        if documented[name] != as_written(default)
        or type(documented[name]) is not type(as_written(default))
    }


def test_every_key_is_documented_with_its_default() -> None:
    documented = documented_defaults()
    assert set(documented) == set(DEFAULTS), "keys without a row, or rows of no key"
    wrong = wrong_defaults(documented)
    assert not wrong, f"documented defaults that are not the defaults (docs, code): {wrong}"


def test_the_docs_check_finds_a_wrong_default() -> None:
    row = "| `POLL_INTERVAL` | seconds | `0.5` | How often an idle worker asks. |"
    assert _DOCUMENTED_ROW.findall(row) == [("POLL_INTERVAL", "0.5")]
    documented = {**documented_defaults(), "POLL_INTERVAL": 0.5, "NOTIFY": 1, "QUEUES": {}}
    assert wrong_defaults(documented) == {"POLL_INTERVAL": (0.5, 0.2), "NOTIFY": (1, True)}


def test_values_are_merged_over_defaults() -> None:
    loaded = load_settings({"POLL_INTERVAL": 1, "JOB_MODULES": ["a.jobs"], "NOTIFY": False})
    assert loaded.POLL_INTERVAL == 1.0
    assert isinstance(loaded.POLL_INTERVAL, float)
    assert loaded.JOB_MODULES == ("a.jobs",)
    assert loaded.NOTIFY is False
    assert loaded.CONCURRENCY == 32  # untouched default


def test_queue_overrides_are_parsed() -> None:
    loaded = load_settings({"QUEUES": {"emails": {"concurrency": 2, "deadline": 30}, "bulk": {}}})
    assert loaded.QUEUES["emails"] == QueueSettings(concurrency=2, deadline=30.0)
    assert loaded.QUEUES["bulk"] == QueueSettings()


def test_flow_limits_are_parsed() -> None:
    loaded = load_settings(
        {
            "QUEUES": {
                "pay": {"global_concurrency": 5},
                "mail": {"rate_limit": 50, "rate_burst": 10},
                "plain": {"concurrency": 3},
            }
        }
    )
    assert loaded.QUEUES["pay"].has_flow_limits
    assert loaded.QUEUES["mail"].flow_limits() == {"max_running": None, "rate": 50.0, "burst": 10}
    assert isinstance(loaded.QUEUES["mail"].rate_limit, float)
    assert not loaded.QUEUES["plain"].has_flow_limits


def test_reads_go_to_the_read_alias_or_else_to_the_database_alias() -> None:
    assert load_settings({}).READ_DATABASE_ALIAS is None
    assert load_settings({}).read_alias == "default"
    assert load_settings({"DATABASE_ALIAS": "queue"}).read_alias == "queue"
    loaded = load_settings({"DATABASE_ALIAS": "queue", "READ_DATABASE_ALIAS": "replica"})
    assert (loaded.DATABASE_ALIAS, loaded.read_alias) == ("queue", "replica")


def test_settings_are_read_only() -> None:
    with pytest.raises(AttributeError):
        load_settings({}).POLL_INTERVAL = 1.0  # type: ignore[misc]


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ({"POLL_INTERVL": 1}, "AWA has no setting 'POLL_INTERVL'. Did you mean 'POLL_INTERVAL'?"),
        ({"concurrency": 5}, "AWA has no setting 'concurrency'. Did you mean 'CONCURRENCY'?"),
        ({"COLOUR": "blue"}, "AWA has no setting 'COLOUR'. Known settings: DATABASE_ALIAS,"),
        (
            {"POLL_INTERVAL": "fast"},
            "AWA['POLL_INTERVAL'] must be a number of seconds (int or float), got str ('fast').",
        ),
        ({"NOTIFY": 1}, "AWA['NOTIFY'] must be a bool (True or False), got int (1)."),
        ({"MAX_ATTEMPTS": True}, "AWA['MAX_ATTEMPTS'] must be an int, got bool (True)."),
        ({"MAX_ATTEMPTS": 2.5}, "AWA['MAX_ATTEMPTS'] must be an int, got float (2.5)."),
        (
            {"POLL_INTERVAL": -1},
            "AWA['POLL_INTERVAL'] must be a finite number greater than 0, got -1.",
        ),
        (
            {"HISTORY_RETENTION": 0},
            "AWA['HISTORY_RETENTION'] must be a finite number greater than 0, got 0.",
        ),
        ({"PRUNE_INTERVAL": float("inf")}, "must be a finite number greater than 0, got inf."),
        ({"MAX_ATTEMPTS": 0}, "AWA['MAX_ATTEMPTS'] must be between 1 and 1000, got 0."),
        ({"JSON_MAX_DEPTH": 257}, "AWA['JSON_MAX_DEPTH'] must be between 1 and 256, got 257."),
        ({"CONCURRENCY": 0}, "AWA['CONCURRENCY'] must be between 1 and 10000, got 0."),
        ({"DATABASE_ALIAS": ""}, "AWA['DATABASE_ALIAS'] must be a non-empty str, got str ('')."),
        ({"READ_DATABASE_ALIAS": ""}, "AWA['READ_DATABASE_ALIAS'] must be a non-empty str"),
        ({"READ_DATABASE_ALIAS": 1}, "AWA['READ_DATABASE_ALIAS'] must be a non-empty str"),
        ({"JOB_MODULES": "a.jobs"}, "AWA['JOB_MODULES'] must be a list of dotted module paths"),
        ({"QUEUES": []}, "AWA['QUEUES'] must be a dict of queue name to a dict of queue settings"),
        (
            {"QUEUES": {"emails": {"concurency": 2}}},
            "AWA['QUEUES']['emails'] has no setting 'concurency'. Did you mean 'concurrency'?",
        ),
        (
            {"QUEUES": {"emails": {"deadline": "1m"}}},
            "AWA['QUEUES']['emails']['deadline'] must be a number of seconds (int or float), "
            "got str ('1m').",
        ),
        (
            {"QUEUES": {"emails": {"concurrency": 0}}},
            "AWA['QUEUES']['emails']['concurrency'] must be between 1 and 10000, got 0.",
        ),
        ({"QUEUES": {"emails": 3}}, "AWA['QUEUES']['emails'] must be a dict, got int (3)."),
        (
            {"QUEUES": {"q": {"global_concurrency": 0}}},
            "AWA['QUEUES']['q']['global_concurrency'] must be between 1 and 10000, got 0.",
        ),
        (
            {"QUEUES": {"q": {"global_concurrency": True}}},
            "AWA['QUEUES']['q']['global_concurrency'] must be an int, got bool (True).",
        ),
        (
            {"QUEUES": {"q": {"rate_limit": float("nan")}}},
            "AWA['QUEUES']['q']['rate_limit'] must be a number from 0.001 to 1,000,000, got nan.",
        ),
        ({"QUEUES": {"q": {"rate_limit": float("inf")}}}, "to 1,000,000, got inf."),
        ({"QUEUES": {"q": {"rate_limit": 0}}}, "to 1,000,000, got 0."),
        ({"QUEUES": {"q": {"rate_limit": 1e300}}}, "to 1,000,000, got 1e+300."),
        ({"QUEUES": {"q": {"rate_limit": 1e-300}}}, "from 0.001 to 1,000,000, got 1e-300."),
        (
            {"QUEUES": {"q": {"rate_limit": "50/s"}}},
            "AWA['QUEUES']['q']['rate_limit'] must be a number of jobs per second",
        ),
        (
            {"QUEUES": {"q": {"rate_burst": 5}}},
            "AWA['QUEUES']['q']['rate_burst'] needs a 'rate_limit'.",
        ),
        (
            {"QUEUES": {"q": {"rate_limit": 5, "rate_burst": 0}}},
            "AWA['QUEUES']['q']['rate_burst'] must be between 1 and 1000000, got 0.",
        ),
        (
            {"QUEUES": {"Bad Name": {"global_concurrency": 2}}},
            "AWA['QUEUES'] key 'Bad Name' is not a valid queue name",
        ),
        ({"TESTING": "immediate"}, "AWA['TESTING'] must be a dict with MODE ('off' or"),
        ({"DESCRIPTOR_RETENTION": 600}, "AWA['DESCRIPTOR_RETENTION'] must be at least 3600"),
        ({"TESTING": {"MODE": "eager"}}, "AWA['TESTING']['MODE'] must be 'off' or 'immediate'"),
        ({"TESTING": {"MODE": ["x"]}}, "AWA['TESTING']['MODE'] must be 'off' or 'immediate'"),
        ({"TESTING": {"mode": "off"}}, "AWA['TESTING'] has no setting 'mode'"),
        (
            {"TESTING": {"RAISE_FAILURES": 1}},
            "AWA['TESTING']['RAISE_FAILURES'] must be a bool (True or False), got int (1).",
        ),
        ({"SCHEMA": "Shop"}, "AWA['SCHEMA'] must be a plain lower-case identifier of 1 to 56"),
        ({"SCHEMA": "shop-jobs"}, "AWA['SCHEMA'] must be a plain lower-case identifier"),
        ({"SCHEMA": "9jobs"}, "AWA['SCHEMA'] must be a plain lower-case identifier"),
        ({"SCHEMA": 'a"; DROP'}, "AWA['SCHEMA'] must be a plain lower-case identifier"),
        ({"SCHEMA": "a\x00b"}, "AWA['SCHEMA'] must be a plain lower-case identifier"),
        ({"SCHEMA": "q" * 57}, "AWA['SCHEMA'] must be a plain lower-case identifier"),
        ({"SCHEMA": ""}, "AWA['SCHEMA'] must be a plain lower-case identifier"),
        ({"SCHEMA": None}, "AWA['SCHEMA'] must be a str naming a schema, got None."),
        ({"SCHEMA": "select"}, "AWA['SCHEMA'] is 'select', a keyword of SQL"),
        ({"SCHEMA": "public"}, "AWA['SCHEMA'] is 'public', PostgreSQL's own schema"),
        ({"SCHEMA": "pg_jobs"}, "AWA['SCHEMA'] is 'pg_jobs', PostgreSQL's own schema"),
        (
            {"HEARTBEAT_INTERVAL": 10, "HEARTBEAT_STALENESS": 10},
            "AWA['HEARTBEAT_STALENESS'] (10) must be greater than AWA['HEARTBEAT_INTERVAL'] (10)",
        ),
    ],
)
def test_invalid_settings_are_rejected_with_a_precise_message(
    raw: dict[str, object], expected: str
) -> None:
    with pytest.raises(ImproperlyConfigured) as excinfo:
        load_settings(raw)
    assert expected in str(excinfo.value)


def test_awa_must_be_a_dict() -> None:
    with pytest.raises(ImproperlyConfigured, match=r"AWA must be a dict, got list"):
        load_settings([("POLL_INTERVAL", 1)])


def test_accessor_follows_override_settings() -> None:
    compressed = awa_settings.POLL_INTERVAL  # tests.settings compresses it
    with override_settings(AWA={"POLL_INTERVAL": 0.01}):
        assert awa_settings.POLL_INTERVAL == 0.01
    with override_settings(AWA={}):
        assert awa_settings.POLL_INTERVAL == 0.2  # the documented default
    assert compressed == awa_settings.POLL_INTERVAL


def test_accessor_raises_for_invalid_settings() -> None:
    with override_settings(AWA={"POLL_INTERVL": 1}), pytest.raises(ImproperlyConfigured):
        _ = awa_settings.POLL_INTERVAL


def test_accessor_rejects_unknown_attributes() -> None:
    with pytest.raises(AttributeError):
        _ = awa_settings.NOT_A_SETTING  # type: ignore[attr-defined]


@pytest.mark.parametrize("tolerance", [0.25, 0.999, 86_401, 1e9, 1e300])
def test_callback_timestamp_tolerance_is_bounded(tolerance: float) -> None:
    with pytest.raises(ImproperlyConfigured, match="between 1 and 86400 seconds"):
        load_settings({"CALLBACK_TIMESTAMP_TOLERANCE": tolerance})
    assert load_settings({"CALLBACK_TIMESTAMP_TOLERANCE": 86_400}).CALLBACK_TIMESTAMP_TOLERANCE


def test_a_schema_name_is_read_on_its_own_and_pinned_for_the_process() -> None:
    from awa_django.sql import schema, schema_setting

    assert load_settings({"SCHEMA": "shop_jobs2"}).SCHEMA == "shop_jobs2"
    assert load_settings({"SCHEMA": "q" * 56}).SCHEMA == "q" * 56
    # A bad value elsewhere is for manage.py check; the schema is still known.
    assert schema_setting({"SCHEMA": "shop_jobs", "POLL_INTERVAL": "fast"}) == "shop_jobs"
    assert schema_setting({}) == schema_setting(None) == "awa"
    with pytest.raises(ImproperlyConfigured, match="PostgreSQL's own schema"):
        schema_setting({"SCHEMA": "public"})
    # The models named their tables at start-up: an override cannot move the process.
    with override_settings(AWA={"SCHEMA": "shop_jobs"}):
        assert schema() == "awa"
