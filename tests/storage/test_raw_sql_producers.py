"""The raw-SQL producer functions (awa.enqueue_v1, awa.enqueue_one_v1) and awa.cancel_v1 called
directly, as docs/jobs.md ("Raw SQL producers") shows: what they store for the worker, and the
input they refuse (SQLSTATE 22023, the message naming the job and field, nothing written).

Every test runs in a rolled-back transaction; refusals run in a savepoint so the test can look at
what was (not) written. ``drain()`` runs the stored jobs through the worker's own decoding.
"""

from __future__ import annotations

import json
import math
from typing import Any

import psycopg
import pytest
from django.db import DataError, connection, transaction

import awa_django
from awa_django.testing import drain
from tests.jobs import common as testjobs
from tests.support.awa_schema import count_jobs

pytestmark = pytest.mark.django_db  # a TestCase-style transaction, never committed

NOOP = "tests.jobs.common.noop"
NO_ARGUMENTS = {"args": [], "kwargs": {}}
SHAPE = 'args: must be {"args": [...], "kwargs": {...}}'


def enqueue_raw(jobs: list[dict[str, Any]] | str) -> list[tuple[int, str]]:
    """awa.enqueue_v1 with a JSON array (a list is encoded; a string is sent as it is)."""
    text = jobs if isinstance(jobs, str) else json.dumps(jobs)
    with connection.cursor() as cursor:
        cursor.execute("SELECT job_id, state FROM awa.enqueue_v1(%s::jsonb)", [text])
        return [(row[0], row[1]) for row in cursor.fetchall()]


def stored(job_id: int) -> dict[str, Any]:
    """The awa.jobs row of one job, with args decoded from its text as the worker decodes it."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT state, queue, priority, max_attempts, args::text, metadata::text, tags "
            "FROM awa.jobs WHERE id = %s",
            [job_id],
        )
        row = cursor.fetchone()
    assert row is not None
    state, queue, priority, max_attempts, args, metadata, tags = row
    return {
        "state": state,
        "queue": queue,
        "priority": priority,
        "max_attempts": max_attempts,
        "args": json.loads(args),
        "metadata": None if metadata is None else json.loads(metadata),
        "tags": tags,
    }


def refused(sql: str, params: list[Any]) -> psycopg.Error:
    """Run ``sql`` in a savepoint, expect it to fail, check that nothing was written, and return
    the driver's error (its ``sqlstate`` and ``diag.message_primary``)."""
    before = count_jobs()
    with pytest.raises(DataError) as info, transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(sql, params)
    assert count_jobs() == before
    error = info.value.__cause__
    assert isinstance(error, psycopg.Error)
    return error


def refused_batch(bad_job: str) -> psycopg.Error:
    """awa.enqueue_v1 with a valid job 0 and ``bad_job`` (JSON text) as job 1."""
    return refused(
        "SELECT * FROM awa.enqueue_v1(%s::jsonb)", [f'[{{"kind": "{NOOP}"}}, {bad_job}]']
    )


# What is stored: the worker's argument shape, the documented defaults ------------------------


def test_raw_sql_job_without_args_runs_with_no_arguments() -> None:
    [(job_id, state)] = enqueue_raw([{"kind": NOOP}])
    assert state == "available"
    assert stored(job_id)["args"] == NO_ARGUMENTS
    [run] = drain()
    assert (run.id, run.outcome, run.error) == (job_id, "completed", None)


def test_raw_sql_job_with_null_args_runs_with_no_arguments() -> None:
    [(job_id, _)] = enqueue_raw([{"kind": NOOP, "args": None}])
    assert stored(job_id)["args"] == NO_ARGUMENTS
    [run] = drain()
    assert (run.id, run.outcome) == (job_id, "completed")


def test_documented_delayed_example_stores_arguments_the_worker_decodes() -> None:
    [(job_id, state)] = enqueue_raw('[{"kind": "tests.jobs.common.noop", "delay": 60}]')
    assert state == "scheduled"
    row = stored(job_id)
    assert (row["state"], row["args"]) == ("scheduled", NO_ARGUMENTS)


