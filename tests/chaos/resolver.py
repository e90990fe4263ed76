"""The callback resolver: resolves the callbacks that handlers parked (``chaos.callbacks``) once
their delay has passed, in the way the handler's plan asks (docs/callbacks.md).

| mode | calls |
| --- | --- |
| ``python`` | ``awa_django.resolve_callback`` once |
| ``http`` | one signed request to the receiver (in-process, Django's test client) |
| ``http_twice`` | one signed request delivered twice, one after the other: the second replays |
| ``dup`` | ``resolve_callback`` twice in a row, different bodies: the second must not act |
| ``conflict`` | two signed requests with different bodies: the second is a ``409 conflict`` |
| ``race`` | ``resolve_callback`` from two threads at once, different bodies: one acts |
| ``race_http`` | one signed request delivered by two threads at once: one acts, the other replays |
| ``near_timeout`` | ``resolve_callback`` once, about when the wait times out: it races the rescue |

Every call is recorded in ``chaos.callback_calls`` with what it answered. A result carries
``{"by": request_id}`` and an error's message ends with the request id, so the checker can tell
which request decided the attempt (tests/chaos/check_features.py, ``callback_outcomes``).
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from django.db import connection
from django.test import Client

import awa_django
from awa_django.callbacks import callback_path, sign_request
from tests.chaos.common import DJANGO_CONNECTION_ERRORS, Run
from tests.chaos.db import CONNECTION_ERRORS, LedgerConn
from tests.chaos.sabotage import broken
from tests.chaos.settings import CALLBACK_KEY

__all__ = ["Resolver"]

ACTED = ("resolved", "accepted")
#: How long the record of a call made waits for the ledger (PostgreSQL restarts included).
RECORD_PATIENCE = 120.0


class Resolver:
    """Resolves parked callbacks (``callback_late``) once they are due, until ``stop``."""

    def __init__(self, run: Run, stop: threading.Event) -> None:
        self.run = run
        self.stop = stop
        self.db = LedgerConn(run.url, "resolver", patience=2.0)
        self.outcomes: dict[str, int] = {}
        self.lock = threading.Lock()

    def loop(self) -> None:
        try:
            while not self.stop.is_set():
                try:
                    self._resolve_due()
                except (*CONNECTION_ERRORS, *DJANGO_CONNECTION_ERRORS):
                    connection.close()
                except Exception as exc:
                    self.run.api_error("resolve_callback", exc)
                    connection.close()
                self.stop.wait(0.1)
        finally:
            connection.close()
            self.db.close()

    def _resolve_due(self) -> None:
        for callback_id, with_error, mode in self.db.execute("callbacks_due"):
            outcomes = self.resolve(str(callback_id), bool(with_error), mode)
            self.db.execute("callback_resolved", [",".join(outcomes), callback_id])

    def resolve(self, callback_id: str, error: bool, mode: str) -> list[str]:
        """Resolve ``callback_id`` as ``mode`` says; return what each call answered."""
        answers: list[str] = []
        python = self._python_call(callback_id, error, answers)
        if mode in ("python", "near_timeout"):
            python(None)
        elif mode == "dup":
            python(None)
            python(None)
        elif mode == "race":
            self._together([python, python])
        else:
            request = self._request(callback_id, error)
            deliver = self._http_call(callback_id, request, answers)
            if mode in ("http", "http_twice"):
                deliver(None)
                if mode == "http_twice":
                    deliver(None)
            elif mode == "conflict":
                deliver(None)
                self._http_call(callback_id, self._request(callback_id, not error), answers)(None)
            else:  # race_http
                self._together([deliver, deliver])
        return answers

    # -- calls ---------------------------------------------------------------------------------

    def _python_call(
        self, callback_id: str, error: bool, answers: list[str]
    ) -> Callable[[threading.Barrier | None], None]:
        def call(barrier: threading.Barrier | None) -> None:
            request = str(uuid.uuid4())
            body = "error" if error else "result"
            if barrier is not None:
                barrier.wait(5)
            try:
                if error:
                    outcome = awa_django.resolve_callback(
                        callback_id, error=f"chaos: late error {request}"
                    )
                else:
                    outcome = awa_django.resolve_callback(
                        callback_id, result={"late": True, "by": request}
                    )
            except DJANGO_CONNECTION_ERRORS:
                connection.close()
                outcome = "error"
            self._record(request, request, callback_id, "python", body, outcome, False, answers)

        return call

    def _request(self, callback_id: str, error: bool) -> tuple[str, str, bytes, dict[str, str]]:
        """One signed request: (request id, body kind, body, headers)."""
        request = str(uuid.uuid4())
        if error:
            body: dict[str, Any] = {"error": f"chaos: late error {request}"}
        else:
            body = {"result": {"late": True, "by": request}}
        raw = json.dumps(body).encode()
        headers = sign_request(
            callback_id,
            raw,
            path=callback_path(callback_id),
            key=CALLBACK_KEY,
            timestamp=int(time.time()),
        )
        return request, "error" if error else "result", raw, headers

    def _http_call(
        self, callback_id: str, request: tuple[str, str, bytes, dict[str, str]], answers: list[str]
    ) -> Callable[[threading.Barrier | None], None]:
        request_id, body, raw, headers = request

        def deliver(barrier: threading.Barrier | None) -> None:
            if barrier is not None:
                barrier.wait(5)
            try:
                response = Client().post(
                    callback_path(callback_id), data=raw, content_type="application/json",
                    headers=headers,
                )  # fmt: skip
                data = json.loads(response.content)
                status, replayed = str(data.get("status")), bool(data.get("replayed", False))
            except DJANGO_CONNECTION_ERRORS as exc:
                # The receiver answers 503 to a database error, never raises one (a 500 to a
                # real caller): report it, and keep the call on record, its effect unknown.
                self.run.api_error("callback receiver raised", exc)
                status, replayed = "error", False
            if status in ("unavailable", "error"):  # 503: the database could not be reached
                connection.close()
                status = "error"
            call_id = str(uuid.uuid4())
            self._record(call_id, request_id, callback_id, "http", body, status, replayed, answers)

        return deliver

    def _together(self, calls: list[Callable[[threading.Barrier | None], None]]) -> None:
        """Run ``calls`` in threads released at the same moment (each with its own Django
        connection)."""
        barrier = threading.Barrier(len(calls))
        errors: list[BaseException] = []

        def run(call: Callable[[threading.Barrier | None], None]) -> None:
            try:
                call(barrier)
            except BaseException as exc:
                errors.append(exc)
            finally:
                connection.close()

        threads = [threading.Thread(target=run, args=(call,)) for call in calls]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        for exc in errors:
            if isinstance(exc, (*CONNECTION_ERRORS, *DJANGO_CONNECTION_ERRORS)):
                continue
            self.run.api_error("resolve_callback (race)", exc)

    def _record(
        self,
        call_id: str,
        request_id: str,
        callback_id: str,
        via: str,
        body: str,
        outcome: str,
        replayed: bool,
        answers: list[str],
    ) -> None:
        with self.lock:
            # The sabotage records the first acting answer of a race as stale.
            if broken("callback") and outcome in ACTED and not replayed and not answers:
                outcome = "stale"
            answers.append(outcome)
            key = f"{outcome}{' (replayed)' if replayed else ''}"
            self.outcomes[key] = self.outcomes.get(key, 0) + 1
            row = [call_id, request_id, callback_id, via, body, outcome, replayed]
            # A call made must be on record, or the checker finds a job ended by a request
            # nobody sent: wait out a PostgreSQL restart (the insert is idempotent).
            self.db.execute("callback_call", row, patience=RECORD_PATIENCE)
