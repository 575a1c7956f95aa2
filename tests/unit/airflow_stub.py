"""A stub of Airflow's REST API v2 for the `ultracluster` client's tests: a real HTTP server on
127.0.0.1 answering canned, Airflow-shaped JSON and recording every request; plus the fixtures and
helpers of tests/unit/test_cli*.py."""
from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Iterator
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote

import pytest

from tests.fixtures_localcluster import free_port
from ultracluster.cli import main

PASSWORD = "s3cret"
DAG = "/api/v2/dags/trn1_bert_pretrain"
RUN_ID = "manual__2026-04-15T10:00:00+00:00"
RUN = f"{DAG}/dagRuns/{RUN_ID}"
Answer = tuple[int, object] | Callable[["StubAirflow"], tuple[int, object]]


class StubAirflow:
    """Canned answers per (method, path with query): each call takes the next one, the last repeats.
    ``POST /auth/token`` checks the password; every other call needs a token it issued."""

    def __init__(self) -> None:
        self.routes: dict[tuple[str, str], list[Answer]] = {}
        self.requests: list[tuple[str, str, object]] = []
        self.tokens: set[str] = set()
        self.url = ""

    def on(self, method: str, path: str, *answers: Answer) -> None:
        self.routes[(method, path)] = list(answers)

    def expire_tokens(self) -> tuple[int, object]:
        self.tokens.clear()
        return 401, {"detail": "Invalid JWT token"}

    def answer(self, method: str, path: str, auth: str, body: object) -> tuple[int, object]:
        self.requests.append((method, path, body))
        if path == "/auth/token" and method == "POST":
            if body != {"username": "admin", "password": PASSWORD}:
                return 401, {"detail": "Invalid credentials"}
            self.tokens.add(token := f"token-{len(self.requests)}")
            return 201, {"access_token": token}
        if auth.removeprefix("Bearer ") not in self.tokens:
            return 401, {"detail": "Not authenticated"}
        answers = self.routes.get((method, path))
        if not answers:
            return 404, {"detail": f"stub: no route {method} {path}"}
        found = answers.pop(0) if len(answers) > 1 else answers[0]
        return found(self) if callable(found) else found


@pytest.fixture
def stub() -> Iterator[StubAirflow]:
    airflow = StubAirflow()

    class Handler(BaseHTTPRequestHandler):
        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length)) if length else None
            auth = self.headers.get("Authorization", "")
            status, answer = airflow.answer(self.command, unquote(self.path), auth, body)
            data = json.dumps(answer).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PATCH = _serve

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
    airflow.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield airflow
    server.shutdown()
    server.server_close()


@pytest.fixture(autouse=True)
def no_ambient_config(monkeypatch, tmp_path):
    """Neither the caller's ULTRACLUSTER_AIRFLOW_* nor a local Airflow's passwords file."""
    for name in ("ULTRACLUSTER_AIRFLOW_URL", "ULTRACLUSTER_AIRFLOW_USERNAME", "ULTRACLUSTER_AIRFLOW_PASSWORD"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE", str(tmp_path / "no-passwords.json"))


def cli(stub: StubAirflow, command: str, *args: str, password: str = PASSWORD, now: datetime | None = None) -> int:
    """`ultracluster --url STUB --password P COMMAND ARGS` in-process; follows poll without pause."""
    polls = ["--poll-interval", "0"] if command in ("trigger", "sweep", "report") else []
    return main(["--url", stub.url, "--password", password, command, *args, *polls], now=now)


def run(run_id: str, state: str, **extra) -> tuple[int, dict]:
    return 200, {"dag_run_id": run_id, "dag_id": "trn1_bert_pretrain", "state": state, "logical_date": None,
                 "run_type": "manual", "duration": None, **extra}


def tis(*states: tuple[str, str | None, float | None]) -> tuple[int, dict]:
    """Task instances (task_id, state, duration), started in this order."""
    found = [{"task_id": task, "map_index": -1, "state": state, "duration": duration,
              "start_date": f"2026-04-15T10:00:{i:02d}Z" if state else None}
             for i, (task, state, duration) in enumerate(states)]
    return 200, {"task_instances": found, "total_entries": len(found)}


def token_request() -> tuple[str, str, dict]:
    return ("POST", "/auth/token", {"username": "admin", "password": PASSWORD})


def timeless(text: str) -> str:
    """Output with its elapsed times fixed: `  task  state  12s` -> `Ts`, `in 98 s` -> `in T s`."""
    text = re.sub(r"(?<= )\d+s$", "Ts", text, flags=re.M)
    return re.sub(r" in \d+ s$", " in T s", text, flags=re.M)


def one_error_line(err: str) -> str:
    """The error, asserted to be one line without a traceback."""
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err.removeprefix("ultracluster: error: ").rstrip("\n")
