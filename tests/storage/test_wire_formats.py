"""Wire formats built by libraries (docs/design/wire-formats.md): the COPY rows of ``enqueue_many``
(psycopg's binary ``write_row``), the JSON of ``awa.enqueue_v1`` requests, finalizations and
heartbeats (the stdlib encoder) hold exactly what the single-row path and the old hand-built text
held."""

from __future__ import annotations

import inspect
import json
import math
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import transaction

import awa_django
from awa_django import serialization
from awa_django.db import bulk, storage
from awa_django.db.storage import Finalization
from tests.jobs import common as testjobs
from tests.support.database import pg

# Every character the old hand-written COPY escaping had to care about, and some it did not.
TRICKY = 'tab\there, new\nline, cr\r, back\\slash, "quote", {brace}, comma, Zoë 漢字 🙂 \u2028'
ARGS: tuple[Any, ...] = (
    TRICKY,
    {"k\\ey\t": [1, -2, 2**70, 1.5, 1e16, -0.0, 5e-324, True, False, None, [], {}]},
    "\\N",
    "",
)
METADATA = {"source": TRICKY, "n": 10**40, "x": 0.1}
TAGS = ["plain", 'q"uote', "back\\slash", "comma,brace{}", "NULL", "spa ce"]

ROW = (
    "SELECT kind, queue, priority, max_attempts, attempt, run_lease, args, metadata, tags, "
    "deadline_secs, run_at = created_at FROM awa.ready_entries WHERE job_id = %s"
)


