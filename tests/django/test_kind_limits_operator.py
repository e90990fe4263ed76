"""The surfaces of job kinds' flow limits (docs/flow.md, "Per kind"): @job options and
AWA["KINDS"] checked at once, the operator API (kind_limits, set_kind_limits,
clear_kind_limits), ``awa_queue limit --kind`` and ``limits``, ``awa_status``, and the admin's
kinds page. Bad input: a clear error and nothing written."""

from __future__ import annotations

import json
import logging
import math
from io import StringIO
from typing import Any

import pytest
from django.conf import settings
from django.contrib.admin.models import LogEntry
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import override_settings
from django.urls import reverse

from awa_django import job
from awa_django.conf import KindSettings, load_settings
from awa_django.exceptions import InvalidOptionError
from awa_django.jobs import kind_flow_limits
from awa_django.operator import clear_kind_limits, kind_limits, set_kind_limits
from tests.jobs import common as testjobs
from tests.support.admin_client import changelist, confirmed, messages_of, post_action
from tests.support.database import pg
from tests.support.factories import BAD_LIMITS, HOSTILE, staff

pytestmark = [pytest.mark.usefixtures("clean_awa")]

KIND = testjobs.flow_sleep.kind


def rows() -> list[tuple[Any, ...]]:
    with pg() as conn:
        return conn.execute(
            "SELECT kind, max_running, rate, burst, source, updated_by FROM awa.flow_kind_limits"
            " WHERE max_running IS NOT NULL OR rate IS NOT NULL ORDER BY kind"
        ).fetchall()


def run(*args: Any) -> str:
    out = StringIO()
    call_command(*args, stdout=out, stderr=StringIO())
    return out.getvalue()


# @job and AWA["KINDS"] ---------------------------------------------------------------------


def test_job_options_are_checked_at_once() -> None:
    for limits, message in BAD_LIMITS[1:]:
        with pytest.raises(InvalidOptionError) as excinfo:
            job(name=f"tests.bad_{len(message)}", **limits)(lambda: None)
        assert message in str(excinfo.value), limits
    assert testjobs.kind_capped.limits == KindSettings(2, None, None)
    assert testjobs.kind_capped.using(priority=3).limits == testjobs.kind_capped.limits


BAD_KINDS_SETTINGS: list[tuple[Any, str]] = [
    ([], "AWA['KINDS'] must be a dict of job kind to a dict of its flow limits"),
    ({"": {"global_concurrency": 1}}, "must name a job kind"),
    ({"   ": {"global_concurrency": 1}}, "must name a job kind"),
    ({"x" * 256: {"global_concurrency": 1}}, "256 characters exceeds the limit of 255"),
    ({"a\x00b": {"global_concurrency": 1}}, "NUL"),
    ({5: {"global_concurrency": 1}}, "must be a str"),
    ({"k": 3}, "AWA['KINDS']['k'] must be a dict"),
    ({"k": {"concurrency": 3}}, "concurrency"),
    ({"k": {"global_concurrency": 0}}, "must be between 1 and 10000, got 0"),
    ({"k": {"global_concurrency": 2**70}}, "between 1 and 10000"),
    ({"k": {"global_concurrency": True}}, "must be an int"),
    ({"k": {"rate_limit": math.nan}}, "must be a number from 0.001"),
    ({"k": {"rate_limit": math.inf}}, "must be a number from 0.001"),
    ({"k": {"rate_limit": 0}}, "must be a number from 0.001"),
    ({"k": {"rate_burst": 3}}, "AWA['KINDS']['k']['rate_burst'] needs a 'rate_limit'"),
]


@pytest.mark.parametrize(("kinds", "message"), BAD_KINDS_SETTINGS, ids=range(15))
def test_bad_kinds_settings_are_improperly_configured(kinds: Any, message: str) -> None:
    with pytest.raises(ImproperlyConfigured) as excinfo:
        load_settings({"KINDS": kinds})
    assert message in str(excinfo.value)


