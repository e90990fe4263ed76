"""RetryPolicy: its checks, how it is stored with the job, the reserved ``awa:`` metadata keys,
and the worker's rule for which exceptions retry (no database for most of them)."""

from __future__ import annotations

import json
import math
from datetime import timedelta
from typing import Any

import psycopg
import pytest

import awa_django
from awa_django import InvalidOptionError, JobValidationError, RetryPolicy, TerminalError
from awa_django.retry import RETRY_KEY, fails_at_once
from tests.jobs import common as testjobs
from tests.support.database import pg


@pytest.mark.parametrize(
    "kwargs",
    [
        {"base": math.nan},
        {"base": math.inf},
        {"base": -1},
        {"base": 1e300},
        {"base": 86_400.5},
        {"base": True},
        {"base": "5"},
        {"base": timedelta.max},
        {"base": timedelta(days=2)},
        {"cap": -math.inf},
        {"cap": None},
        {"cap": 10**400},
        {"jitter": math.nan},
        {"jitter": 1.01},
        {"jitter": -0.1},
        {"jitter": False},
        {"max_age": 0},
        {"max_age": -5},
        {"max_age": math.inf},
        {"max_age": timedelta.max},
        {"max_age": 1e300},
        {"max_age": "1 day"},
        {"retry_on": "ValueError"},
        {"retry_on": [ValueError, "KeyError"]},
        {"retry_on": [int]},
        {"retry_on": 5},
        {"fail_on": {ValueError: 1}},
        {"fail_on": [type(f"E{i}", (Exception,), {}) for i in range(33)]},
        {"fail_on": [type("E" * 300, (Exception,), {})]},
    ],
    ids=repr,
)
def test_bad_policies_are_refused_when_built(kwargs: dict[str, Any]) -> None:
    with pytest.raises(InvalidOptionError, match=r"^retry: ") as caught:
        RetryPolicy(**kwargs)
    assert isinstance(caught.value, JobValidationError)
    field = next(iter(kwargs))
    assert f"{field}:" in str(caught.value)


def test_bad_backoff_is_refused() -> None:
    for shape in ("fibonacci", None, 2, "Exponential"):
        with pytest.raises(InvalidOptionError, match="backoff"):
            RetryPolicy(shape)  # type: ignore[arg-type]


def test_a_policy_is_normalised_and_stored_as_numbers_and_names() -> None:
    policy = RetryPolicy(
        "linear",
        base=timedelta(seconds=5),
        cap=60,
        jitter=0,
        max_age=timedelta(hours=1),
        retry_on=KeyError,
        fail_on=[testjobs.Permanent],
    )
    assert (policy.base, policy.cap, policy.jitter, policy.max_age) == (5.0, 60.0, 0.0, 3600.0)
    assert policy.retry_on == (KeyError,)
    assert policy.to_value() == {
        "backoff": "linear",
        "base": 5.0,
        "cap": 60.0,
        "jitter": 0.0,
        "max_age": 3600.0,
        "retry_on": ["builtins.KeyError"],
        "fail_on": ["tests.jobs.common.Permanent"],
    }
    assert RetryPolicy().to_value() == {"backoff": "exponential", "cap": 86400.0, "jitter": 0.25}
    assert RetryPolicy(base=0, cap=0).to_value()["base"] == 0.0  # bounds are inclusive
    assert hash(policy) == hash(
        RetryPolicy(
            "linear",
            base=5,
            cap=60,
            jitter=0,
            max_age=3600,
            retry_on=[KeyError],
            fail_on=testjobs.Permanent,
        )
    )


def test_from_option_takes_a_policy_a_mapping_or_none() -> None:
    assert RetryPolicy.from_option(None) is None
    policy = RetryPolicy("constant", base=2)
    assert RetryPolicy.from_option(policy) is policy
    assert RetryPolicy.from_option({"backoff": "constant", "base": 2}) == policy
    with pytest.raises(InvalidOptionError, match="unknown RetryPolicy field"):
        RetryPolicy.from_option({"bsae": 2})
    with pytest.raises(InvalidOptionError, match="not a RetryPolicy"):
        RetryPolicy.from_option("exponential")


