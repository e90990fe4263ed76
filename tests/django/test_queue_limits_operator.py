"""The operator surfaces of flow limits (docs/flow.md, docs/operations.md, docs/admin.md): the
API (queue_limits, set_queue_limits, clear_queue_limits), ``awa_queue limit|limits``,
``awa_status`` and the admin's columns and "Set flow limits" action."""

from __future__ import annotations

import getpass
import json
import logging
from collections.abc import Iterator
from io import StringIO
from typing import Any

import psycopg
import pytest
from django.conf import settings
from django.contrib.admin.models import LogEntry
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import transaction
from django.test import override_settings

from awa_django.exceptions import InvalidOptionError
from awa_django.operator import (
    QueueLimits,
    clear_queue_limits,
    queue_limits,
    set_queue_limits,
)
from tests.jobs import common as testjobs
from tests.support.admin_client import changelist, confirmed, messages_of, post_action
from tests.support.database import pg
from tests.support.factories import BAD_LIMITS, HOSTILE, staff

pytestmark = [pytest.mark.usefixtures("clean_awa")]

#: What the mail queue's settings say, for the tests that clear an operator override.
MAIL_SETTINGS = {"mail": {"global_concurrency": 3, "rate_limit": 20, "concurrency": 2}}


def rows() -> list[tuple[Any, ...]]:
    """Every row of awa.flow_limits that limits something (a cleared queue's row stays without
    limits, keeping the permits it may still have in use counted)."""
    with pg() as conn:
        return conn.execute(
            "SELECT queue, max_running, rate, burst, source, updated_by FROM awa.flow_limits"
            " WHERE max_running IS NOT NULL OR rate IS NOT NULL ORDER BY queue"
        ).fetchall()


@pytest.fixture
def permits() -> Iterator[psycopg.Connection[Any]]:
    """A session standing in for a worker: it holds permits (as claim_v3 takes them)."""
    with pg() as conn:
        yield conn


def hold(conn: psycopg.Connection[Any], queue: str, *indexes: int) -> None:
    for i in indexes:
        conn.execute(
            "SELECT pg_advisory_lock(4282182, awa._flow_key_v1(%s, %s))", [queue, i]
        ).fetchone()


def run(*args: Any) -> str:
    out = StringIO()
    call_command(*args, stdout=out, stderr=StringIO())
    return out.getvalue()


# The API: checked first, nothing written on bad input ------------------------------------


@pytest.mark.parametrize(
    ("limits", "message"), BAD_LIMITS, ids=[repr(k)[:50] for k, _ in BAD_LIMITS]
)
def test_bad_limits_are_refused_with_a_clear_error_and_nothing_is_written(
    limits: dict[str, Any], message: str
) -> None:
    before = set_queue_limits("q", global_concurrency=2, actor="before")
    with pytest.raises(InvalidOptionError) as excinfo:
        set_queue_limits("q", **limits, actor="test")
    assert message in str(excinfo.value)
    assert rows() == [("q", 2, None, None, "operator", "before")]
    assert queue_limits() == [before]


@pytest.mark.parametrize(
    ("queue", "actor", "message"),
    [
        ("Bad Name", "t", "queue: 'Bad Name' is not a valid queue name"),
        ("", "t", "queue: '' is not a valid queue name"),
        ("x" * 64, "t", "is not a valid queue name"),
        (None, "t", "queue: None is not a valid queue name"),
        (5, "t", "queue: 5 is not a valid queue name"),
        ("q", "", "actor: must name who made the change"),
        ("q", "  ", "actor: must name who made the change"),
        ("q", "a\x00b", "actor: contains a NUL character"),
        ("q", "x" * 256, "actor: 256 characters exceeds the limit of 255"),
        ("q", None, "actor: must be a str"),
    ],
)
def test_a_bad_queue_or_actor_is_refused_by_set_and_clear(
    queue: Any, actor: Any, message: str
) -> None:
    with pytest.raises(InvalidOptionError, match=message):
        set_queue_limits(queue, global_concurrency=1, actor=actor)
    with pytest.raises(InvalidOptionError, match=message):
        clear_queue_limits(queue, actor=actor)
    assert rows() == []