def test_kinds_settings_win_over_job_options() -> None:
    kinds = {testjobs.kind_capped.kind: {"rate_limit": 5}, "remote.kind": {"global_concurrency": 7}}
    with override_settings(AWA={**settings.AWA, "KINDS": kinds}):
        limits = kind_flow_limits()
    assert limits[testjobs.kind_capped.kind] == {"max_running": None, "rate": 5.0, "burst": None}
    assert limits["remote.kind"] == {"max_running": 7, "rate": None, "burst": None}
    assert kind_flow_limits()[testjobs.kind_capped.kind]["max_running"] == 2


# The operator API -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("limits", "message"), BAD_LIMITS, ids=[repr(k)[:50] for k, _ in BAD_LIMITS]
)
def test_bad_kind_limits_are_refused_and_nothing_is_written(
    limits: dict[str, Any], message: str
) -> None:
    before = set_kind_limits(KIND, global_concurrency=2, actor="before")
    with pytest.raises(InvalidOptionError) as excinfo:
        set_kind_limits(KIND, **limits, actor="test")
    assert message in str(excinfo.value)
    assert rows() == [(KIND, 2, None, None, "operator", "before")]
    assert kind_limits() == [before]


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("", "kind: must name a job kind"),
        ("  ", "kind: must name a job kind"),
        ("x" * 256, "kind: 256 characters exceeds the limit of 255"),
        ("a\x00b", "kind: contains a NUL character"),
        ("\ud800", "kind: contains a lone surrogate"),
        (None, "kind: must be a str, got NoneType"),
        (5, "kind: must be a str, got int"),
        ("a\nkind:b limit 9", "kind: contains the control character '\\n' at 1"),
        ("a\x1b[2J", "kind: contains the control character '\\x1b' at 1"),
        ("a\u2028b", "kind: contains the control character '\\u2028' at 1"),
    ],
)
def test_bad_kind_names_are_refused_and_nothing_is_written(kind: Any, message: str) -> None:
    with pytest.raises(InvalidOptionError) as excinfo:
        set_kind_limits(kind, global_concurrency=2, actor="test")
    assert message in str(excinfo.value)
    with pytest.raises(InvalidOptionError):
        clear_kind_limits(kind, actor="test")
    assert rows() == []


def test_set_and_clear_are_logged_and_clear_goes_back_to_the_settings(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="awa_django.operator")
    now = set_kind_limits(KIND, global_concurrency=4, rate_limit=10, actor="alice")
    assert now.summary() == "limit 4 (in use 0), rate 10/s burst 1, operator"
    assert clear_kind_limits(KIND, actor="bob") is None
    capped = clear_kind_limits(testjobs.kind_capped.kind, actor="carol")
    assert capped is not None and capped.summary() == "limit 2 (in use 0), settings"
    assert [r.getMessage() for r in caplog.records] == [
        f"flow limits of kind {KIND} set by alice: limit 4, rate 10/s burst 1, operator",
        f"flow limits of kind {KIND} cleared by bob: no limits",
        f"flow limits of kind {testjobs.kind_capped.kind} cleared by carol: limit 2, settings",
    ]
    # The table's constraints hold too, for callers that skip Python.
    with pg() as conn, pytest.raises(Exception, match="check constraint"):
        conn.execute("SELECT * FROM awa.flow_kind_set_v1('k', 0, NULL, NULL, 'x', false)")


# awa_queue limit --kind | limits, awa_status ------------------------------------------------


def test_awa_queue_limit_kind_sets_prints_lists_and_clears() -> None:
    out = run("awa_queue", "limit", "--kind", KIND, "--global-concurrency", "3")
    assert out == f"kind {KIND} flow limits: limit 3 (in use 0), operator\n"
    run("awa_queue", "limit", "pay", "--rate", "5")
    lines = run("awa_queue", "limits").splitlines()
    assert lines[0].startswith("pay\trate 5/s burst 1, operator")
    assert lines[1].startswith(f"kind:{KIND}\tlimit 3 (in use 0), operator\tby awa_queue (")
    out = run("awa_queue", "limit", "--kind", KIND, "--clear")
    assert out == f"kind {KIND} flow limits: no flow limits\n"
    assert rows() == []
    # AWA["KINDS"] names kinds enqueued by name only; a kind limited already is known too.
    with override_settings(AWA={**settings.AWA, "KINDS": {"remote.kind": {"rate_limit": 2}}}):
        run("awa_queue", "limit", "--kind", "remote.kind", "--rate", "9")
    run("awa_queue", "limit", "--kind", "remote.kind", "--rate", "8")
    assert rows() == [("remote.kind", None, 8.0, None, "operator", rows()[0][5])]