def test_which_exceptions_fail_at_once() -> None:
    def meta(**policy: Any) -> dict[str, Any]:
        return {RETRY_KEY: RetryPolicy(**policy).to_value()}

    picky = meta(retry_on=[testjobs.Transient, LookupError], fail_on=testjobs.Permanent)
    assert not fails_at_once(picky, testjobs.Transient("x"))
    assert not fails_at_once(picky, KeyError("a subclass of LookupError"))
    assert fails_at_once(picky, testjobs.Permanent("in fail_on, though also a Transient"))
    assert fails_at_once(picky, ValueError("not in retry_on"))
    assert fails_at_once(picky, SystemExit(1))
    assert fails_at_once(meta(), TerminalError("always"))
    assert fails_at_once(None, TerminalError("always"))
    assert not fails_at_once(meta(), ValueError("no lists: every exception retries"))
    assert not fails_at_once({}, ValueError("no policy"))
    assert fails_at_once(meta(fail_on=OSError), ConnectionError("an OSError"))
    assert not fails_at_once(meta(fail_on=OSError), ValueError("not an OSError"))
    # Whatever a row holds, the rule never raises.
    for garbage in ("x", {RETRY_KEY: "x"}, {RETRY_KEY: {"retry_on": "x"}}, [1]):
        assert fails_at_once(garbage, ValueError()) in (True, False)


# Stored with the job ------------------------------------------------------------------------------


def stored_metadata(job_id: int) -> Any:
    with pg() as conn:
        row = conn.execute("SELECT metadata FROM awa.jobs WHERE id = %s", [job_id]).fetchone()
    assert row is not None
    return row[0]


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("clean_awa")
def test_the_policy_is_stored_in_the_job_s_metadata_by_every_producer() -> None:
    decorated = testjobs.picky.enqueue("value", 0)
    assert stored_metadata(decorated.id)[RETRY_KEY]["retry_on"] == [
        "tests.jobs.common.Transient",
        "builtins.LookupError",
    ]
    per_call = RetryPolicy("constant", base=9)
    job = testjobs.always_fails.using(retry=per_call, metadata={"team": "a"}).enqueue()
    assert stored_metadata(job.id) == {"team": "a", RETRY_KEY: per_call.to_value()}
    by_name = awa_django.enqueue("tests.jobs.common.always_fails", retry=per_call)
    assert stored_metadata(by_name.id) == {RETRY_KEY: per_call.to_value()}
    later = testjobs.always_fails.using(retry=per_call, run_after=timedelta(hours=1)).enqueue()
    assert later.state == "scheduled" and stored_metadata(later.id)[RETRY_KEY]["base"] == 9
    many = awa_django.enqueue_many(
        [testjobs.always_fails.using(retry=per_call).prepare() for _ in range(3)]
    )
    assert all(stored_metadata(h.id) == {RETRY_KEY: per_call.to_value()} for h in many)
    # .using(retry=None) drops the decorator's policy.
    plain = testjobs.picky.using(retry=None).enqueue("value", 0)
    assert stored_metadata(plain.id) is None


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("clean_awa")
def test_reserved_metadata_keys_and_bad_retry_options_are_refused_with_nothing_written() -> None:
    for metadata in ({"awa:retry": {"base": 1}}, {"awa:unique": 1}, {"ok": 1, "awa:": 2}):
        with pytest.raises(InvalidOptionError, match=r"^metadata: key .* is reserved"):
            testjobs.always_fails.using(metadata=metadata).enqueue()
        with pytest.raises(InvalidOptionError, match="reserved"):
            awa_django.enqueue("tests.jobs.common.always_fails", metadata=metadata)
    with pytest.raises(InvalidOptionError, match=r"^retry: "):
        testjobs.always_fails.using(retry={"base": 1}).enqueue()  # type: ignore[arg-type]
    with pytest.raises(InvalidOptionError, match=r"^retry: "):
        awa_django.job(retry="exponential", name="tests.never")(lambda: None)  # type: ignore[call-overload]
    # Keys that merely contain "awa:" are the user's.
    job = testjobs.always_fails.using(metadata={"x-awa:y": 1}).enqueue()
    assert stored_metadata(job.id) == {"x-awa:y": 1}
    with pg() as conn:
        row = conn.execute("SELECT count(*) FROM awa.jobs").fetchone()
    assert row == (1,)