def test_set_replaces_the_limits_and_reads_back_what_is_in_force(
    permits: psycopg.Connection[Any],
) -> None:
    assert queue_limits() == []
    first = set_queue_limits("pay", global_concurrency=3, actor="alice")
    assert (first.queue, first.global_concurrency, first.in_use, first.rate_limit) == (
        "pay",
        3,
        0,
        None,
    )
    assert (first.source, first.updated_by, first.rate_burst) == ("operator", "alice", None)
    assert first.summary() == "limit 3 (in use 0), operator"
    hold(permits, "pay", 0, 2)
    [now] = queue_limits()
    assert now.in_use == 2 and now.summary() == "limit 3 (in use 2), operator"
    # A later set replaces the limits as a whole: the concurrency limit is lifted.
    second = set_queue_limits("pay", rate_limit=50, rate_burst=5, actor="bob")
    assert (second.global_concurrency, second.in_use) == (None, None)
    assert (second.rate_limit, second.rate_burst, second.burst_in_force) == (50.0, 5, 5)
    assert second.summary() == "rate 50/s burst 5, operator"
    assert isinstance(second.rate_limit, float) and second.updated_by == "bob"
    both = set_queue_limits("pay", global_concurrency=4, rate_limit=0.5, actor="bob")
    assert both.burst_in_force == 1  # by default a tenth of a second's worth, at least 1
    assert both.summary() == "limit 4 (in use 2), rate 0.5/s burst 1, operator"
    assert set_queue_limits("pay", rate_limit=250, actor="bob").burst_in_force == 25
    assert set_queue_limits("a.b-c_1", rate_limit=1_000_000, actor="x").rate_limit == 1e6
    assert [q.queue for q in queue_limits()] == ["a.b-c_1", "pay"]


def test_clear_writes_the_settings_back_or_removes_the_limits() -> None:
    with override_settings(AWA={**settings.AWA, "QUEUES": MAIL_SETTINGS}):
        set_queue_limits("mail", global_concurrency=9, actor="alice")
        set_queue_limits("other", global_concurrency=9, actor="alice")
        back = clear_queue_limits("mail", actor="bob")
        assert isinstance(back, QueueLimits)
        assert (back.global_concurrency, back.rate_limit, back.rate_burst) == (3, 20.0, None)
        assert (back.source, back.updated_by, back.burst_in_force) == ("settings", "bob", 2)
        assert clear_queue_limits("other", actor="bob") is None
        assert clear_queue_limits("never-limited", actor="bob") is None
        assert clear_queue_limits("mail", actor="carol") == queue_limits()[0]  # idempotent
    assert rows() == [("mail", 3, 20.0, None, "settings", "carol")]


def test_a_write_joins_the_callers_transaction_and_is_logged_once_committed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="awa_django.operator")
    with pytest.raises(RuntimeError), transaction.atomic():
        set_queue_limits("q", global_concurrency=2, actor="alice")
        assert [r[0] for r in rows()] == []  # not committed yet: another session sees nothing
        raise RuntimeError("rolled back")
    assert rows() == [] and not caplog.records
    with transaction.atomic():
        set_queue_limits("q", global_concurrency=2, actor="alice")
        assert not caplog.records  # logged at commit
    set_queue_limits("q", rate_limit=7, actor="bob")
    clear_queue_limits("q", actor="carol")
    assert [r.getMessage() for r in caplog.records] == [
        "flow limits of queue q set by alice: limit 2, operator",
        "flow limits of queue q set by bob: rate 7/s burst 1, operator",
        "flow limits of queue q cleared by carol: no limits",
    ]


# awa_queue limit | limits -----------------------------------------------------------------


