"""Ending a task from its trigger: Airflow 3's ``TaskSuccessEvent``, with the task's return value.

The triggerer then marks the task successful and pushes the XComs itself (``airflow.models.trigger``'s
``handle_event_submit``): no worker resumes the task, so its successor starts one Airflow hop
sooner. A trigger ends its task only when the task asked for it and the wait succeeded
(``run.returns.ends_task``), with the return value the operator's worker path would build
(``run.returns``). Every other end is the plain event (``run.events``), and the worker decides.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from airflow.triggers.base import TaskSuccessEvent, TriggerEvent

RETURN_KEY = "return_value"  # Airflow's own key of a task's return value


def task_success(log: Any, payload: Mapping[str, Any], result: Any, **xcoms: Any) -> TriggerEvent:
    """End the task: ``result`` as its return value, ``xcoms`` (key -> value) beside it."""
    log.info("%s. The task ends here, from the triggerer: no worker resumes it.", payload.get("message") or "Done")
    log.info("Returned value was: %s", result)
    return TaskSuccessEvent(xcoms={RETURN_KEY: result, **xcoms})