def test_documented_enqueue_one_example_runs_the_handler_with_its_arguments() -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT * FROM awa.enqueue_one_v1('tests.jobs.common.send_email', 'emails', 10, "
            '\'{"args": ["a@example.com"], "kwargs": {"subject": "hi"}}\', 5)'
        )
        [(job_id, state)] = cursor.fetchall()
    assert state == "available"
    [run] = drain("emails")
    assert (run.id, run.outcome, run.result) == (job_id, "completed", "sent hi to a@example.com")


def test_raw_sql_job_gets_the_documented_defaults_not_the_decorators_options() -> None:
    # send_email is declared with queue="emails", priority=5, max_attempts=3, tags=["mail"]:
    # SQL knows none of that.
    [(job_id, _)] = enqueue_raw([{"kind": "tests.jobs.common.send_email"}])
    row = stored(job_id)
    assert (row["queue"], row["priority"], row["max_attempts"], row["tags"]) == (
        "default",
        0,
        25,
        None,
    )


def test_raw_sql_json_null_means_not_given_for_every_optional_field() -> None:
    optional = ["queue", "priority", "args", "max_attempts", "run_at", "delay", "deadline"]
    optional += ["metadata", "tags"]
    [(job_id, state)] = enqueue_raw([{"kind": NOOP, **dict.fromkeys(optional)}])
    assert state == "available"
    row = stored(job_id)
    assert (row["queue"], row["priority"], row["max_attempts"]) == ("default", 0, 25)
    assert (row["args"], row["metadata"], row["tags"]) == (NO_ARGUMENTS, None, None)


def test_raw_sql_args_may_carry_extra_keys_such_as_the_tasks_backends_task() -> None:
    args = {"args": [1], "kwargs": {"a": 2}, "task": {"backend": "default"}}
    [(job_id, _)] = enqueue_raw([{"kind": NOOP, "args": args}])
    assert stored(job_id)["args"] == args


def test_raw_sql_integer_fields_take_any_json_number_whose_text_is_an_integer() -> None:
    # jsonb keeps 1e2 as 100 and 5E0 as 5 (integers); 100.0 keeps its fraction and is refused.
    [(job_id, _)] = enqueue_raw('[{"kind": "k", "priority": 1e2, "max_attempts": 5E0}]')
    row = stored(job_id)
    assert (row["priority"], row["max_attempts"]) == (100, 5)


def test_raw_sql_job_with_every_field_is_stored_as_given() -> None:
    job = {
        "kind": NOOP,
        "queue": "raw",
        "priority": -7,
        "args": {"args": [1, "x"], "kwargs": {"k": None}},
        "max_attempts": 3,
        "run_at": "2999-01-01T00:00:00+00:00",
        "deadline": 1.5,
        "metadata": {"team": "growth"},
        "tags": ["a", "b"],
    }
    [(job_id, state)] = enqueue_raw([job])
    assert state == "scheduled"
    row = stored(job_id)
    assert row == {
        "state": "scheduled",
        "queue": "raw",
        "priority": -7,
        "max_attempts": 3,
        "args": job["args"],
        "metadata": {"team": "growth"},
        "tags": ["a", "b"],
    }


# What is refused: 22023, 'job N: field: ...', nothing written ----------------------------------

ARGS_OF_ANOTHER_SHAPE = [
    pytest.param("[1]", id="a-list"),
    pytest.param("{}", id="an-empty-object"),
    pytest.param('{"args": [1]}', id="no-kwargs"),
    pytest.param('{"kwargs": {}}', id="no-args"),
    pytest.param('{"args": {}, "kwargs": {}}', id="args-an-object"),
    pytest.param('{"args": [], "kwargs": []}', id="kwargs-a-list"),
    pytest.param('{"args": null, "kwargs": {}}', id="args-null-inside"),
    pytest.param('"abc"', id="a-string"),
    pytest.param("5", id="a-number"),
]


@pytest.mark.parametrize("args", ARGS_OF_ANOTHER_SHAPE)
def test_raw_sql_args_of_another_shape_are_refused(args: str) -> None:
    error = refused_batch(f'{{"kind": "{NOOP}", "args": {args}}}')
    assert error.sqlstate == "22023"
    assert error.diag.message_primary == f"job 1: {SHAPE}"


