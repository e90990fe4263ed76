"""What a queue or job kind declares about itself (docs/descriptors.md): the checks of
``@job(label=, description=, owner=, links=)`` and ``AWA["QUEUES"][name]``, the docstring as
the default description, and the hash that tells two declarations apart."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured

import awa_django
from awa_django.conf import load_settings
from awa_django.exceptions import InvalidOptionError
from awa_django.jobs import Job
from awa_django.limits import check_descriptor
from awa_django.worker.declarations import _canonical, declarations


@awa_django.job(name="tests.unit.described", owner="team-shop", links={"runbook": "https://x.io"})
def described(order_id: int) -> None:
    """Ship one order.

    The second paragraph is not part of the description."""


@awa_django.job(name="tests.unit.plain", description="Told, not read")
def plain() -> None:
    """Docstring."""


@awa_django.job(name="tests.unit.odd", tags={"b", "a"}, metadata={1: "an int key"})
def odd() -> None:
    """First paragraph.
    \t
    A line of spaces and a tab is still a paragraph break."""


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"label": "x" * 201}, "label: 201 characters exceeds the limit of 200"),
        ({"description": "a\x00b"}, "description: contains a NUL character"),
        ({"owner": 7}, "owner: must be a str"),
        ({"links": ["https://x.io"]}, "links: must be a dict"),
        ({"links": {"x": "ftp://x.io"}}, "links['x']: 'ftp://x.io' is not an http(s) URL"),
        ({"links": {"x": "javascript:alert(1)"}}, "is not an http(s) URL"),
        ({"links": {"x": "https://a b"}}, "is not an http(s) URL"),
        ({"links": {"": "https://x.io"}}, "a link's name must not be empty"),
        ({"links": {f"l{i}": "https://x.io" for i in range(21)}}, "21 links exceeds"),
        ({"links": {"x": "https://x.io/" + "a" * 2000}}, "exceeds the limit of 2000"),
        ({"links": {"x": "https://x.io/\u3000"}}, "is not an http(s) URL"),  # not ASCII
    ],
)
def test_bad_descriptor_fields_are_refused(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidOptionError) as failed:
        check_descriptor(**fields)
    assert message in str(failed.value)
    with pytest.raises(InvalidOptionError):
        awa_django.job(name="tests.unit.refused", **fields)


def test_a_kind_is_described_by_its_docstring_unless_told() -> None:
    assert described.descriptor == {
        "description": "Ship one order.",
        "owner": "team-shop",
        "links": {"runbook": "https://x.io"},
    }
    assert plain.descriptor == {"description": "Told, not read"}
    assert odd.descriptor == {"description": "First paragraph."}
    assert described.using(queue="other").descriptor == described.descriptor


def test_queue_settings_carry_their_descriptor_and_refuse_bad_ones() -> None:
    loaded = load_settings({"QUEUES": {"orders": {"label": "Orders", "concurrency": 2}}})
    assert dict(loaded.QUEUES["orders"].descriptor) == {"label": "Orders"}
    for options, message in (
        ({"owner": ""}, None),
        ({"links": {"x": "javascript:x"}}, r"is not an http\(s\) URL"),
        ({"descripton": "typo"}, "Did you mean 'description'?"),
    ):
        if message is None:
            assert dict(load_settings({"QUEUES": {"q": options}}).QUEUES["q"].descriptor) == {
                "owner": ""
            }
            continue
        with pytest.raises(ImproperlyConfigured, match=message):
            load_settings({"QUEUES": {"q": options}})


def test_the_hash_changes_with_the_declaration_and_only_then() -> None:
    cfg = load_settings({"QUEUES": {"orders": {"description": "v1"}}})
    kinds = {"tests.unit.described": described, "tests.unit.plain": plain}
    first = declarations(kinds, ["orders", "mail"], cfg)
    assert [(i["what"], i["name"]) for i in first] == [
        ("queue", "mail"),
        ("queue", "orders"),
        ("kind", "tests.unit.described"),
        ("kind", "tests.unit.plain"),
    ]
    assert declarations(kinds, ["orders", "mail"], cfg) == first
    changed = declarations(
        kinds, ["orders", "mail"], load_settings({"QUEUES": {"orders": {"description": "v2"}}})
    )
    assert [i["hash"] == j["hash"] for i, j in zip(first, changed, strict=True)] == [
        True,
        False,
        True,
        True,
    ]
    moved = declarations({"tests.unit.plain": plain.using(max_attempts=3)}, [], cfg)
    assert moved[-1]["hash"] != first[-1]["hash"]  # an option is part of the declaration
    # The defaults in force count (a job without max_attempts takes AWA's)...
    defaults = load_settings({"MAX_ATTEMPTS": 7})
    assert declarations(kinds, [], defaults)[-1]["hash"] != declarations(kinds, [], cfg)[-1]["hash"]
    # ...and so do AWA["KINDS"] limits, which win over @job's.
    limited = load_settings({"KINDS": {"tests.unit.plain": {"global_concurrency": 2}}})
    assert declarations(kinds, [], limited)[-1]["hash"] != declarations(kinds, [], cfg)[-1]["hash"]


def test_a_change_to_the_handler_s_source_is_a_new_declaration() -> None:
    def ship_v1() -> int:
        return 1

    def ship_v2() -> int:
        return 2

    ship_v2.__qualname__ = ship_v1.__qualname__  # the same name, another body
    cfg = load_settings({})
    v1 = declarations({"k": Job(ship_v1, "k", plain.options)}, [], cfg)
    v2 = declarations({"k": Job(ship_v2, "k", plain.options)}, [], cfg)
    assert v1[0]["hash"] != v2[0]["hash"]


def test_odd_options_are_described_in_a_form_that_does_not_depend_on_order() -> None:
    [item] = declarations({"tests.unit.odd": odd}, [], load_settings({}))
    assert len(item["hash"]) == 64  # a metadata key that is not a str does not stop it
    assert _canonical({"b", "a", "c"}) == [["set"], "a", "b", "c"]
    assert _canonical({"b": 1, "a": 2}) == _canonical({"a": 2, "b": 1})
