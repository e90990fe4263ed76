"""Per-kind flow limits (docs/flow.md, "Per kind") refuse bad input everywhere with a clear
error and nothing written: the API, the command line, AWA["KINDS"] at worker start, the admin's
actions; kind names and actors cannot forge lines of the commands' output.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.kind_limit_runs import BAD_VALUES, action, check_outputs, kind_row, one, worker

pytestmark = pytest.mark.usefixtures("clean_awa", "katk_tables")


@pytest.mark.parametrize("value", BAD_VALUES[:-1], ids=repr)
def test_bad_global_concurrency_refused_everywhere(value: Any) -> None:
    from awa_django import InvalidOptionError, job
    from awa_django.operator.actions import set_kind_limits

    with pytest.raises(InvalidOptionError):
        set_kind_limits("katk.plain", global_concurrency=value, actor="atk")
    with pytest.raises(InvalidOptionError):

        @job(name=f"katk.bad_gc_{abs(hash(repr(value)))}", global_concurrency=value)
        def bad() -> None: ...

    assert one("SELECT count(*) FROM awa.flow_kind_limits") == 0


@pytest.mark.parametrize(
    "value",
    [0, -1, 1e300, float("nan"), float("inf"), -float("inf"), True, "3", 1_000_001, 0.0001],
    ids=repr,
)
def test_bad_rate_refused(value: Any) -> None:
    from awa_django import InvalidOptionError
    from awa_django.operator.actions import set_kind_limits

    with pytest.raises(InvalidOptionError):
        set_kind_limits("katk.plain", rate_limit=value, actor="atk")
    assert one("SELECT count(*) FROM awa.flow_kind_limits") == 0


@pytest.mark.parametrize(
    "burst", [0, -1, 1_000_001, 10**30, True, "5", 2.5, float("nan")], ids=repr
)
def test_bad_burst_refused(burst: Any) -> None:
    from awa_django import InvalidOptionError
    from awa_django.operator.actions import set_kind_limits

    with pytest.raises(InvalidOptionError):
        set_kind_limits("katk.plain", rate_limit=5, rate_burst=burst, actor="atk")
    with pytest.raises(InvalidOptionError):
        set_kind_limits("katk.plain", rate_burst=5, actor="atk")  # burst without a rate
    assert one("SELECT count(*) FROM awa.flow_kind_limits") == 0


@pytest.mark.parametrize(
    "name",
    ["", " ", "x" * 256, "a\x00b", "a\ud800b", None, 5, b"katk.plain", "\t\n"],
    ids=repr,
)
def test_bad_kind_names_refused(name: Any) -> None:
    from awa_django import InvalidOptionError
    from awa_django.operator.actions import clear_kind_limits, set_kind_limits

    with pytest.raises(InvalidOptionError):
        set_kind_limits(name, global_concurrency=1, actor="atk")
    with pytest.raises(InvalidOptionError):
        clear_kind_limits(name, actor="atk")
    assert one("SELECT count(*) FROM awa.flow_kind_limits") == 0


def test_settings_kinds_bad_values_refuse_worker_start(manage_py: Any) -> None:
    for bad in (
        {"katk.plain": {"global_concurrency": 0}},
        {"katk.plain": {"rate_limit": "nan"}},
        {"katk.plain": {"global_concurrency": True}},
        {"": {"global_concurrency": 1}},
        {"katk.plain": {"rate_burst": 3}},
        {"katk.plain": {"concurrency": 3}},
    ):
        w = worker(manage_py, "--burst", overrides={"KINDS": bad})
        rc = w.wait(60)
        assert rc != 0, f"worker started with AWA['KINDS'] = {bad}: {w.output()[-1000:]}"
    assert one("SELECT count(*) FROM awa.flow_kind_limits") == 0


def test_admin_add_kind_limit_bad_input_writes_nothing(admin_client: Any) -> None:
    url = "/admin/awa_django/kindlimit/add/"
    assert admin_client.get(url).status_code == 200
    bad = [
        {"kind": "", "global_concurrency": "1"},
        {"kind": "katk.plain", "global_concurrency": "0"},
        {"kind": "katk.plain", "global_concurrency": "-1"},
        {"kind": "katk.plain", "global_concurrency": "1e300"},
        {"kind": "katk.plain", "rate_limit": "nan"},
        {"kind": "katk.plain", "rate_limit": "inf"},
        {"kind": "katk.plain", "rate_limit": "1e300"},
        {"kind": "katk.plain", "rate_limit": "0"},
        {"kind": "katk.plain", "rate_burst": "5"},
        {"kind": "katk.plain", "rate_limit": "5", "rate_burst": "99999999999999999999"},
        {"kind": "katk.plain"},
        {"kind": "katk.pl\x00ain", "global_concurrency": "1"},
        {"kind": "x" * 300, "global_concurrency": "1"},
        {"kind": "not.registered", "global_concurrency": "1"},
        {"kind": " ", "global_concurrency": "1"},
    ]
    for data in bad:
        resp = admin_client.post(url, data)
        assert resp.status_code in (200, 400), (data, resp.status_code)
        assert one("SELECT count(*) FROM awa.flow_kind_limits") == 0, data
    resp = admin_client.post(url, {"kind": "katk.plain", "global_concurrency": "3"})
    assert resp.status_code in (200, 302)
    row = kind_row("katk.plain")
    assert row is not None and row.global_concurrency == 3 and row.source == "operator"
    assert "admin" in (row.updated_by or "")


def test_admin_kind_action_bad_values_change_nothing(admin_client: Any) -> None:
    from awa_django.operator.actions import set_kind_limits

    set_kind_limits("katk.plain", global_concurrency=2, actor="atk")
    for fields in (
        {"global_concurrency": "0"},
        {"global_concurrency": "-3"},
        {"rate_limit": "nan"},
        {"rate_limit": "inf"},
        {"rate_limit": "-1"},
        {"rate_limit": "1e300"},
        {"rate_burst": "4"},
        {"rate_limit": "5", "rate_burst": "0"},
        {},
    ):
        resp = action(admin_client, ["katk.plain"], **fields)
        assert resp.status_code in (200, 302, 400), fields
        row = kind_row("katk.plain")
        assert row.global_concurrency == 2 and row.rate_limit is None, (fields, row)
    action(admin_client, ["katk.plain"], global_concurrency="5")  # the form does work
    assert kind_row("katk.plain").global_concurrency == 5
    # Clear drops the limits whatever the fields hold (the form shows the limits in force).
    action(admin_client, ["katk.plain"], clear="on", global_concurrency="3", rate_limit="nan")
    row = kind_row("katk.plain")
    assert row is None or (row.global_concurrency, row.source) != (3, "operator"), row


@pytest.mark.parametrize(
    "kind",
    ["ghost.kind", "katk.lim1", "a\x00b", "x" * 300],
    ids=["ghost", "registered-no-row", "nul", "long"],
)
def test_admin_kind_action_on_kind_without_row_writes_nothing(admin_client: Any, kind: str) -> None:
    """The action works on the rows listed: a forged selection naming a kind with no row (or a
    bad name) must not create one (adding is the "Limit a job kind" page, which checks)."""
    from awa_django.operator.actions import set_kind_limits

    set_kind_limits("katk.plain", global_concurrency=2, actor="atk")
    resp = action(admin_client, [kind], global_concurrency="3")
    assert resp.status_code in (200, 302, 400)
    assert one("SELECT count(*) FROM awa.flow_kind_limits") == 1
    assert kind_row("katk.plain").global_concurrency == 2


@pytest.mark.parametrize(
    "name",
    [
        "katk.x\nkind:katk.lim2 limit 10000 (in use 0), settings",
        "katk.x\x1b[2J\x1b[Hkind:forged",
        "katk.x\rkind:forged",
    ],
    ids=["newline", "ansi", "cr"],
)
def test_kind_name_cannot_forge_limits_output(manage_py: Any, name: str) -> None:
    """A kind named by a raw-SQL producer or an operator may hold any text: either the name is
    refused, or `awa_queue limits` and `awa_status` print it so that it cannot forge a line or
    drive the terminal."""
    from awa_django import InvalidOptionError
    from awa_django.operator.actions import set_kind_limits

    try:
        set_kind_limits(name, global_concurrency=1, actor="atk")
    except InvalidOptionError:
        return
    check_outputs(manage_py, [["awa_queue", "limits"]])


@pytest.mark.parametrize(
    "name",
    [
        "katk.x\nkind:katk.lim2 limit 10000 (in use 0), settings",
        "katk.x\x1b[2J\x1b[Hkind:forged",
        "katk.x\rkind:forged",
    ],
    ids=["newline", "ansi", "cr"],
)
def test_kind_name_cannot_forge_status_output(manage_py: Any, name: str) -> None:
    from awa_django import InvalidOptionError
    from awa_django.operator.actions import set_kind_limits

    try:
        set_kind_limits(name, global_concurrency=1, actor="atk")
    except InvalidOptionError:
        return
    check_outputs(manage_py, [["awa_status"]])


@pytest.mark.parametrize("actor", ["atk\nkind:forged limit 1", "atk\x1b[2J"], ids=["nl", "ansi"])
def test_actor_cannot_forge_limits_output(manage_py: Any, actor: str) -> None:
    from awa_django import InvalidOptionError
    from awa_django.operator.actions import set_kind_limits

    try:
        set_kind_limits("katk.plain", global_concurrency=1, actor=actor)
    except InvalidOptionError:
        return
    check_outputs(manage_py, [["awa_queue", "limits"], ["awa_status"]])


def test_queue_actor_cannot_forge_limits_output(manage_py: Any) -> None:
    """Comparison: the same actor text on a queue's limits."""
    from awa_django import InvalidOptionError
    from awa_django.operator.actions import set_queue_limits

    try:
        set_queue_limits("katk", global_concurrency=1, actor="atk\nkind:forged limit 1")
    except InvalidOptionError:
        return
    check_outputs(manage_py, [["awa_queue", "limits"], ["awa_status"]])