@pytest.mark.parametrize("args", [*ARGS_OF_ANOTHER_SHAPE, pytest.param(None, id="sql-null")])
def test_enqueue_one_v1_refuses_args_of_another_shape(args: str | None) -> None:
    error = refused(
        "SELECT * FROM awa.enqueue_one_v1(%s, 'default', 0, %s::jsonb, 1)", [NOOP, args]
    )
    assert error.sqlstate == "22023"
    assert error.diag.message_primary == SHAPE


WRONG_JSON_TYPES = [
    # (the bad job, the message after 'job 1: ')
    ('"priority": "5"', 'priority: must be an integer, not "5"'),
    ('"priority": true', "priority: must be an integer, not true"),
    ('"priority": 100.0', "priority: must be an integer, not 100.0"),
    ('"priority": 5.5', "priority: must be an integer, not 5.5"),
    ('"priority": [1]', "priority: must be an integer, not [1]"),
    ('"priority": 9223372036854775808', "priority: 9223372036854775808 is outside -100..100"),
    (
        '"priority": 1e400',
        "priority: 1000000000000000000000000000000000000... is outside -100..100",
    ),
    ('"priority": 101', "priority: 101 is outside -100..100"),
    ('"max_attempts": "5"', 'max_attempts: must be an integer, not "5"'),
    ('"max_attempts": 5.0', "max_attempts: must be an integer, not 5.0"),
    ('"max_attempts": false', "max_attempts: must be an integer, not false"),
    ('"max_attempts": 9223372036854775808', "max_attempts: 9223372036854775808 is outside 1..1000"),
    ('"max_attempts": 0', "max_attempts: 0 is outside 1..1000"),
    ('"queue": 5', "queue: must be a string, not 5"),
    ('"queue": ["q"]', 'queue: must be a string, not ["q"]'),
    ('"run_at": 5', "run_at: must be a string (a timestamp), not 5"),
    ('"delay": "60"', 'delay: must be a number of seconds, not "60"'),
    ('"delay": true', "delay: must be a number of seconds, not true"),
    ('"delay": 1e400', "delay: must be a number of seconds within 100 years (3155760000)"),
    ('"deadline": "60"', 'deadline: must be a number of seconds, not "60"'),
    (
        '"deadline": 1e400',
        "deadline: must be a positive number of seconds, at most 3155760000 (100 years)",
    ),
    (
        '"deadline": 0',
        "deadline: must be a positive number of seconds, at most 3155760000 (100 years)",
    ),
    ('"metadata": [1]', "metadata: must be a JSON object, not [1]"),
    ('"metadata": "x"', 'metadata: must be a JSON object, not "x"'),
    ('"tags": "abc"', 'tags: must be an array of strings, not "abc"'),
    ('"tags": {"a": 1}', 'tags: must be an array of strings, not {"a": 1}'),
    ('"tags": [["a", "b"]]', "tags: must be an array of strings"),
    ('"tags": ["a", null]', "tags: must be an array of strings"),
    ('"tags": ["a", 5]', "tags: must be an array of strings"),
    (
        '"prioritty": 5',
        "prioritty: unknown key (the keys are kind, queue, priority, args, max_attempts, "
        "run_at, delay, deadline, metadata, tags)",
    ),
]


@pytest.mark.parametrize(
    ("field", "message"), WRONG_JSON_TYPES, ids=[f for f, _ in WRONG_JSON_TYPES]
)
def test_raw_sql_field_of_the_wrong_json_type_is_refused_naming_job_and_field(
    field: str, message: str
) -> None:
    error = refused_batch(f'{{"kind": "{NOOP}", {field}}}')
    assert error.sqlstate == "22023"
    assert error.diag.message_primary == f"job 1: {message}"


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("5", "kind: must be a string, not 5"),
        ("null", "kind: must be a non-empty string of at most 255 characters"),
        ('""', "kind: must be a non-empty string of at most 255 characters"),
    ],
)
def test_raw_sql_kind_must_be_a_non_empty_string(kind: str, message: str) -> None:
    error = refused_batch(f'{{"kind": {kind}}}')
    assert (error.sqlstate, error.diag.message_primary) == ("22023", f"job 1: {message}")