def test_awa_queue_limit_sets_prints_lists_and_clears(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="awa_django.operator")
    assert run("awa_queue", "limits") == "no queue has flow limits\n"
    out = run("awa_queue", "limit", "pay", "--global-concurrency", "4", "--rate", "10")
    assert out == "queue pay flow limits: limit 4 (in use 0), rate 10/s burst 1, operator\n"
    actor = f"awa_queue ({getpass.getuser()})"
    assert rows() == [("pay", 4, 10.0, None, "operator", actor)]
    assert caplog.records[-1].getMessage() == (
        f"flow limits of queue pay set by {actor}: limit 4, rate 10/s burst 1, operator"
    )
    out = run("awa_queue", "limit", "pay", "--rate", "2.5", "--burst", "3")
    assert out == "queue pay flow limits: rate 2.5/s burst 3, operator\n"
    [line] = run("awa_queue", "limits").splitlines()
    assert line.startswith(f"pay\trate 2.5/s burst 3, operator\tby {actor} at 20")
    assert run("awa_queue", "limit", "pay", "--clear") == "queue pay flow limits: no flow limits\n"
    assert rows() == []
    assert run("awa_queue", "limit", "pay", "--rate", "1", "--verbosity", "0") == ""
    with override_settings(AWA={**settings.AWA, "QUEUES": MAIL_SETTINGS}):
        out = run("awa_queue", "limit", "mail", "--clear")
    assert out == "queue mail flow limits: limit 3 (in use 0), rate 20/s burst 2, settings\n"


BAD_LIMIT_ARGUMENTS = [
    (("limit", "pay", "--rate", "nan"), "'nan' is not the rate limit"),
    (("limit", "pay", "--rate", "inf"), "'inf' is not the rate limit"),
    (("limit", "pay", "--rate", "0"), "'0' is out of range: the rate limit is a number from 0.001"),
    (("limit", "pay", "--rate", "-1"), "'-1' is out of range: the rate limit"),
    (("limit", "pay", "--rate", "1e300"), "'1e300' is out of range: the rate limit"),
    (("limit", "pay", "--rate", "1e99999"), "'1e99999' is not the rate limit"),
    (("limit", "pay", "--rate", "1000001"), "to 1e+06"),
    (("limit", "pay", "--rate", "1e-9"), "out of range: the rate limit is a number from 0.001"),
    (("limit", "pay", "--rate", "fast"), "'fast' is not the rate limit"),
    (("limit", "pay", "--global-concurrency", "0"), "'0' is out of range: the global"),
    (("limit", "pay", "--global-concurrency", "10001"), "'10001' is out of range"),
    (("limit", "pay", "--global-concurrency", "1.5"), "'1.5' is not the global concurrency"),
    (("limit", "pay", "--rate", "5", "--burst", "0"), "'0' is out of range: the burst"),
    (("limit", "pay", "--burst", "5"), "--burst needs --rate"),
    (("limit", "pay", "--global-concurrency", "2", "--burst", "5"), "--burst needs --rate"),
    (("limit", "pay"), "limit needs --global-concurrency, --rate (with --burst), or --clear"),
    (("limit", "pay", "--clear", "--rate", "5"), "--clear takes no limits"),
    (("limit",), "limit needs a queue name"),
    (("limit", "Bad Name", "--rate", "5"), "'Bad Name' is not a valid queue name"),
    (("limits", "pay"), "limits takes no queue name"),
    (("pause", "pay", "--rate", "5"), "--rate only apply to limit"),
    (("stats", "pay", "--clear"), "--clear only apply to limit"),
    (("pause",), "pause needs a queue name"),
]


@pytest.mark.parametrize(
    ("argv", "message"), BAD_LIMIT_ARGUMENTS, ids=[" ".join(a) for a, _ in BAD_LIMIT_ARGUMENTS]
)
def test_bad_limit_arguments_are_command_errors_and_write_nothing(
    argv: tuple[str, ...], message: str
) -> None:
    set_queue_limits("pay", global_concurrency=2, actor="before")
    with pytest.raises(CommandError) as excinfo:
        run("awa_queue", *argv)
    assert message in str(excinfo.value)
    assert rows() == [("pay", 2, None, None, "operator", "before")]


def test_awa_queue_limit_exit_codes_on_the_command_line(manage_py: Any) -> None:
    bad = manage_py("awa_queue", "limit", "pay", "--rate", "nan")
    assert bad.wait(60) == 2
    assert "Traceback" not in bad.output() and "is not the rate limit" in bad.output()
    refused = manage_py("awa_queue", "limit", "pay", "--burst", "3")
    assert refused.wait(60) == 1
    assert "CommandError: --burst needs --rate" in refused.output()
    good = manage_py("awa_queue", "limit", "pay", "--global-concurrency", "3")
    assert good.wait(60) == 0, good.output()
    assert "queue pay flow limits: limit 3 (in use 0), operator" in good.output()
    assert rows() == [("pay", 3, None, None, "operator", f"awa_queue ({getpass.getuser()})")]


