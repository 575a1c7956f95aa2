"""Ending a task from its trigger: Airflow 3's ``TaskSuccessEvent``, after the task's XComs.

The triggerer then marks the task successful itself (``airflow.models.trigger``'s
``handle_event_submit``): no worker resumes the task, so its successor starts one Airflow hop
sooner. A trigger ends its task only when the task asked for it and the wait succeeded
(``run.returns.ends_task``), with the return value the operator's worker path would build
(``run.returns``). Every other end is the plain event (``run.events``), and the worker decides.

The XComs go through the Task SDK (``XCom.aset``: the triggerer's supervisor stores them through
the execution API, as a worker's), not in the event: Airflow 3.3.2 stores an event's ``xcoms`` as
JSON text, which a later task then reads back as a string, not the value
(tests/integration/test_task_end_events.py).

The triggerer's supervisor serves a trigger's first Task SDK request slowly in Airflow 3.3.2 (its
in-process execution API starts then: seconds, 25 s on the loaded 2-core machine, and the supervisor
serves nothing else meanwhile). ``warm_up`` makes a cheap request when a trigger that may end its
task starts, once per triggerer process, so that cost falls inside the wait, not after the awaited
change.

Only a triggerer ends a task: it gives a task's trigger its task instance. ``dag.test()`` (Airflow
3.3.2) runs a trigger inline without one, and would resume the task with the event's state string;
there the trigger yields the plain event and the worker path returns the same value.
"""
from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from typing import Any

from airflow.sdk.execution_time.xcom import XCom
from airflow.triggers.base import TaskSuccessEvent, TriggerEvent

from ultracluster.hooks.dag_runs import get_dagrun_state
from ultracluster.run.returns import ends_task

RETURN_KEY = "return_value"  # Airflow's own key of a task's return value
_warmed = {"done": False}  # per triggerer process


def warm_up(trigger: Any, asked: bool) -> None:
    """If ``trigger`` may end its task, start the supervisor's execution API now (``get_dagrun_state``
    of its own run, in a thread, in the background), the first time in this process."""
    ti = trigger.task_instance
    if not asked or ti is None or _warmed["done"]:
        return
    _warmed["done"] = True

    def request() -> None:
        with contextlib.suppress(Exception):  # only a warm-up: the task's end asks again
            get_dagrun_state(ti.dag_id, ti.run_id)

    asyncio.get_running_loop().run_in_executor(None, request)


def ending(trigger: Any, payload: Mapping[str, Any], asked: bool) -> bool:
    """Does ``trigger`` end its task with this event (``run.returns.ends_task``, in a triggerer)?"""
    return ends_task(payload, asked) and trigger.task_instance is not None


async def task_success(trigger: Any, end: TriggerEvent, result: Any, **xcoms: Any) -> TriggerEvent:
    """End ``trigger``'s task: ``result`` as its return value, ``xcoms`` (key -> value) beside it. If
    the XComs cannot be pushed, the plain event ``end`` resumes the task instead."""
    ti = trigger.task_instance
    map_index = ti.map_index if getattr(ti, "map_index", None) is not None else -1
    try:
        for key, value in {**xcoms, RETURN_KEY: result}.items():
            await XCom.aset(key, value, dag_id=ti.dag_id, task_id=ti.task_id, run_id=ti.run_id, map_index=map_index)
    except Exception as error:  # the supervisor did not take them: the worker path pushes its own
        trigger.log.warning("Pushing the task's XComs failed (%s): the task resumes on a worker", error)
        return end
    trigger.log.info("%s. The task ends here, from the triggerer: no worker resumes it.",
                     end.payload.get("message") or "Done")
    trigger.log.info("Returned value was: %s", result)
    return TaskSuccessEvent()