def test_raw_sql_job_without_kind_is_refused() -> None:
    error = refused_batch('{"queue": "default"}')
    assert error.sqlstate == "22023"
    assert error.diag.message_primary == (
        "job 1: kind: must be a non-empty string of at most 255 characters"
    )


@pytest.mark.parametrize(
    ("run_at", "message"),
    [
        ("xyz", 'run_at: invalid input syntax for type timestamp with time zone: "xyz"'),
        ("2020-02-30", 'run_at: date/time field value out of range: "2020-02-30"'),
        ("infinity", "run_at: must be a finite point in time"),
    ],
)
def test_raw_sql_run_at_that_is_not_a_timestamp_is_refused_naming_job_and_field(
    run_at: str, message: str
) -> None:
    error = refused_batch(json.dumps({"kind": NOOP, "run_at": run_at}))
    assert (error.sqlstate, error.diag.message_primary) == ("22023", f"job 1: {message}")


def test_raw_sql_number_too_small_for_double_precision_is_refused_naming_job_and_field() -> None:
    error = refused_batch(f'{{"kind": "{NOOP}", "delay": 1e-400}}')
    assert error.sqlstate == "22023"
    assert error.diag.message_primary == (
        'job 1: delay: "0.00000000000000000000000000000000000..." '
        "is out of range for type double precision"
    )


def test_raw_sql_batch_reports_its_first_bad_job_whatever_the_kind_of_error() -> None:
    # Job 1 is a conversion error (found on the error path), job 0 a plain rule: job 0 wins.
    bad_run_at = {"kind": NOOP, "run_at": "xyz"}
    error = refused(
        "SELECT * FROM awa.enqueue_v1(%s::jsonb)",
        [json.dumps([{"kind": NOOP, "priority": 500}, bad_run_at])],
    )
    assert error.diag.message_primary == "job 0: priority: 500 is outside -100..100"
    error = refused(
        "SELECT * FROM awa.enqueue_v1(%s::jsonb)",
        [json.dumps([{"kind": NOOP}, bad_run_at, {"kind": NOOP, "prioritty": 1}])],
    )
    assert error.diag.message_primary.startswith("job 1: run_at: invalid input syntax")
    # A job with both a wrong JSON type and a value that cannot be converted: the type is named.
    error = refused_batch(f'{{"kind": "{NOOP}", "priority": true, "run_at": "xyz"}}')
    assert error.diag.message_primary == "job 1: priority: must be an integer, not true"


@pytest.mark.parametrize(
    ("throws_at", "rule_at", "named"),
    [(0, None, 0), (99, None, 99), (73, 80, 73), (73, 40, 40), (73, 72, 72), (50, 0, 0)],
)
def test_raw_sql_large_batch_names_its_first_bad_job_wherever_it_is(
    throws_at: int, rule_at: int | None, named: int
) -> None:
    # A value that cannot be converted (run_at) sends enqueue_v1 to its error path, which must
    # still name the first bad job of the batch, be it that one or an earlier plain error.
    jobs: list[dict[str, Any]] = [
        {"kind": NOOP, "args": {"args": [i], "kwargs": {}}} for i in range(100)
    ]
    jobs[throws_at] = {"kind": NOOP, "run_at": "xyz"}
    if rule_at is not None:
        jobs[rule_at] = {"kind": NOOP, "queue": "Bad Queue"}
    error = refused("SELECT * FROM awa.enqueue_v1(%s::jsonb)", [json.dumps(jobs)])
    assert error.sqlstate == "22023"
    field = "run_at" if named == throws_at else "queue"
    assert error.diag.message_primary.startswith(f"job {named}: {field}: ")


def test_raw_sql_refusal_leaves_the_callers_transaction_usable() -> None:
    refused_batch(f'{{"kind": "{NOOP}", "priority": "5"}}')
    [(job_id, _)] = enqueue_raw([{"kind": NOOP}])
    [run] = drain()
    assert (run.id, run.outcome) == (job_id, "completed")


# cancel_v1: the bounds of awa_django.cancel -----------------------------------------------------


def test_cancel_v1_refuses_a_null_reason() -> None:
    [(job_id, _)] = enqueue_raw([{"kind": NOOP}])
    error = refused("SELECT awa.cancel_v1(%s, NULL)", [job_id])
    assert (error.sqlstate, error.diag.message_primary) == (
        "22023",
        "reason: must be text, not NULL",
    )
    assert stored(job_id)["state"] == "available"