BAD_KIND_ARGUMENTS = [
    (("limit", "--kind", "no.such.kind", "--rate", "5"), "unknown job kind 'no.such.kind'"),
    (("limit", "--kind", "", "--rate", "5"), "--kind: must name a job kind"),
    (("limit", "--kind", "x" * 300, "--rate", "5"), "300 characters exceeds the limit of 255"),
    (("limit", "--kind", KIND, "--rate", "nan"), "'nan' is not the rate limit"),
    (("limit", "--kind", KIND, "--rate", "inf"), "'inf' is not the rate limit"),
    (("limit", "--kind", KIND, "--global-concurrency", "0"), "'0' is out of range"),
    (("limit", "--kind", KIND, "--global-concurrency", "1" * 40), "is out of range"),
    (("limit", "--kind", KIND, "--burst", "5"), "--burst needs --rate"),
    (("limit", "--kind", KIND), "limit needs --global-concurrency"),
    (("limit", "--kind", KIND, "--clear", "--rate", "5"), "--clear takes no limits"),
    (("limit", "pay", "--kind", KIND, "--rate", "5"), "limit --kind takes no queue name"),
    (("pause", "pay", "--kind", KIND), "--kind only apply to limit"),
]


@pytest.mark.parametrize(
    ("argv", "message"), BAD_KIND_ARGUMENTS, ids=[" ".join(a)[:40] for a, _ in BAD_KIND_ARGUMENTS]
)
def test_bad_kind_arguments_are_command_errors_and_write_nothing(
    argv: tuple[str, ...], message: str
) -> None:
    set_kind_limits(KIND, global_concurrency=2, actor="before")
    with pytest.raises(CommandError) as excinfo:
        run("awa_queue", *argv)
    assert message in str(excinfo.value)
    assert rows() == [(KIND, 2, None, None, "operator", "before")]


def test_awa_status_shows_kind_limits_in_text_and_json() -> None:
    testjobs.noop.enqueue()
    set_kind_limits(KIND, global_concurrency=3, actor="alice")
    with pg() as holder:
        holder.execute("SELECT pg_advisory_lock(4282182, awa._flow_kind_key_v1(%s, 1))", [KIND])
        text = run("awa_status")
        data = json.loads(run("awa_status", "--json"))
    assert f"  kind {KIND}: limit 3 (in use 1), operator (by alice)\n" in text
    [row] = data["kind_limits"]
    assert (row["kind"], row["global_concurrency"], row["in_use"], row["waiting"]) == (
        KIND,
        3,
        1,
        0,
    )


def test_a_control_character_in_an_actor_is_refused_and_listings_escape_raw_sql_rows() -> None:
    with pytest.raises(InvalidOptionError) as excinfo:
        set_kind_limits(KIND, global_concurrency=2, actor="eve\nkind:forged limit 1")
    assert "actor: contains the control character '\\n' at 3" in str(excinfo.value)
    assert rows() == []
    with pg() as conn:  # raw SQL is not held to the Python rules: listings escape what it wrote
        conn.execute(
            "SELECT 1 FROM awa.flow_set_v1('q1', 2, NULL, NULL, %s, false)",
            ["eve\nforged limit 99\x1b[2J"],
        )
        conn.execute(
            "SELECT 1 FROM awa.flow_kind_set_v1(%s, 2, NULL, NULL, %s, false)",
            [KIND, "eve\rkind:forged"],
        )
        with pytest.raises(Exception) as refused:
            conn.execute(
                "SELECT 1 FROM awa.flow_kind_set_v1(%s, 2, NULL, NULL, 'eve', false)",
                ["k\nkind:forged"],
            )
        assert "no control characters" in str(refused.value)
    for text in (run("awa_queue", "limits"), run("awa_status")):
        assert "\x1b" not in text and "\r" not in text
        assert not any(line.startswith(("forged", "kind:forged")) for line in text.splitlines())
        assert "eve\\x0aforged limit 99\\x1b[2J" in text
        assert "eve\\x0dkind:forged" in text


