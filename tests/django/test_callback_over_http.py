"""The callback receiver over real HTTP (docs/callbacks.md): gunicorn serving the example project
with production settings, requests signed by sign_request and by the curl recipe of
docs/callbacks.md."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from awa_django.callbacks import sign_request
from tests.support.callbacks import KEY, job_row, parked, path_of
from tests.support.database import database_url, pg
from tests.support.polling import wait_for
from tests.support.processes import REPO

# gunicorn serving the example project makes them slow: the dj6 lane leaves them to dj52.
pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("clean_awa"),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def server(tmp_path: Path) -> Iterator[str]:
    """The example project under gunicorn (2 workers), on the test database; its base URL."""
    from django.db import connection

    port = _free_port()
    env = {
        **os.environ,
        "DATABASE_URL": database_url(connection.settings_dict),
        "DJANGO_SETTINGS_MODULE": "example_project.settings",
        "SECRET_KEY": "gunicorn-test-" + "x" * 40,
        "DEBUG": "0",
        "SECURE_SSL_REDIRECT": "0",
        "SESSION_COOKIE_SECURE": "0",
        "CSRF_COOKIE_SECURE": "0",
        "SECURE_HSTS_SECONDS": "0",
        "AWA_CALLBACK_KEYS": KEY,
        "PYTHONUNBUFFERED": "1",
    }
    log = tmp_path / "gunicorn.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gunicorn",
                "--chdir",
                str(REPO / "example_project"),
                "--bind",
                f"127.0.0.1:{port}",
                "--workers",
                "2",
                "example_project.wsgi:application",
            ],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    base = f"http://127.0.0.1:{port}"

    def up() -> bool:
        assert proc.poll() is None, log.read_text()
        try:
            with urllib.request.urlopen(base + "/admin/login/", timeout=2) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    try:
        wait_for(up, timeout=30, message=lambda: f"gunicorn to serve; log:\n{log.read_text()}")
        yield base
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def send(
    base: str, path: str, body: bytes, headers: dict[str, str], method: str = "POST"
) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(
        base + path,
        data=body if method != "GET" else None,
        method=method,
        headers={**headers, "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as error:
        with error:
            return error.code, json.loads(error.read() or b"{}")


def test_the_receiver_behind_gunicorn_resolves_once_and_refuses_the_rest(server: str) -> None:
    with pg() as conn:
        c, callback = parked(conn)
        _, other = parked(conn)
    path = path_of(callback)
    body = json.dumps({"result": {"paid": True}}).encode()
    signed = sign_request(callback, body, path=path, key=KEY)

    # Refused before anything happens.
    assert send(server, path, body, {})[0] == 401
    assert send(server, path, b'{"result": {"paid": false}}', signed)[0] == 401
    assert send(server, path_of(other), body, signed)[0] == 401
    assert send(server, path, b"", {}, method="GET")[0] == 405
    big = b'{"result": "' + b"x" * 70_000 + b'"}'
    assert send(server, path, big, sign_request(callback, big, path=path, key=KEY))[0] == 413
    junk = b"\xff not json"
    assert send(server, path, junk, sign_request(callback, junk, path=path, key=KEY)) == (
        400,
        {"status": "malformed", "detail": "the body is not a JSON document (UTF-8)"},
    )
    unknown = "00000000-0000-4000-8000-000000000000"
    assert (
        send(
            server,
            path_of(unknown),
            body,
            sign_request(unknown, body, path=path_of(unknown), key=KEY),
        )[0]
        == 404
    )
    with pg() as conn:
        assert job_row(conn, c.job_id)["state"] == "waiting_external"

    # Resolved once; the same request again gets the same answer and does nothing more.
    assert send(server, path, body, signed) == (200, {"status": "resolved"})
    assert send(server, path, body, signed) == (200, {"status": "resolved", "replayed": True})
    other_body = b'{"result": 2}'
    assert (
        send(server, path, other_body, sign_request(callback, other_body, path=path, key=KEY))[0]
        == 409
    )
    with pg() as conn:
        job = job_row(conn, c.job_id)
        done = conn.execute(
            "SELECT count(*) FROM awa.done_entries WHERE job_id = %s", [c.job_id]
        ).fetchone()
    assert (job["state"], job["result"], done) == ("completed", {"paid": True}, (1,))


@pytest.mark.skipif(
    not (shutil.which("curl") and shutil.which("openssl") and shutil.which("bash")),
    reason="needs bash, curl and openssl",
)
def test_the_curl_recipe_of_the_docs_resolves_a_callback(server: str) -> None:
    with pg() as conn:
        c, callback = parked(conn)
    recipe = _docs_recipe().replace("https://shop.example.com", server)
    run = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", recipe],
        env={**os.environ, "KEY_FROM_TEST": KEY, "CALLBACK_FROM_TEST": str(callback)},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout) == {"status": "resolved"}
    with pg() as conn:
        assert job_row(conn, c.job_id)["result"] == {"paid": True}


def _docs_recipe() -> str:
    """The curl example of docs/callbacks.md, with its key and callback id from the test."""
    text = (REPO / "docs" / "callbacks.md").read_text()
    start = text.index("### Signing with curl")
    opening = text.index("```sh", start) + len("```sh")
    block = text[opening : text.index("```", opening)]
    lines = []
    for line in block.strip().splitlines():
        if line.startswith("KEY="):
            line = 'KEY="$KEY_FROM_TEST"'
        elif line.startswith("CALLBACK_ID="):
            line = 'CALLBACK_ID="$CALLBACK_FROM_TEST"'
        elif line.startswith("#"):
            continue
        lines.append(line)
    return "\n".join(lines)


def test_the_python_example_of_the_docs_resolves_a_callback(server: str) -> None:
    with pg() as conn:
        c, callback = parked(conn)
    text = (REPO / "docs" / "callbacks.md").read_text()
    start = text.index("### Signing with Python")
    opening = text.index("```python", start) + len("```python")
    example = text[opening : text.index("```", opening)]
    program = f"KEY = {KEY!r}\ncallback_id = {str(callback)!r}\n" + example.replace(
        "https://shop.example.com", server
    )
    run = subprocess.run(
        [sys.executable, "-c", program],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        cwd=REPO,
        # The calling side needs no Django project: no settings module at all.
        env={k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"},
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "200 {'status': 'resolved'}"
    with pg() as conn:
        assert job_row(conn, c.job_id)["result"] == {"paid": True}