def test_cancel_v1_refuses_a_reason_over_10000_characters() -> None:
    [(job_id, _)] = enqueue_raw([{"kind": NOOP}])
    error = refused("SELECT awa.cancel_v1(%s, %s)", [job_id, "x" * 20_000])
    assert (error.sqlstate, error.diag.message_primary) == (
        "22023",
        "reason: 20000 characters exceeds the limit of 10000",
    )
    assert stored(job_id)["state"] == "available"


def test_cancel_with_the_longest_reason_python_accepts_still_works() -> None:
    first, second = (awa_django.enqueue(NOOP) for _ in range(2))
    assert awa_django.cancel(first.id, reason="x" * 10_000) == "available"
    with connection.cursor() as cursor:
        cursor.execute("SELECT awa.cancel_v1(%s)", [second.id])  # the SQL default reason
        assert cursor.fetchone() == ("available",)
        cursor.execute(
            "SELECT id, errors -> -1 ->> 'message' FROM awa.jobs WHERE id IN (%s, %s) ORDER BY id",
            [first.id, second.id],
        )
        assert cursor.fetchall() == [(first.id, "x" * 10_000), (second.id, "cancelled")]


# Numbers in stored JSON (docs/jobs.md) ---------------------------------------------------------


def test_floats_with_an_exponent_come_back_as_int_and_negative_zero_as_zero() -> None:
    values = [1e16, 2.0e300, 1.5e20, 2.0, 1e15, -0.0, 0.5, 1.5e-7, -3.0]
    job = testjobs.renamed.enqueue(values)  # returns its argument
    [run] = drain("other")
    assert run.id == job.id
    assert run.result == [10**16, 2 * 10**300, 15 * 10**19, 2.0, 1e15, 0.0, 0.5, 1.5e-7, -3.0]
    assert [type(v) for v in run.result] == [int, int, int] + [float] * 6
    assert [float(v) for v in run.result] == values  # float() gives back the original value
    assert math.copysign(1.0, run.result[5]) == 1.0  # -0.0 is stored as 0.0


# run_at past year 9999, nested tags, a missing priority, producer limits -----------------------


@pytest.mark.parametrize(
    "run_at", ["9999-12-31T23:59:59-01:00", "10000-01-01T00:00:00Z", "294276-12-31"]
)
def test_a_run_at_after_year_9999_in_utc_is_refused_by_both_producers(run_at: str) -> None:
    error = refused_batch(json.dumps({"kind": NOOP, "run_at": run_at}))
    assert error.sqlstate == "22023"
    assert error.diag.message_primary == "job 1: run_at: must be before the year 10000 (UTC)"
    error = refused(
        "SELECT * FROM awa.enqueue_one_v1(%s, 'default', 0, %s::jsonb, 1, %s::timestamptz)",
        [NOOP, '{"args": [], "kwargs": {}}', run_at],
    )
    assert error.diag.message_primary == "run_at: must be before the year 10000 (UTC)"


def test_enqueue_one_v1_refuses_nested_tags_and_names_a_missing_priority() -> None:
    one = "SELECT * FROM awa.enqueue_one_v1(%s, 'default', %s, '{\"args\": [], \"kwargs\": {}}', %s"
    error = refused(one + ", NULL, NULL, NULL, NULL, ARRAY[['a','b'],['c','d']])", [NOOP, 0, 1])
    assert error.diag.message_primary.startswith("tags: every tag must be")
    error = refused(one + ")", [NOOP, None, 1])
    assert error.diag.message_primary == "priority: NULL is outside -100..100"
    error = refused(one + ")", [NOOP, 0, None])
    assert error.diag.message_primary == "max_attempts: NULL is outside 1..1000"


