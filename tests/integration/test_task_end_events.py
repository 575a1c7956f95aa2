"""What Airflow 3.3.2 does with a trigger's task-ending events, on a real metadata DB (SQLite, its own
AIRFLOW_HOME): the behaviour the waits that end in the triggerer rely on (docs/architecture.md,
"Waits that end in the triggerer").

- ``TaskSuccessEvent(xcoms=...)``: the task instance is SUCCESS, no worker. Its XComs are stored as
  JSON text (``XComModel.set`` serialises them; the execution API stores a task's values as they
  are), so a later task reading them through the Task SDK gets a string: the triggers here push their
  XComs through the SDK (``triggers.task_end``) and end with a bare ``TaskSuccessEvent()``.
- ``TaskFailedEvent``: UP_FOR_RETRY while retries remain (its XComs dropped), FAILED after. It cannot
  say "no retry" (a deterministic failure), so those failures stay on the worker
  (``AirflowFailException``), and the triggers here never yield it.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
AIRFLOW = REPO / ".venvs" / "airflow" / "bin" / "airflow"


@pytest.fixture(scope="module")
def outcome(tmp_path_factory) -> dict:
    home = tmp_path_factory.mktemp("airflow-home")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW__")}
    env.update(AIRFLOW_HOME=str(home), AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=f"sqlite:///{home}/airflow.db",
               AIRFLOW__CORE__DAGS_FOLDER=str(home / "dags"), AIRFLOW__CORE__LOAD_EXAMPLES="False",
               AIRFLOW__CORE__UNIT_TEST_MODE="False")
    migrated = subprocess.run([str(AIRFLOW), "db", "migrate"], env=env, capture_output=True, text=True, timeout=600)
    assert migrated.returncode == 0, migrated.stderr[-3000:]
    done = subprocess.run([sys.executable, str(Path(__file__).with_name("task_end_probe.py"))], env=env,
                          capture_output=True, text=True, timeout=600, cwd=REPO)
    lines = [line for line in done.stdout.splitlines() if line.startswith("PROBE ")]
    assert lines, f"rc={done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    return json.loads(lines[-1].removeprefix("PROBE "))


def test_a_task_success_event_ends_the_task_and_stores_its_xcoms_as_json_text(outcome):
    ended = outcome["succeeds"]
    assert (ended["state"], ended["try_number"], ended["trigger_id"]) == ("success", 1, None)
    assert ended["xcoms"] == {"return_value": '{"cluster_name": "uc-x"}', "extra": "[1, 2]"}


def test_a_task_failed_event_retries_while_retries_remain(outcome):
    retried = outcome["fails_with_a_retry_left"]
    assert (retried["state"], retried["trigger_id"]) == ("up_for_retry", None)
    assert retried["xcoms"] == {}  # a try that retries pushes nothing


def test_a_task_failed_event_fails_the_task_once_no_retry_is_left(outcome):
    failed = outcome["fails_without_retries"]
    assert (failed["state"], failed["trigger_id"], failed["xcoms"]) == ("failed", None, {})
