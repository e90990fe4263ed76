"""What one worker process serves and how many jobs it runs at once (awa_django.worker.config).

Concurrency is counted per process across all its queues; a queue's own number caps it within
the process. These are pure functions of the settings and options; tests/worker/test_worker.py shows
the same rules holding in real worker processes.
"""

from __future__ import annotations

import pytest
from django.test import override_settings

from awa_django.worker.config import MAX_SLOTS, build_config, parse_queue_option
from awa_django.worker.runtime import WorkerRuntime
from tests.settings import AWA


def caps(config: object) -> dict[str, int]:
    return {q.name: q.concurrency for q in config.queues}  # type: ignore[attr-defined]


def test_concurrency_is_jobs_per_process_across_all_queues() -> None:
    config = build_config(queues=[("a", None), ("b", None), ("c", None)], concurrency=4)
    assert config.concurrency == 4  # not 4 per queue
    assert caps(config) == {"a": 4, "b": 4, "c": 4}  # each may use every slot


def test_the_handler_thread_pool_is_sized_to_the_process_concurrency() -> None:
    config = build_config(queues=[("a", None), ("b", None)], concurrency=4)
    assert WorkerRuntime(config).attempts.pool.size == 4


def test_the_default_is_the_concurrency_setting() -> None:
    with override_settings(AWA={**AWA, "CONCURRENCY": 7}):
        config = build_config(queues=[("a", None), ("b", None)])
    assert config.concurrency == 7


def test_queue_numbers_add_up_when_larger_than_the_setting() -> None:
    config = build_config(queues=[("emails", 20), ("reports", 2)])
    assert config.concurrency == 22
    assert caps(config) == {"emails": 20, "reports": 2}


def test_a_fixed_list_of_capped_queues_never_runs_more_than_their_sum() -> None:
    config = build_config(queues=[("work", 3)])
    assert config.concurrency == 3  # CONCURRENCY (32) is more than the queue can use


def test_a_queue_setting_caps_that_queue_within_the_process() -> None:
    with override_settings(AWA={**AWA, "CONCURRENCY": 8, "QUEUES": {"bulk": {"concurrency": 2}}}):
        config = build_config(queues=[("bulk", None), ("mail", None)])
        found_later = config.queue_config("bulk")
    assert config.concurrency == 8
    assert caps(config) == {"bulk": 2, "mail": 8}
    assert found_later.concurrency == 2


def test_a_queue_setting_above_the_process_concurrency_is_held_to_it() -> None:
    with override_settings(AWA={**AWA, "CONCURRENCY": 4, "QUEUES": {"bulk": {"concurrency": 50}}}):
        config = build_config()
    assert caps(config)["bulk"] == 4


def test_without_queues_the_worker_discovers_them() -> None:
    assert build_config().discover is True
    assert build_config(queues=[("work", None)]).discover is False


@pytest.mark.parametrize(
    ("queues", "concurrency", "message"),
    [
        ([("a", 20)], 10, "--queue a=20 asks for more jobs at once than --concurrency 10"),
        ([("a", None), ("a", 2)], None, "--queue 'a' is given twice"),
        ([("a", MAX_SLOTS), ("b", 1)], None, "the --queue numbers add up to 10001"),
    ],
)
def test_contradictory_options_are_refused(
    queues: list[tuple[str, int | None]], concurrency: int | None, message: str
) -> None:
    with pytest.raises(ValueError, match="^" + message.replace("+", r"\+")):
        build_config(queues=queues, concurrency=concurrency)


@pytest.mark.parametrize(
    ("value", "parsed"),
    [
        ("emails", ("emails", None)),
        ("emails=20", ("emails", 20)),
        (" a.b-c_d = 3 ", ("a.b-c_d", 3)),
    ],
)
def test_queue_option_syntax(value: str, parsed: tuple[str, int | None]) -> None:
    assert parse_queue_option(value) == parsed


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("", "no queue name"),
        ("=3", "no queue name"),
        ("Emails", "'Emails' is not a valid queue name"),
        ("a b", "'a b' is not a valid queue name"),
        ("q=", "the concurrency '' is not a whole number"),
        ("q=nan", "the concurrency 'nan' is not a whole number"),
        ("q=1.5", "the concurrency '1.5' is not a whole number"),
        ("q=1e3", "the concurrency '1e3' is not a whole number"),
        ("q=0x10", "the concurrency '0x10' is not a whole number"),
        ("q=3=4", "the concurrency '3=4' is not a whole number"),
        ("q=0", "the concurrency must be from 1 to 10000"),
        ("q=-1", "the concurrency must be from 1 to 10000"),
        ("q=99999999999999999999", "the concurrency must be from 1 to 10000"),
        ("q=" + "9" * 5000, "the concurrency must be from 1 to 10000"),
    ],
)
def test_bad_queue_options_say_what_is_wrong(value: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_queue_option(value)
