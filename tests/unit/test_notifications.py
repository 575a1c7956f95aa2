"""notify(): real delivery to a real SMTP server (aiosmtpd) and a real HTTP webhook on 127.0.0.1."""

from __future__ import annotations

import json
import socket
import threading
from email import message_from_bytes
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from aiosmtpd.controller import Controller

from tests.unit.test_slurm_job import training_dir  # noqa: F401 - fixture
from ultracluster import notifications
from ultracluster.notifications import notify
from ultracluster.run.events import event

REPO = Path(__file__).resolve().parents[2]


class _Inbox:
    def __init__(self):
        self.messages = []

    async def handle_DATA(self, server, session, envelope):
        self.messages.append((envelope.rcpt_tos, message_from_bytes(envelope.content)))
        return "250 OK"


@pytest.fixture
def smtp_server():
    inbox = _Inbox()
    # aiosmtpd's start() connects to the port it was given, so take a free one first
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    controller = Controller(inbox, hostname="127.0.0.1", port=port)
    controller.start()
    try:
        yield port, inbox
    finally:
        controller.stop()


@pytest.fixture
def webhook_server():
    received = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            received.append((self.path, body, self.headers.get("Authorization")))
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(b'{"ok": true}')

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1], received
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(autouse=True)
def no_channels(monkeypatch):
    for conn_id in (notifications.SMTP_CONN_ID, notifications.SLACK_CONN_ID, notifications.SLACK_WEBHOOK_CONN_ID):
        monkeypatch.delenv(f"AIRFLOW_CONN_{conn_id.upper()}", raising=False)


def _smtp_conn(monkeypatch, port: int, **extra):
    extra = {"from_email": "airflow@ultracluster.test", "to": "ops@ultracluster.test", "disable_ssl": True,
             "disable_tls": True, "retry_limit": 0, **extra}
    monkeypatch.setenv(
        "AIRFLOW_CONN_ULTRACLUSTER_SMTP",
        json.dumps({"conn_type": "smtp", "host": "127.0.0.1", "port": port, "extra": extra}),
    )


def test_no_connection_sends_nothing_and_raises_nothing(smtp_server, webhook_server):
    _, inbox = smtp_server
    _, received = webhook_server
    assert notify("run failed", "trn1_bert_pretrain run x failed") is False
    assert inbox.messages == [] and received == []


def test_smtp_delivers_to_the_connection_recipients(monkeypatch, smtp_server):
    port, inbox = smtp_server
    _smtp_conn(monkeypatch, port, to=["ops@ultracluster.test", "oncall@ultracluster.test"])
    assert notify("budget stop: run r1", "train stopped at step 40 <of> {{ 100 }}") is True
    [(rcpts, msg)] = inbox.messages
    assert rcpts == ["ops@ultracluster.test", "oncall@ultracluster.test"]
    assert msg["Subject"] == "budget stop: run r1"
    assert msg["From"] == "airflow@ultracluster.test"
    body = next(p for p in msg.walk() if p.get_content_type() == "text/html").get_payload(decode=True).decode()
    # escaped and not rendered as a template
    assert "step 40 &lt;of&gt; {{ 100 }}" in body


def test_slack_webhook_delivers_and_smtp_too(monkeypatch, smtp_server, webhook_server):
    smtp_port, inbox = smtp_server
    port, received = webhook_server
    _smtp_conn(monkeypatch, smtp_port)
    monkeypatch.setenv(
        "AIRFLOW_CONN_ULTRACLUSTER_SLACK_WEBHOOK",
        json.dumps({"conn_type": "slackwebhook", "password": f"http://127.0.0.1:{port}/hooks/T0/B0/x"}),
    )
    assert notify("run failed", "task train failed") is True
    [(path, payload, _)] = received
    assert path == "/hooks/T0/B0/x"
    assert payload["text"] == "*run failed*\ntask train failed"
    assert len(inbox.messages) == 1


def test_a_failing_channel_does_not_stop_the_others(monkeypatch, webhook_server):
    port, received = webhook_server
    # SMTP connection without the required `to`: logged, the webhook still delivers.
    monkeypatch.setenv(
        "AIRFLOW_CONN_ULTRACLUSTER_SMTP", json.dumps({"conn_type": "smtp", "host": "127.0.0.1", "port": 1})
    )
    monkeypatch.setenv(
        "AIRFLOW_CONN_ULTRACLUSTER_SLACK_WEBHOOK",
        json.dumps({"conn_type": "slackwebhook", "password": f"http://127.0.0.1:{port}/hooks/x"}),
    )
    assert notify("t", "m") is True
    assert len(received) == 1