@pytest.mark.django_db
def test_python_and_sql_agree_on_policies() -> None:
    good = [
        RetryPolicy(),
        RetryPolicy("linear", base=0, cap=0, jitter=1, max_age=1e-3),
        RetryPolicy("constant", base=86_400, cap=86_400, max_age=3_155_760_000),
        RetryPolicy(retry_on=[type(f"E{i}", (Exception,), {}) for i in range(32)]),
    ]
    with pg() as conn:
        for policy in good:
            row = conn.execute(
                "SELECT awa._retry_policy_error_v1(%s::jsonb)", [json.dumps(policy.to_value())]
            ).fetchone()
            assert row == (None,), policy
        # What Python refuses as a number, SQL refuses too (as JSON: NaN and inf cannot be).
        for field, value in [
            ("base", 86_400.001),
            ("cap", -0.001),
            ("jitter", 1.001),
            ("max_age", 3_155_760_000.5),
            ("base", 10**300),
        ]:
            with pytest.raises(InvalidOptionError):
                RetryPolicy(**{field: value})
            row = conn.execute(
                "SELECT awa._retry_policy_error_v1(%s::jsonb)", [json.dumps({field: value})]
            ).fetchone()
            assert row is not None and row[0].startswith(f"{field}: "), (field, value, row)
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="awa:retry: jitter"):
            conn.execute(
                "SELECT * FROM awa.enqueue_one_v2('k', 'q', 0, %s, 5, p_metadata => %s::jsonb)",
                ['{"args": [], "kwargs": {}}', '{"awa:retry": {"jitter": 2}}'],
            )


@pytest.mark.django_db
def test_the_tasks_backend_takes_a_retry_option_and_checks_it() -> None:
    from awa_django.backends.tasks import AwaTaskBackend
    from tests.jobs import tasks as tasks_for_tests

    backend = AwaTaskBackend(
        "x", {"QUEUES": [], "OPTIONS": {"retry": {"backoff": "constant", "base": 4}}}
    )
    assert backend._options(tasks_for_tests.add).retry == RetryPolicy("constant", base=4)
    assert not [m for m in backend.check() if m.id == "awa.E103"]
    # The task's own policy wins over the backend's.
    own = backend._options(tasks_for_tests.picky_task).retry
    assert own is not None and own.base == 900 and own.retry_on == (KeyError,)
    bad = AwaTaskBackend("y", {"QUEUES": [], "OPTIONS": {"retry": {"base": -1}}})
    problems = [m.msg for m in bad.check() if m.id == "awa.E103"]
    assert len(problems) == 1 and "OPTIONS['retry'] is invalid: retry: base:" in problems[0]


@pytest.mark.django_db
def test_drain_follows_the_job_s_policy() -> None:
    from awa_django.testing import drain

    outside = testjobs.picky.enqueue("value", 1).id
    inside = testjobs.picky.enqueue("transient", 1).id
    runs = {run.id: run.outcome for run in drain("retry")}
    assert runs == {outside: "fail", inside: "retry"}


def test_exception_names_survive_hostile_metaclasses_and_nul_names() -> None:
    from awa_django.retry import exception_names

    class Meta(type):
        def __getattribute__(cls, name: str) -> Any:
            if name in ("__mro__", "__module__", "__qualname__", "__dict__"):
                raise RuntimeError(f"no attr {name}")
            return super().__getattribute__(name)

    class Weird(Exception, metaclass=Meta):
        pass

    names = exception_names(Weird("x"))
    assert "builtins.Exception" in names and any(n.endswith("Weird") for n in names)

    class Named(Exception):
        pass

    Named.__qualname__ = "Na\x00med"
    with pytest.raises(InvalidOptionError, match="cannot be stored"):
        RetryPolicy(retry_on=[Named])