@pytest.mark.parametrize(
    ("limits", "message"),
    [
        ("[]", "limits: must be a JSON object"),
        ('{"bogus": 1}', "limits: unknown key 'bogus' (known: args_max_bytes, "),
        ('{"json_max_depth": -5}', "limits: json_max_depth: -5 is not an integer from 1 to 256"),
        ('{"json_max_depth": 2147483647}', "limits: json_max_depth: 2147483647 is not an"),
        ('{"args_max_bytes": 1.5}', "limits: args_max_bytes: 1.5 is not an integer from 1 to"),
        ('{"args_max_bytes": true}', "limits: args_max_bytes: true is not an integer"),
        ('{"args_max_bytes": "10"}', 'limits: args_max_bytes: "10" is not an integer'),
        ('{"args_max_bytes": 1e20}', "limits: args_max_bytes: 100000000000000000000 is not"),
        ('{"max_tags": -1}', "limits: max_tags: -1 is not an integer from 0 to 2147483647"),
    ],
)
def test_producer_limits_are_checked_like_job_fields(limits: str, message: str) -> None:
    for sql, params in (
        ("SELECT * FROM awa.enqueue_v1(%s::jsonb, %s::jsonb)", [f'[{{"kind": "{NOOP}"}}]']),
        (
            "SELECT * FROM awa.enqueue_one_v1(%s, 'default', 0, '{\"args\": [], \"kwargs\": {}}',"
            " 1, NULL, NULL, NULL, NULL, NULL, %s::jsonb)",
            [NOOP],
        ),
    ):
        error = refused(sql, [*params, limits])
        assert error.sqlstate == "22023"
        assert error.diag.message_primary.startswith(message), error.diag.message_primary
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM awa.enqueue_v1(%s::jsonb, %s::jsonb)",
            [f'[{{"kind": "{NOOP}"}}]', '{"max_tags": 0, "json_max_depth": 256}'],
        )
        assert cursor.fetchone() == (1,)


# awa.enqueue_one_v2: the same rules and messages as v1, integer limits ------------------------

_V1 = (
    "SELECT job_id, state FROM awa.enqueue_one_v1(%s, %s, %s, %s::jsonb, %s, %s::timestamptz, "
    "%s::float8, %s::float8, %s::jsonb, %s::text[])"
)
_V2 = (
    "SELECT job_id, state FROM awa.enqueue_one_v2(%s, %s, %s, %s::jsonb, %s, %s::timestamptz, "
    "%s::float8, %s::float8, %s::jsonb, %s::text[])"
)
_DEEP = "[" * 40 + "]" * 40
_GOOD = [NOOP, "default", 0, json.dumps(NO_ARGUMENTS), 1, None, None, None, None, None]

# Each case changes some of the ten arguments of _GOOD: (index, value) pairs.
V2_CASES: list[tuple[str, list[tuple[int, Any]]]] = [
    ("plain", []),
    ("kind-empty", [(0, "")]),
    ("kind-null", [(0, None)]),
    ("kind-long", [(0, "k" * 256)]),
    ("queue-bad", [(1, "Bad Queue")]),
    ("queue-null", [(1, None)]),
    ("priority-high", [(2, 101)]),
    ("priority-null", [(2, None)]),
    ("attempts-zero", [(4, 0)]),
    ("attempts-null", [(4, None)]),
    ("args-null", [(3, None)]),
    ("args-array", [(3, "[]")]),
    ("args-no-kwargs", [(3, '{"args": []}')]),
    ("args-deep", [(3, '{"args": ' + _DEEP + ', "kwargs": {}}')]),
    ("args-deep-and-bad-shape", [(3, '{"args": ' + _DEEP + "}")]),
    ("args-big", [(3, json.dumps({"args": ["x" * 1_100_000], "kwargs": {}}))]),
    ("deadline-zero", [(7, 0)]),
    ("deadline-nan", [(7, "NaN")]),
    ("deadline-ok", [(7, 30)]),
    ("metadata-ok", [(8, '{"a": 1}')]),
    ("metadata-array", [(8, "[]")]),
    ("metadata-deep", [(8, '{"a": ' + _DEEP + "}")]),
    ("tags-ok", [(9, ["a", "b"])]),
    ("tags-empty-tag", [(9, [""])]),
    ("tags-null-tag", [(9, [None])]),
    ("tags-too-many", [(9, ["t"] * 21)]),
    ("run-at-future", [(5, "2999-01-01T00:00:00Z")]),
    ("run-at-past", [(5, "2000-01-01T00:00:00Z")]),
    ("run-at-infinity", [(5, "infinity")]),
    ("delay", [(6, 60)]),
    ("delay-negative", [(6, -60)]),
    ("delay-nan", [(6, "NaN")]),
    ("delay-huge", [(6, 1e300)]),
    ("several-errors", [(1, "Bad"), (4, 0), (9, [""])]),
]


