"""Airflow runs as a task sees them, through the Task SDK's execution API."""
from __future__ import annotations

from collections.abc import Mapping

from airflow.sdk.api.client import ServerResponseError
from airflow.sdk.exceptions import AirflowRuntimeError
from airflow.sdk.execution_time.task_runner import RuntimeTaskInstance


def _not_found(err: Exception) -> bool:
    response = getattr(err, "response", None)  # ServerResponseError: in-process (dag.test())
    if response is not None:
        return response.status_code == 404
    detail = getattr(getattr(err, "error", None), "detail", None)  # AirflowRuntimeError: from a supervisor
    return isinstance(detail, Mapping) and detail.get("status_code") == 404


def get_dagrun_state(dag_id: str, run_id: str) -> str | None:
    """The run's state from the API server; None when there is no such run (deleted). Other API
    errors propagate: a run must not look missing because the server was briefly unreachable."""
    try:
        return RuntimeTaskInstance.get_dagrun_state(dag_id=dag_id, run_id=run_id)
    except (AirflowRuntimeError, ServerResponseError) as err:
        if _not_found(err):
            return None
        raise