def test_only_failing_channels_report_nothing_sent(monkeypatch):
    # Nothing listens on this port: delivery fails, notify says so and does not raise.
    _smtp_conn(monkeypatch, 1)
    assert notify("t", "m") is False


def test_slack_api_posts_to_the_connection_channel(monkeypatch, webhook_server):
    port, received = webhook_server
    monkeypatch.setenv(
        "AIRFLOW_CONN_ULTRACLUSTER_SLACK",
        json.dumps({"conn_type": "slack", "password": "xoxb-test-token",
                    "extra": {"channel": "#ultracluster", "base_url": f"http://127.0.0.1:{port}/api/"}}),
    )
    assert notify("cluster reaped", "uc-r1 deleted") is True
    [(path, payload, auth)] = received
    assert path == "/api/chat.postMessage"
    assert auth == "Bearer xoxb-test-token"
    assert payload["channel"] == "#ultracluster" and payload["text"] == "*cluster reaped*\nuc-r1 deleted"


def test_a_budget_stop_mails_at_once_and_still_fails_the_task(monkeypatch, smtp_server, training_dir):
    from airflow.sdk.exceptions import AirflowFailException

    from tests.unit.test_slurm_job import ReplayHeadNode, context, operator

    port, inbox = smtp_server
    _smtp_conn(monkeypatch, port)
    message = "budget guard: projected cost $12.00 exceeds max_cost_usd $10.00; job 9 cancelled"
    with pytest.raises(AirflowFailException, match="budget guard"):
        operator(ReplayHeadNode(), training_dir).execute_complete(
            context(), event("budget_exceeded", message, job_id="9", state="CANCELLED"))
    [(_, msg)] = inbox.messages
    assert msg["Subject"] == "ultracluster: budget stop in trn1_bert_pretrain run manual__2026-11-30T08:00:00+00:00"
    body = next(p for p in msg.walk() if p.get_content_type() == "text/html").get_payload(decode=True).decode()
    assert "projected cost $12.00" in body and "Slurm job 9" in body


def test_other_job_failures_send_no_budget_mail(monkeypatch, smtp_server, training_dir):
    from airflow.sdk.exceptions import AirflowFailException

    from tests.unit.test_slurm_job import ReplayHeadNode, context, operator

    port, inbox = smtp_server
    _smtp_conn(monkeypatch, port)
    with pytest.raises(AirflowFailException):
        operator(ReplayHeadNode(), training_dir).execute_complete(
            context(), event("host_key_mismatch", "host key not pinned", job_id="9"))
    assert inbox.messages == []


def test_the_pipelines_failure_callback_mails_the_failed_run(monkeypatch, smtp_server):
    """The DAG's on_failure_callback, called with the context the DAG processor builds."""
    from types import SimpleNamespace

    from airflow.dag_processing.dagbag import DagBag

    port, inbox = smtp_server
    _smtp_conn(monkeypatch, port)
    dag = DagBag(dag_folder=str(REPO / "dags" / "trn1_bert_pretrain.py")).dags[
        "trn1_bert_pretrain"]
    [callback] = dag.on_failure_callback if isinstance(dag.on_failure_callback, list) else [dag.on_failure_callback]
    callback({"dag": dag, "run_id": "manual__r1", "reason": "task_failure",
              "ti": SimpleNamespace(task_id="train", try_number=3)})
    [(_, msg)] = inbox.messages
    assert msg["Subject"] == "ultracluster: trn1_bert_pretrain run manual__r1 failed"
    body = next(p for p in msg.walk() if p.get_content_type() == "text/html").get_payload(decode=True).decode()
    assert "task_failure" in body and "Last task: train (try 3)" in body


def test_a_broken_connection_is_logged_not_raised(monkeypatch, webhook_server, caplog):
    """A connection whose extra is not JSON: logged, the other channel still sends, nothing raises (a
    budget stop must stay a failure without retries)."""
    port, received = webhook_server
    monkeypatch.setenv("AIRFLOW_CONN_ULTRACLUSTER_SMTP",
                       json.dumps({"conn_type": "smtp", "host": "127.0.0.1", "extra": "{not json"}))
    monkeypatch.setenv(
        "AIRFLOW_CONN_ULTRACLUSTER_SLACK_WEBHOOK",
        json.dumps({"conn_type": "slackwebhook", "password": f"http://127.0.0.1:{port}/hooks/x"}),
    )
    assert notify("t", "m") is True
    assert len(received) == 1
    assert "notification through connection ultracluster_smtp failed" in caplog.text