def _outcome(sql: str, params: list[Any]) -> tuple[str, str]:
    """('ok', state) or ('refused', message) of one enqueue, nothing kept when refused."""
    before = count_jobs()
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(sql, params)
            row = cursor.fetchone()
    except DataError as exc:
        assert count_jobs() == before
        error = exc.__cause__
        assert isinstance(error, psycopg.Error) and error.sqlstate == "22023"
        return ("refused", str(error.diag.message_primary))
    assert row is not None
    return ("ok", row[1])


@pytest.mark.parametrize(("case", "changes"), V2_CASES, ids=[c for c, _ in V2_CASES])
def test_enqueue_one_v2_accepts_and_refuses_what_v1_does(
    case: str, changes: list[tuple[int, Any]]
) -> None:
    params = list(_GOOD)
    for index, value in changes:
        params[index] = value
    v1 = _outcome(_V1, params)
    v2 = _outcome(_V2, params)
    assert v2 == v1
    if case == "plain":
        assert v2 == ("ok", "available")


@pytest.mark.parametrize(
    ("position", "value", "message"),
    [
        (0, 0, "limits: args_max_bytes: 0 is not an integer from 1 to 2147483647"),
        (1, None, "limits: metadata_max_bytes: NULL is not an integer from 1 to 2147483647"),
        (2, 257, "limits: json_max_depth: 257 is not an integer from 1 to 256"),
        (2, 0, "limits: json_max_depth: 0 is not an integer from 1 to 256"),
        (3, -1, "limits: max_tags: -1 is not an integer from 0 to 2147483647"),
        (4, 0, "limits: tag_max_length: 0 is not an integer from 1 to 2147483647"),
    ],
)
def test_enqueue_one_v2_checks_its_integer_limits(position: int, value: Any, message: str) -> None:
    limits: list[Any] = [1048576, 65536, 32, 20, 100]
    limits[position] = value
    error = refused(_V2[:-1] + ", %s, %s, %s, %s, %s)", [*_GOOD, *limits])
    assert error.sqlstate == "22023"
    assert error.diag.message_primary == message


def test_enqueue_one_v2_applies_the_limits_it_is_given() -> None:
    named = (
        "SELECT state FROM awa.enqueue_one_v2(%s, 'default', 0, %s::jsonb, 1, "
        "p_tags => %s::text[], p_max_tags => %s, p_args_max_bytes => %s)"
    )
    args = json.dumps({"args": ["x" * 100], "kwargs": {}})
    error = refused(named, [NOOP, args, ["a", "b"], 1, 1_000_000])
    assert error.diag.message_primary == "tags: 2 tags exceeds the limit of 1"
    error = refused(named, [NOOP, args, None, 20, 50])
    assert error.diag.message_primary.startswith("args: ")
    assert error.diag.message_primary.endswith("bytes exceeds the limit of 50 bytes")


def test_enqueue_one_v2_keeps_one_lane_per_transaction_in_order() -> None:
    """Several jobs of one transaction share its lane (FIFO), whichever function wrote them,
    and a queue without lanes gets them."""
    ids = []
    with connection.cursor() as cursor:
        for sql in (_V2, _V1, _V2, _V2):
            params = list(_GOOD)
            params[1] = "fresh-v2-queue"
            cursor.execute(sql, params)
            row = cursor.fetchone()
            assert row is not None
            ids.append(row[0])
        cursor.execute(
            "SELECT lane_id, lane_seq FROM awa.ready_entries WHERE job_id = ANY(%s) "
            "ORDER BY job_id",
            [ids],
        )
        rows = cursor.fetchall()
    assert len({lane for lane, _ in rows}) == 1
    seqs = [seq for _, seq in rows]
    assert seqs == sorted(seqs) and len(set(seqs)) == 4
    runs = drain(queues=["fresh-v2-queue"])
    assert sorted(run.id for run in runs) == sorted(ids)