# awa_status -------------------------------------------------------------------------------


def test_awa_status_shows_limits_in_use_and_rate_in_text_and_json(
    permits: psycopg.Connection[Any],
) -> None:
    testjobs.noop.enqueue()
    assert "flow limits:\n  none\n" in run("awa_status")
    set_queue_limits("default", global_concurrency=3, actor="alice")
    set_queue_limits("mail", rate_limit=50, rate_burst=5, actor="bob")
    hold(permits, "default", 1)
    text = run("awa_status")
    assert "  default: limit 3 (in use 1), operator (by alice)\n" in text
    assert "  mail: rate 50/s burst 5, operator (by bob)\n" in text
    data = json.loads(run("awa_status", "--json"))
    default, mail = data["flow_limits"]
    assert {k: v for k, v in default.items() if k != "updated_at"} == {
        "queue": "default",
        "global_concurrency": 3,
        "in_use": 1,
        "rate_limit": None,
        "rate_burst": None,
        "burst_in_force": None,
        "source": "operator",
        "updated_by": "alice",
    }
    assert (mail["rate_limit"], mail["rate_burst"], mail["burst_in_force"]) == (50.0, 5, 5)
    assert mail["in_use"] is None and mail["updated_at"].startswith("20")


# The admin --------------------------------------------------------------------------------


def test_the_queue_list_shows_limit_in_use_rate_and_who_escaped(
    permits: psycopg.Connection[Any],
) -> None:
    testjobs.noop.enqueue()
    testjobs.noop.using(queue="mail").enqueue()
    testjobs.noop.using(queue="free").enqueue()
    set_queue_limits("default", global_concurrency=3, actor=HOSTILE)
    set_queue_limits("mail", rate_limit=0.5, actor="bob")
    hold(permits, "default", 0, 1)
    page = staff().get(changelist("queuestat")).content.decode()
    for header in ("Global limit", "In use", "Rate", "Limits by"):
        assert f">{header}<" in page, header
    assert HOSTILE not in page
    assert "operator: &lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in page
    cells = {name: _row(page, name) for name in ("default", "mail", "free")}
    assert cells["default"][-4:] == [
        "3",
        "2",
        "-",
        "operator: &lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;",
    ]
    assert cells["mail"][-4:] == ["-", "-", "0.5/s (burst 1)", "operator: bob"]
    assert cells["free"][-4:] == ["-", "-", "-", "-"]


def _row(page: str, queue: str) -> list[str]:
    """The text of each cell of the list's row for ``queue``."""
    import re

    row = re.search(rf"<tr>(?:(?!</tr>).)*>{re.escape(queue)}</a>(?:(?!</tr>).)*</tr>", page, re.S)
    assert row is not None, queue
    return [c.strip() for c in re.findall(r"<td[^>]*>(.*?)</td>", row.group(0), re.S)]


