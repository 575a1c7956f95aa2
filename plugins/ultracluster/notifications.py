"""Operator notifications (failed runs, budget stops, reaped clusters) through the providers' notifiers.

Each channel is switched on by creating its Airflow connection; with none of them, `notify` sends
nothing and returns False. Connection ids (docs/operations.md, "Notifications"):

- `ultracluster_smtp`: an SMTP connection (SmtpNotifier); extra `to` (address or list) is required,
  `from_email` as SmtpHook reads it.
- `ultracluster_slack`: a Slack API connection (SlackNotifier); extra `channel` is required.
- `ultracluster_slack_webhook`: a Slack incoming webhook connection (SlackWebhookNotifier).
"""

from __future__ import annotations

import html
import logging
from typing import Any

from airflow.sdk import BaseHook
from airflow.sdk.exceptions import AirflowNotFoundException

SMTP_CONN_ID = "ultracluster_smtp"
SLACK_CONN_ID = "ultracluster_slack"
SLACK_WEBHOOK_CONN_ID = "ultracluster_slack_webhook"

log = logging.getLogger(__name__)


def _connection(conn_id: str) -> Any | None:
    try:
        return BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:
        return None


def _required_extra(conn: Any, key: str) -> Any:
    value = conn.extra_dejson.get(key)
    if not value:
        raise ValueError(f"connection {conn.conn_id!r} needs extra {key!r}")
    return value


def _smtp(conn: Any, title: str, message: str) -> Any:
    from airflow.providers.smtp.notifications.smtp import SmtpNotifier

    # Plain text in <pre>, escaped: the message is data, never markup or a Jinja template.
    return SmtpNotifier(
        smtp_conn_id=conn.conn_id,
        to=_required_extra(conn, "to"),
        subject=title,
        html_content=f"<pre>{html.escape(message)}</pre>",
    )


def _slack(conn: Any, title: str, message: str) -> Any:
    from airflow.providers.slack.notifications.slack import SlackNotifier

    return SlackNotifier(
        slack_conn_id=conn.conn_id, channel=_required_extra(conn, "channel"), text=f"*{title}*\n{message}"
    )


def _slack_webhook(conn: Any, title: str, message: str) -> Any:
    from airflow.providers.slack.notifications.slack_webhook import SlackWebhookNotifier

    return SlackWebhookNotifier(slack_webhook_conn_id=conn.conn_id, text=f"*{title}*\n{message}")


_CHANNELS = ((SMTP_CONN_ID, _smtp), (SLACK_CONN_ID, _slack), (SLACK_WEBHOOK_CONN_ID, _slack_webhook))


def notify(title: str, message: str) -> bool:
    """Send `title`/`message` through every configured channel; True if at least one delivered.

    A channel that fails (its connection unreadable, a bad extra, delivery) is logged and the others
    still run: notify never raises, so it never changes how the task or callback sending it ends.
    Never pass secrets (presigned URLs, keys) in `message`.
    """
    sent = False
    for conn_id, build in _CHANNELS:
        try:
            conn = _connection(conn_id)
            if conn is None:
                continue
            # notify() directly, not __call__: no Jinja rendering of the caller's text.
            build(conn, title, message).notify({})
        except Exception:
            log.exception("notification through connection %s failed", conn_id)
            continue
        log.info("notification sent through connection %s: %s", conn_id, title)
        sent = True
    if not sent:
        log.info("no notification channel delivered %r (connections: %s)", title,
                 ", ".join(c for c, _ in _CHANNELS))
    return sent


def run_failed(context: Any) -> None:
    """DAG-level on_failure_callback: one notification per failed run (runs in the DAG processor)."""
    dag = context.get("dag")
    dag_id = getattr(dag, "dag_id", None) or "?"
    run_id = context.get("run_id") or "?"
    lines = [f"DAG {dag_id}, run {run_id} failed: {context.get('reason') or 'task failed'}"]
    ti = context.get("ti")
    if ti is not None:
        lines.append(f"Last task: {ti.task_id} (try {getattr(ti, 'try_number', '?')})")
    lines.append("The run's failure artifacts, when its cluster existed: the save_on_failure task's XCom.")
    notify(f"ultracluster: {dag_id} run {run_id} failed", "\n".join(lines))


def notify_budget_stop(context: Any, event: dict[str, Any]) -> bool:
    """The budget guard cancelled a Slurm job (a "budget_exceeded" event): say so at once."""
    if event.get("reason") != "budget_exceeded":
        return False
    ti = context["ti"]
    return notify(
        f"ultracluster: budget stop in {ti.dag_id} run {ti.run_id}",
        f"{event.get('message')}\nTask {ti.task_id}, Slurm job {event.get('job_id')}. The run fails; its "
        "checkpoints and logs go to S3 (save_failure_artifacts) before the cluster is deleted.",
    )
