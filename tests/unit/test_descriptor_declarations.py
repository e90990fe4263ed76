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
from awa_django.limits import check_descriptor
from awa_django.worker.declarations import declarations


@awa_django.job(name="tests.unit.described", owner="team-shop", links={"runbook": "https://x.io"})
def described(order_id: int) -> None:
    """Ship one order.

    The second paragraph is not part of the description."""


@awa_django.job(name="tests.unit.plain", description="Told, not read")
def plain() -> None:
    """Docstring."""


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