def test_the_set_flow_limits_action_is_confirmed_checked_and_logged() -> None:
    testjobs.noop.enqueue()
    testjobs.noop.using(queue="mail").enqueue()
    client = staff("manage_queue")
    assert "limit_queues" in client.get(changelist("queuestat")).content.decode()
    set_queue_limits("mail", rate_limit=4, actor="bob")
    page = post_action(client, "queuestat", "limit_queues", ["default", "mail"])
    text = page.content.decode()
    assert page.status_code == 200 and 'name="global_concurrency"' in text
    assert "default: no flow limits now" in text and "mail: rate 4/s burst 1, operator now" in text
    assert "have different flow limits: the form is empty" in text
    assert rows() == [("mail", None, 4.0, None, "operator", "bob")]  # nothing before confirming
    # One queue: the form opens with its limits, so changing one field keeps the others.
    set_queue_limits("mail", global_concurrency=7, rate_limit=4, rate_burst=3, actor="bob")
    text = post_action(client, "queuestat", "limit_queues", ["mail"]).content.decode()
    assert 'name="global_concurrency" value="7"' in text and 'name="rate_burst" value="3"' in text
    assert 'name="rate_limit" value="4.0"' in text and "different flow limits" not in text
    set_queue_limits("mail", rate_limit=4, actor="bob")
    _, done = confirmed(
        client,
        "queuestat",
        "limit_queues",
        ["default", "mail"],
        global_concurrency="5",
        rate_limit="20",
        rate_burst="4",
    )
    assert done.status_code == 302
    assert messages_of(done) == [
        "Set flow limits: default flow limits set: limit 5, rate 20/s burst 4, operator; "
        "mail flow limits set: limit 5, rate 20/s burst 4, operator"
    ]
    by = "admin (u0)"
    assert rows() == [
        ("default", 5, 20.0, 4, "operator", by),
        ("mail", 5, 20.0, 4, "operator", by),
    ]
    assert list(
        LogEntry.objects.order_by("object_id").values_list("object_id", "change_message")
    ) == [
        ("default", "flow limits set: limit 5, rate 20/s burst 4, operator"),
        ("mail", "flow limits set: limit 5, rate 20/s burst 4, operator"),
    ]
    with override_settings(AWA={**settings.AWA, "QUEUES": MAIL_SETTINGS}):
        _, done = confirmed(client, "queuestat", "limit_queues", ["default", "mail"], clear="on")
    assert messages_of(done) == [
        "Set flow limits: default flow limits cleared: no limits; "
        "mail flow limits cleared: limit 3, rate 20/s burst 2, settings"
    ]
    assert rows() == [("mail", 3, 20.0, None, "settings", by)]
    assert LogEntry.objects.count() == 4


BAD_FORMS: list[tuple[dict[str, str], str]] = [
    ({"rate_limit": "nan"}, "Enter a number."),
    ({"rate_limit": "inf"}, "Enter a number."),
    ({"rate_limit": "0"}, "rate_limit: 0.0 is not a number of jobs per second from 0.001"),
    ({"rate_limit": "-1"}, "rate_limit: -1.0 is not"),
    ({"rate_limit": "1e300"}, "rate_limit: 1e+300 is not"),
    ({"rate_limit": "x"}, "Enter a number."),
    ({"global_concurrency": "0"}, "Ensure this value is greater than or equal to 1."),
    ({"global_concurrency": "10001"}, "less than or equal to 10000."),
    ({"global_concurrency": "1.5"}, "Enter a whole number."),
    ({"global_concurrency": "9" * 5000}, "Enter a whole number."),
    ({"rate_burst": "3"}, "rate_burst: a burst needs a rate_limit"),
    ({"rate_limit": "3", "rate_burst": "0"}, "greater than or equal to 1."),
    ({"global_concurrency": ""}, "limits: give a global_concurrency, a rate_limit, or both"),
]


@pytest.mark.parametrize(("form", "message"), BAD_FORMS, ids=[repr(f)[:40] for f, _ in BAD_FORMS])
def test_a_bad_form_value_is_shown_on_the_page_and_changes_nothing(
    form: dict[str, str], message: str
) -> None:
    testjobs.noop.enqueue()
    set_queue_limits("default", global_concurrency=2, actor="before")
    _, again = confirmed(staff("manage_queue"), "queuestat", "limit_queues", ["default"], **form)
    assert again.status_code == 200  # the confirmation page again, with the error
    text = again.content.decode()
    assert message.replace("'", "&#x27;") in text and 'class="errorlist' in text
    assert rows() == [("default", 2, None, None, "operator", "before")]
    assert not LogEntry.objects.exists()


def test_staff_without_manage_queue_can_neither_see_nor_forge_the_action() -> None:
    testjobs.noop.enqueue()
    client = staff()
    page = client.get(changelist("queuestat")).content.decode()
    assert "limit_queues" not in page and ">Global limit<" in page
    forged = {
        "confirm": "yes",
        "select_across": "1",
        "awa_selected": "default",
        "global_concurrency": "1",
    }
    response = post_action(client, "queuestat", "limit_queues", ["default"], **forged)
    assert response.status_code == 403
    assert rows() == [] and not LogEntry.objects.exists()
    # Another permission is not enough either.
    other = staff("retry_dlq", "cancel_job")
    assert post_action(other, "queuestat", "limit_queues", ["default"], **forged).status_code == 403
    assert rows() == [] and not LogEntry.objects.exists()
