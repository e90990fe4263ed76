"""Workflows and batches: jobs that wait for other jobs, written in the caller's transaction.

A workflow's steps are jobs (``Job.prepare(...)`` requests) and the dependencies between them.
``Workflow.enqueue()`` writes every step in one statement on Django's connection, so inside
``transaction.atomic()`` the whole workflow commits or rolls back with the caller's rows. Steps
without dependencies go to their queues at once; each other step waits, and the transaction
that ends its last dependency (the worker's finalize, a cancel, a DLQ purge) releases it to its
queue. No poller, no hand-off after commit. docs/workflows.md is the guide.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, Literal, NamedTuple, TypeVar

from asgiref.sync import sync_to_async
from django.db import connections

from awa_django import serialization, types
from awa_django.conf import awa_settings
from awa_django.db.enqueue import ensure_lanes, sql_limits_json
from awa_django.db.transactions import checked_alias, write_transaction
from awa_django.exceptions import InvalidOptionError, JobFailedError
from awa_django.limits import check_id, check_no_control, show
from awa_django.sql import query
from awa_django.types import JSON, SEAL, EnqueuedJob, JobRequest

__all__ = [
    "MAX_BATCH_MEMBERS",
    "MAX_WORKFLOW_STEPS",
    "Batch",
    "JobOutcome",
    "OnFailure",
    "Step",
    "Workflow",
    "WorkflowRun",
    "WorkflowStatus",
    "batch",
    "chain",
    "chord",
    "get_workflow",
    "group",
    "wait_for_job",
    "workflow",
]

#: What a step does when one of its dependencies fails or is cancelled: ``"cancel"`` it (and,
#: in turn, the steps that need it; the default), ``"skip"`` it (recorded as cancelled, but the
#: steps after it go on as if it had completed), or ``"run"`` it anyway once every dependency
#: has ended.
OnFailure = Literal["cancel", "skip", "run"]
_POLICIES = ("cancel", "skip", "run")

#: The most steps of one workflow.
MAX_WORKFLOW_STEPS = 10_000
#: The most members of one batch (its callbacks come on top).
MAX_BATCH_MEMBERS = 100_000
_MAX_NAME = 200

T = TypeVar("T")


def _json(value: object) -> Any:
    """A jsonb column's value, decoded (Django's psycopg adapters hand jsonb back as text)."""
    return serialization.loads(value) if isinstance(value, str) else value


def _check_name(value: object, field: str) -> str:
    if type(value) is not str:
        raise InvalidOptionError(field, f"must be a string, got {type(value).__name__}")
    if not 1 <= len(value) <= _MAX_NAME:
        raise InvalidOptionError(field, f"must be 1 to {_MAX_NAME} characters")
    if any(0xD800 <= ord(c) <= 0xDFFF for c in value):
        raise InvalidOptionError(field, f"{show(value)} contains a lone surrogate")
    try:
        return check_no_control(field, value)
    except InvalidOptionError as exc:
        raise InvalidOptionError(field, f"{show(value)} contains a control character") from exc


def _check_request(request: object, what: str) -> JobRequest:
    if type(request) is not JobRequest or request.sealed is not SEAL:
        raise InvalidOptionError(
            what,
            f"must be a request made by Job.prepare() (got {type(request).__name__})",
        )
    if request.unique is not None:
        raise InvalidOptionError(
            what, f"{request.kind!r} is a unique job; a workflow step cannot be unique"
        )
    return request


def _check_policy(value: object) -> str:
    if value not in _POLICIES:
        raise InvalidOptionError(
            "on_failure", f"must be 'cancel', 'skip' or 'run', got {show(value)}"
        )
    return str(value)


@dataclasses.dataclass(frozen=True, slots=True, eq=False)
class Step:
    """One step of a ``Workflow`` (what ``Workflow.add`` returns): pass it in ``after=`` of
    later steps. ``name`` is its name in the workflow (``ctx.upstream`` is keyed by it)."""

    workflow: Workflow
    name: str
    index: int

    def __repr__(self) -> str:
        return f"<Step {self.name!r} of workflow {self.workflow.name!r}>"


class Workflow:
    """A workflow being built: steps and the steps each one waits for (``after``).

    Nothing is written until ``enqueue()``. A step can only wait for steps added before it, so
    a workflow never has a cycle. ``on_failure`` is the default of its steps (``OnFailure``).
    """

    def __init__(
        self, name: str, *, on_failure: OnFailure = "cancel", using: str | None = None
    ) -> None:
        self.name = _check_name(name, "name")
        self.on_failure = _check_policy(on_failure)
        self.using = checked_alias(awa_settings.DATABASE_ALIAS if using is None else using)
        self._steps: list[dict[str, Any]] = []
        self._names: dict[str, Step] = {}
        self._bases: dict[str, int] = {}  # default names given per base, for name-2, name-3...
        self._sent = False

    def __repr__(self) -> str:
        return f"<Workflow {self.name!r}: {len(self._steps)} steps>"

    def __len__(self) -> int:
        return len(self._steps)

    @property
    def steps(self) -> tuple[Step, ...]:
        """The steps added so far, in order."""
        return tuple(self._names.values())

    def add(
        self,
        request: JobRequest,
        *,
        after: Step | Iterable[Step] = (),
        name: str | None = None,
        on_failure: OnFailure | None = None,
    ) -> Step:
        """Add a step running ``request`` (``Job.prepare(...)``) after the steps ``after``
        (each ``Step`` of this workflow, already added). ``name`` defaults to the job's function
        name, made unique with ``-2``, ``-3``... Raises ``InvalidOptionError`` for a request
        that is not ``Job.prepare()``'s or is unique, a step of another workflow, a name taken,
        or more than ``MAX_WORKFLOW_STEPS`` steps; nothing is added then."""
        if self._sent:
            raise InvalidOptionError("workflow", "this workflow was enqueued already")
        request = _check_request(request, "request")
        if request.using != self.using:
            raise InvalidOptionError(
                "using",
                f"the request for {request.kind!r} targets database {request.using!r}, "
                f"the workflow {self.using!r}",
            )
        policy = self.on_failure if on_failure is None else _check_policy(on_failure)
        deps = self._dependencies(after)
        if len(self._steps) >= MAX_WORKFLOW_STEPS:
            raise InvalidOptionError(
                "steps", f"a workflow has at most {MAX_WORKFLOW_STEPS:,} steps"
            )
        if name is None:
            base = request.kind.rsplit(".", 1)[-1][: _MAX_NAME - 8] or "step"
            n = self._bases.get(base, 0)
            name = base if n == 0 else f"{base}-{n + 1}"
            while name in self._names:  # taken by an explicit name
                n += 1
                name = f"{base}-{n + 1}"
            self._bases[base] = n + 1
        name = _check_name(name, "name")
        if name in self._names:
            raise InvalidOptionError("name", f"the workflow has a step named {show(name)} already")
        step = Step(self, name, len(self._steps))
        self._steps.append(
            {"step": name, "request": request, "after": [d.name for d in deps], "on": policy}
        )
        self._names[name] = step
        return step

    def _dependencies(self, after: Step | Iterable[Step]) -> list[Step]:
        items = [after] if isinstance(after, Step) else after
        if isinstance(items, str | bytes | Mapping) or not isinstance(items, Iterable):
            raise InvalidOptionError("after", "must be a Step or an iterable of Steps")
        deps: list[Step] = []
        seen: set[int] = set()
        for item in items:
            if not isinstance(item, Step):
                raise InvalidOptionError(
                    "after", f"must list Steps (what add() returns), got {type(item).__name__}"
                )
            if item.workflow is not self:
                raise InvalidOptionError(
                    "after",
                    f"{item!r} is a step of another workflow: a step can only wait for "
                    "steps of its own workflow",
                )
            if self._names.get(item.name) is not item:
                raise InvalidOptionError("after", f"{item!r} was not made by this workflow's add()")
            if item.index not in seen:
                seen.add(item.index)
                deps.append(item)
        return deps

    def payload(self) -> dict[str, Any]:
        """The JSON object ``awa.workflow_enqueue_v1`` takes (docs/workflows.md, "Raw SQL")."""
        steps = []
        for s in self._steps:
            item: dict[str, Any] = {"step": s["step"], "job": s["request"].payload_value()}
            if s["after"]:
                item["after"] = s["after"]
            if s["on"] != "cancel":
                item["on_failure"] = s["on"]
            steps.append(item)
        return {"name": self.name, "kind": "workflow", "steps": steps}

    def enqueue(self) -> WorkflowRun:
        """Write the workflow in the caller's transaction (one statement; outside
        ``transaction.atomic()``, a transaction of its own) and return its handle. Steps
        without dependencies are available (or scheduled) at once; the others are scheduled
        until their dependencies end. A workflow is enqueued once."""
        if not self._steps:
            raise InvalidOptionError("steps", "a workflow needs at least one step")
        if self._sent:
            raise InvalidOptionError("workflow", "this workflow was enqueued already")
        run = _send(self.payload(), [s["request"] for s in self._steps], self.using, "workflow")
        self._sent = True
        return run

    async def aenqueue(self) -> WorkflowRun:
        """Async ``enqueue`` (Django's thread-sensitive executor, like the async ORM)."""
        return await sync_to_async(self.enqueue, thread_sensitive=True)()


class Batch:
    """Jobs enqueued together with callbacks that run once every member has ended.

    ``on_complete`` runs when the last member ends, whatever the outcomes; ``on_success`` only
    if every member completed; ``on_failure`` only if some member failed or was cancelled.
    Each callback reads the members' outcome counts in ``ctx.workflow.counts``. A member in the
    dead letter queue has not ended: the callbacks wait until it is retried and ends, or purged.
    """

    def __init__(
        self,
        requests: Iterable[JobRequest],
        *,
        name: str = "batch",
        on_complete: JobRequest | None = None,
        on_success: JobRequest | None = None,
        on_failure: JobRequest | None = None,
        using: str | None = None,
    ) -> None:
        self.name = _check_name(name, "name")
        if isinstance(requests, str | bytes | Mapping) or not isinstance(requests, Iterable):
            raise InvalidOptionError("requests", "must be an iterable of Job.prepare() requests")
        self.members = [_check_request(r, f"requests[{i}]") for i, r in enumerate(requests)]
        if not self.members:
            raise InvalidOptionError("requests", "a batch needs at least one member")
        if len(self.members) > MAX_BATCH_MEMBERS:
            raise InvalidOptionError(
                "requests", f"a batch has at most {MAX_BATCH_MEMBERS:,} members"
            )
        self._sent = False
        self.callbacks: dict[str, JobRequest] = {}
        for field, request in (
            ("on_complete", on_complete),
            ("on_success", on_success),
            ("on_failure", on_failure),
        ):
            if request is not None:
                self.callbacks[field] = _check_request(request, field)
        alias = self.members[0].using if using is None else using
        self.using = checked_alias(alias)
        for request in [*self.members, *self.callbacks.values()]:
            if request.using != self.using:
                raise InvalidOptionError(
                    "using",
                    f"the request for {request.kind!r} targets database {request.using!r}, "
                    f"the batch {self.using!r}",
                )

    def payload(self) -> dict[str, Any]:
        """The JSON object ``awa.workflow_enqueue_v1`` takes."""
        steps: list[dict[str, Any]] = [{"job": r.payload_value()} for r in self.members]
        policies = {"on_complete": "run", "on_success": "skip", "on_failure": "failed_only"}
        for field, request in self.callbacks.items():
            steps.append(
                {
                    "step": field,
                    "job": request.payload_value(),
                    "after": "*",
                    "on_failure": policies[field],
                }
            )
        return {"name": self.name, "kind": "batch", "steps": steps}

    def enqueue(self) -> WorkflowRun:
        """Write the batch in the caller's transaction; its handle names members ``"0"``,
        ``"1"``... and callbacks by their argument's name."""
        if self._sent:
            raise InvalidOptionError("batch", "this batch was enqueued already")
        requests = [*self.members, *self.callbacks.values()]
        run = _send(self.payload(), requests, self.using, "batch")
        self._sent = True
        return run

    async def aenqueue(self) -> WorkflowRun:
        """Async ``enqueue``."""
        return await sync_to_async(self.enqueue, thread_sensitive=True)()


def _send(
    payload: dict[str, Any], requests: list[JobRequest], using: str, kind: str
) -> WorkflowRun:
    ensure_lanes(using, {(r.queue, r.priority) for r in requests})
    with (
        write_transaction(using, statements=1, read_committed=True) as connection,
        connection.cursor() as cursor,
    ):
        cursor.execute(
            query("workflow_enqueue"), [serialization.encode(payload), sql_limits_json()]
        )
        rows = cursor.fetchall()
    jobs = {
        row[1]: EnqueuedJob(row[2], r.kind, r.queue, r.priority, row[3], using)
        for r, row in zip(requests, rows, strict=True)
    }
    return WorkflowRun(rows[0][0], payload["name"], kind, using, jobs)


def workflow(name: str, *, on_failure: OnFailure = "cancel", using: str | None = None) -> Workflow:
    """A new, empty ``Workflow`` named ``name`` (1-200 characters; for operators)."""
    return Workflow(name, on_failure=on_failure, using=using)


def chain(*requests: JobRequest, name: str = "chain", on_failure: OnFailure = "cancel") -> Workflow:
    """A workflow of ``requests`` run one after the other (Celery's ``chain``)."""
    wf = Workflow(name, on_failure=on_failure, using=_alias_of(requests))
    previous: Step | None = None
    for request in requests:
        previous = wf.add(request, after=() if previous is None else previous)
    return wf


def group(*requests: JobRequest, name: str = "group") -> Workflow:
    """A workflow of ``requests`` that all run at once (Celery's ``group``)."""
    wf = Workflow(name, using=_alias_of(requests))
    for request in requests:
        wf.add(request)
    return wf


def chord(
    requests: Iterable[JobRequest],
    callback: JobRequest,
    *,
    name: str = "chord",
    on_failure: OnFailure = "cancel",
) -> Workflow:
    """A workflow of ``requests`` at once, then ``callback`` after all of them (Celery's
    ``chord``): with the default ``on_failure="cancel"`` the callback runs only if every
    member completed; its ``ctx.upstream`` holds their results."""
    members = list(requests) if not isinstance(requests, JobRequest) else [requests]
    wf = Workflow(name, using=_alias_of([*members, callback]))
    steps = [wf.add(request) for request in members]
    wf.add(callback, after=steps, on_failure=on_failure)
    return wf


def batch(
    requests: Iterable[JobRequest],
    *,
    name: str = "batch",
    on_complete: JobRequest | None = None,
    on_success: JobRequest | None = None,
    on_failure: JobRequest | None = None,
    using: str | None = None,
) -> Batch:
    """A ``Batch`` of ``requests`` (up to ``MAX_BATCH_MEMBERS``) and its callbacks."""
    return Batch(
        requests,
        name=name,
        on_complete=on_complete,
        on_success=on_success,
        on_failure=on_failure,
        using=using,
    )


def _alias_of(requests: Sequence[object]) -> str | None:
    first = requests[0] if requests else None
    return first.using if isinstance(first, JobRequest) else None


# Handles and waits -------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class WorkflowStatus:
    """A workflow as it is now. ``state``: ``running`` until its last step ends, then
    ``completed`` (every step completed or was skipped) or ``failed``. The counts are of its
    steps that ended."""

    id: int
    name: str
    kind: str
    state: str
    steps: int
    completed: int
    failed: int
    cancelled: int
    skipped: int
    created_at: datetime
    finished_at: datetime | None

    @property
    def finished(self) -> bool:
        """Whether every step has ended."""
        return self.finished_at is not None


@dataclasses.dataclass(frozen=True, slots=True)
class JobOutcome:
    """A job as it is now: ``state`` (a dead-lettered job is ``failed`` with ``in_dlq``), its
    result once completed, its errors."""

    id: int
    state: str
    result: JSON
    errors: list[JSON]
    in_dlq: bool

    @property
    def finished(self) -> bool:
        """Whether the job has ended (completed, failed, cancelled, or dead-lettered)."""
        return self.state in ("completed", "failed", "cancelled")


class WorkflowRun(NamedTuple):
    """An enqueued workflow or batch: its id and each step's job (``jobs``, by step name)."""

    id: int
    name: str
    kind: str
    using: str
    jobs: Mapping[str, EnqueuedJob]

    def status(self) -> WorkflowStatus:
        """The workflow as it is now (``LookupError`` once it has been pruned)."""
        found = _workflow_status(self.using, self.id)
        if found is None:
            raise LookupError(f"workflow {self.id} is not in the database (pruned?)")
        return found

    def wait(self, timeout: float | None = None) -> WorkflowStatus:
        """Block until every step has ended (``TimeoutError`` after ``timeout`` seconds) and
        return the status. Woken by the NOTIFY of the transaction that ends the last step when
        the connection is in autocommit; polls otherwise. Wait outside the transaction that
        enqueued the workflow: until it commits, no worker can run it."""
        return _wait(self.using, lambda: _finished(_workflow_status(self.using, self.id)), timeout)

    def results(self, steps: Iterable[str] | None = None) -> dict[str, JSON]:
        """The results of the completed steps among ``steps`` (default: the final steps,
        those nothing waits for), by name."""
        if isinstance(steps, str | bytes):
            raise InvalidOptionError("steps", "must be an iterable of step names, not a string")
        names = None if steps is None else [_check_name(s, "steps") for s in steps]
        if _workflow_status(self.using, self.id) is None:
            raise LookupError(f"workflow {self.id} is not in the database (pruned?)")
        with connections[self.using].cursor() as cursor:
            cursor.execute(query("workflow_results"), [self.id, names])
            rows = cursor.fetchall()
        return {row[0]: _json(row[3]) for row in rows if row[2] == "completed"}

    def result(self, timeout: float | None = None) -> dict[str, JSON]:
        """``wait``, then the results of the final steps; ``JobFailedError`` when the workflow
        failed."""
        status = self.wait(timeout)
        if status.state != "completed":
            raise JobFailedError(f"workflow {self.id} ({self.name}) {status.state}", status)
        return self.results()

    async def aresult(self, timeout: float | None = None) -> dict[str, JSON]:
        """Async ``result``: waits in a thread of its own, never holding up the event loop's
        other sync work (the ORM, other handlers)."""
        return await _in_own_thread(self.using, self.result, timeout)

    async def await_(self, timeout: float | None = None) -> WorkflowStatus:
        """Async ``wait`` (in a thread of its own, like ``aresult``)."""
        return await _in_own_thread(self.using, self.wait, timeout)


def _finished(status: WorkflowStatus | None) -> WorkflowStatus | None:
    if status is None:
        raise LookupError("the workflow is not in the database (pruned?)")
    return status if status.finished else None


def _workflow_status(using: str, workflow_id: int) -> WorkflowStatus | None:
    with connections[using].cursor() as cursor:
        cursor.execute(query("workflow_get"), [workflow_id])
        row = cursor.fetchone()
    return None if row is None else WorkflowStatus(*row)


def get_workflow(workflow_id: int, using: str | None = None) -> WorkflowRun:
    """The handle of workflow ``workflow_id`` (``LookupError`` when there is none)."""
    check_id("workflow_id", workflow_id)
    alias = checked_alias(awa_settings.DATABASE_ALIAS if using is None else using)
    status = _workflow_status(alias, workflow_id)
    if status is None:
        raise LookupError(f"workflow {workflow_id} is not in the database")
    with connections[alias].cursor() as cursor:
        cursor.execute(query("workflow_steps"), [workflow_id, MAX_BATCH_MEMBERS + 2])
        rows = cursor.fetchall()
    jobs = {
        row[0]: EnqueuedJob(row[1], row[2] or "", row[3] or "", 0, row[5], alias) for row in rows
    }
    return WorkflowRun(status.id, status.name, status.kind, alias, jobs)


def _job_outcome(using: str, job_id: int) -> JobOutcome | None:
    with connections[using].cursor() as cursor:
        cursor.execute(query("job_outcome"), [job_id])
        row = cursor.fetchone()
    if row is None:
        return None
    errors = _json(row[2])
    return JobOutcome(
        job_id, row[0], _json(row[1]), errors if isinstance(errors, list) else [], bool(row[3])
    )


def wait_for_job(job: EnqueuedJob, timeout: float | None = None) -> JobOutcome:
    """Block until ``job`` has ended (``TimeoutError`` after ``timeout`` seconds) and return
    its outcome; ``LookupError`` when it is not in the database (never enqueued, or pruned).
    Polls, backing off from 10 ms to 500 ms."""

    def check() -> JobOutcome | None:
        outcome = _job_outcome(job.using, job.id)
        if outcome is None:
            raise LookupError(f"job {job.id} is not in the database")
        return outcome if outcome.finished else None

    return _wait(job.using, check, timeout, listen=False)


def _job_result(job: EnqueuedJob, timeout: float | None = None) -> JSON:
    outcome = wait_for_job(job, timeout)
    if outcome.state != "completed":
        raise JobFailedError(f"job {job.id} ({job.kind}) {outcome.state}", outcome)
    return outcome.result


def _wait(
    using: str, check: Callable[[], T | None], timeout: float | None, *, listen: bool = True
) -> T:
    if timeout is not None and (type(timeout) not in (int, float) or not timeout >= 0):
        raise InvalidOptionError("timeout", "must be a number of seconds (at least 0) or None")
    deadline = None if timeout is None else time.monotonic() + min(float(timeout), 1e9)
    connection = connections[using]
    listening = False
    delay = 0.01
    try:
        while True:
            found = check()
            if found is not None:
                return found
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise TimeoutError(f"not finished after {timeout} s")
            pause = delay if left is None else min(delay, left)
            if listen and not listening and connection.get_autocommit():
                with connection.cursor() as cursor:
                    cursor.execute(query("listen_done"))
                listening = True
                continue  # look again: it may have finished before LISTEN
            if listening:
                raw = connection.connection
                for _ in raw.notifies(timeout=pause, stop_after=1):
                    pass
            else:
                time.sleep(pause)
            delay = min(delay * 2, 0.5)
    finally:
        if listening and connection.connection is not None:
            with connection.cursor() as cursor:
                cursor.execute(query("unlisten_done"))


async def _in_own_thread(using: str, fn: Callable[[float | None], T], timeout: float | None) -> T:
    """``fn(timeout)`` in a worker thread of its own (not Django's one thread for sync code, which
    a long wait would hold), its database connection closed when it returns."""

    def run() -> T:
        try:
            return fn(timeout)
        finally:
            connections[using].close()

    return await sync_to_async(run, thread_sensitive=False)()


async def _ajob_result(job: EnqueuedJob, timeout: float | None = None) -> JSON:
    return await _in_own_thread(job.using, lambda t: _job_result(job, t), timeout)


types.job_waiters = (wait_for_job, _job_result, _ajob_result)