# The admin ------------------------------------------------------------------------------------


def test_the_kinds_page_action_and_limit_page_are_gated_checked_and_logged() -> None:
    set_kind_limits(KIND, global_concurrency=3, actor=HOSTILE)
    viewer = staff()
    page = viewer.get(changelist("kindlimit")).content.decode()
    assert KIND in page and HOSTILE not in page and ">Parked<" in page
    assert "limit_kinds" not in page
    assert viewer.get(reverse("admin:awa_django_kindlimit_add")).status_code == 403
    client = staff("manage_queue")
    assert "limit_kinds" in client.get(changelist("kindlimit")).content.decode()
    confirm_page = post_action(client, "kindlimit", "limit_kinds", [KIND])
    assert f"{KIND}: limit 3 (in use 0), operator now" in confirm_page.content.decode()
    _, done = confirmed(client, "kindlimit", "limit_kinds", [KIND], rate_limit="nan")
    assert done.status_code == 200 and rows()[0][1] == 3  # the error, nothing written
    # The form opens with the limits in force: giving a rate keeps the limit of 3.
    _, done = confirmed(client, "kindlimit", "limit_kinds", [KIND], rate_limit="20")
    assert messages_of(done) == [
        f"Set flow limits: {KIND} flow limits set: limit 3, rate 20/s burst 2, operator"
    ]
    assert rows() == [(KIND, 3, 20.0, None, "operator", "admin (u1)")]
    detail = client.get(f"{changelist('kindlimit')}{KIND}/change/").content.decode()
    assert "20/s (burst 2)" in detail and ">3<" in detail  # the list's words, not "20.0"
    assert "20/s (burst 2)" in client.get(changelist("kindlimit")).content.decode()
    set_kind_limits(KIND, global_concurrency=3, rate_limit=1_000_000.0, actor="test")
    assert "1,000,000/s (burst" in client.get(changelist("kindlimit")).content.decode()
    set_kind_limits(KIND, global_concurrency=3, rate_limit=20.0, actor="admin (u1)")
    # A kind without a row yet: the "limit a job kind" page.
    add = reverse("admin:awa_django_kindlimit_add")
    refused = client.post(add, {"kind": "no.such.kind", "global_concurrency": "2"})
    assert refused.status_code == 200 and "Unknown job kind" in refused.content.decode()
    bad = client.post(add, {"kind": testjobs.noop.kind, "global_concurrency": "0"})
    assert bad.status_code == 200 and len(rows()) == 1
    done = client.post(add, {"kind": testjobs.noop.kind, "global_concurrency": "2"})
    assert done.status_code == 302
    assert (testjobs.noop.kind, 2, None, None, "operator", "admin (u1)") in rows()
    assert sorted(LogEntry.objects.values_list("object_id", "change_message")) == sorted(
        [
            (KIND, "flow limits set: limit 3, rate 20/s burst 2, operator"),
            (testjobs.noop.kind, "flow limits set: limit 2, operator"),
        ]
    )


def test_an_admin_actor_is_one_line_and_fits_the_actor_column() -> None:
    from django.contrib.auth.models import User
    from django.test import RequestFactory

    from awa_django.admin.actions import admin_actor

    request = RequestFactory().get("/")
    request.user = User(username="eve\nkind:forged" + "x" * 300)
    who = admin_actor(request)
    assert who.startswith("admin (eve\\x0akind:forged") and len(who) == 255
    set_kind_limits(KIND, global_concurrency=2, actor=who)  # accepted as it is
    assert rows() == [(KIND, 2, None, None, "operator", who)]