def _rows(ids: list[int]) -> list[tuple[Any, ...]]:
    with pg() as conn:
        return [conn.execute(ROW, [i]).fetchone() for i in ids]  # type: ignore[misc]


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("clean_awa")
def test_copy_rows_equal_single_enqueue_rows() -> None:
    options = dict(metadata=METADATA, tags=TAGS, deadline=12.25, max_attempts=7, priority=-3)
    single = testjobs.renamed.using(**options).enqueue(ARGS)
    plain_single = testjobs.noop.enqueue()
    with transaction.atomic():
        handles = awa_django.enqueue_many(
            [testjobs.renamed.using(**options).prepare(ARGS), testjobs.noop.prepare()]
        )
    assert [h.state for h in handles] == ["available", "available"]
    rows = _rows([single.id, plain_single.id, handles[0].id, handles[1].id])
    assert rows[2] == rows[0] and rows[3] == rows[1]
    kind, _queue, priority, attempts, attempt, lease, args, metadata, tags, deadline, now = rows[2]
    assert (kind, priority, attempts, attempt, lease, deadline, now) == (
        "tests.renamed",
        -3,
        7,
        0,
        0,
        12.25,
        True,
    )
    assert args == {"args": [list(ARGS)], "kwargs": {}}
    assert metadata == METADATA and tags == TAGS
    assert rows[3][7:10] == (None, None, None)


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("clean_awa")
def test_timed_bulk_requests_store_what_single_enqueue_stores() -> None:
    at = datetime(2090, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
    options = dict(metadata=METADATA, tags=TAGS, deadline=3.5)
    single = testjobs.renamed.using(run_after=at, **options).enqueue(ARGS)
    with transaction.atomic():
        handles = awa_django.enqueue_many(
            [
                testjobs.renamed.using(run_after=at, **options).prepare(ARGS),
                testjobs.renamed.using(run_after=timedelta(hours=1), **options).prepare(ARGS),
            ]
        )
    assert [h.state for h in handles] == ["scheduled", "scheduled"]
    query = (
        "SELECT kind, args, metadata, tags, deadline_secs, run_at FROM awa.deferred_jobs "
        "WHERE job_id = %s"
    )
    with pg() as conn:
        first, by_date, by_delay = (
            conn.execute(query, [i]).fetchone() for i in (single.id, handles[0].id, handles[1].id)
        )
    assert first == by_date
    assert by_delay is not None and by_delay[:5] == first[:5]  # type: ignore[index]


def _old_payload(r: Any) -> str:
    """``JobRequest.payload`` as it was built by hand before."""
    parts = [
        '{"kind":',
        json.dumps(r.kind),
        ',"queue":"',
        r.queue,
        '","priority":',
        str(r.priority),
        ',"max_attempts":',
        str(r.max_attempts),
        ',"args":',
        r.args_json,
    ]
    if r.run_at is not None:
        parts.append(f',"run_at":"{r.run_at.isoformat()}"')
    if r.delay is not None:
        parts.append(f',"delay":{r.delay!r}')
    if r.deadline is not None:
        parts.append(f',"deadline":{r.deadline!r}')
    if r.metadata_json is not None:
        parts += [',"metadata":', r.metadata_json]
    if r.tags:
        parts += [',"tags":', json.dumps(list(r.tags), ensure_ascii=False)]
    return "".join([*parts, "}"])


@pytest.mark.django_db
def test_payload_holds_what_the_old_text_held() -> None:
    at = datetime(2090, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
    for request in (
        testjobs.noop.prepare(),
        testjobs.renamed.using(run_after=at, metadata=METADATA, tags=TAGS).prepare(ARGS),
        testjobs.renamed.using(run_after=timedelta(seconds=1.25), deadline=9.5).prepare([1.5]),
    ):
        assert json.loads(request.payload()) == json.loads(_old_payload(request))


def _old_finalization(f: Finalization) -> str:
    """``Finalization.to_json`` as it was built by hand before."""
    parts = [
        f'{{"id":{f.job_id},"lease":{f.run_lease},"slot":{f.claim_slot},"outcome":"{f.outcome}"'
    ]
    if f.result_json is not None:
        parts.append(f',"result":{f.result_json}')
    if f.error is not None:
        parts.append(',"error":' + json.dumps(f.error, ensure_ascii=False))
    if f.delay is not None:
        parts.append(f',"delay":{float(f.delay)!r}')
    if f.progress_json is not None:
        parts.append(',"progress":' + f.progress_json)
    if f.has_state:
        parts.append(',"st":true')
    if f.callback_id is not None:
        parts.append(f',"callback_id":"{f.callback_id}","timeout":{float(f.timeout or 3600)!r}')
    return "".join([*parts, "}"])


FINALIZATIONS = [
    Finalization(1, 2, 3, "completed"),
    Finalization(1, 2, 3, "completed", result_json="null"),
    Finalization(
        1,
        2,
        3,
        "completed",
        result_json=serialization.dumps(ARGS, "r", max_bytes=10**6, max_depth=8),
    ),
    Finalization(
        4,
        5,
        6,
        "retry",
        error={"type": "a.B", "message": TRICKY, "traceback": "line\n\tmore"},
        delay=30,
        progress_json='{"done":[1,2],"of":3}',
        has_state=True,
    ),
    Finalization(7, 8, 9, "wait", callback_id=uuid.UUID(int=42), timeout=None),
    Finalization(7, 8, 9, "wait", callback_id=uuid.UUID(int=43), timeout=60),
]


def test_finalization_json_holds_what_the_old_text_held() -> None:
    for item in FINALIZATIONS:
        assert json.loads(item.to_json()) == json.loads(_old_finalization(item))
    batch = Finalization.batch_json(FINALIZATIONS)
    assert json.loads(batch) == [json.loads(_old_finalization(f)) for f in FINALIZATIONS]
    assert storage._finalize_payload(FINALIZATIONS) == batch


def test_finalization_refuses_nan_in_python() -> None:
    with pytest.raises(ValueError):
        Finalization(1, 2, 3, "retry", delay=math.nan).to_json()


def test_heartbeat_json() -> None:
    attempts = [(1, 2, None), (3, 4, '{"step":"x\\ty","n":[1.5]}')]
    assert json.loads(storage._heartbeat_payload(attempts)) == [
        {"id": 1, "lease": 2},
        {"id": 3, "lease": 4, "progress": {"step": "x\ty", "n": [1.5]}},
    ]


def test_no_private_encoder_and_no_hand_written_copy_escaping() -> None:
    assert "c_make_encoder" not in inspect.getsource(serialization)
    assert "translate" not in inspect.getsource(bulk) and "\\\\N" not in inspect.getsource(bulk)


@pytest.mark.parametrize(
    "text",
    ["null", "0", "-1.5", "1e+16", '"Zoë\\n"', "[1,[2,{}]]", '{"a":{"b":[true,false,null]}}'],
)
def test_fragment_encodes_back_to_the_same_text(text: str) -> None:
    assert serialization.encode(serialization.fragment(text)) == text
