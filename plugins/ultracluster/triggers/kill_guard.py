"""on_kill guard shared by the triggers that cancel or delete remote work when a task is killed."""
from __future__ import annotations

import asyncio
from typing import Any

from airflow.sdk.execution_time.task_runner import RuntimeTaskInstance

# Bound on the state read: the triggerer gives on_kill 30 s in all, and on Airflow 3.3.2 the read can
# hang past that (no answer through the triggerer's comms), which would leave the job running.
STATE_READ_TIMEOUT_S = 5.0


async def task_is_still_deferred(task_instance: Any, timeout: float = STATE_READ_TIMEOUT_S) -> bool:
    """True when the task instance is still deferred, i.e. on_kill fired without a user kill.

    Works around an upstream bug where moving a trigger to another triggerer also calls on_kill:
    a user's mark-failed/success or clear changes the state first, a move does not. When the
    state cannot be read, or not within ``timeout``, return False (the kill is taken as real: the
    user asked for it).
    """
    if task_instance is None:
        return False
    map_index = getattr(task_instance, "map_index", -1)
    if map_index is None:
        map_index = -1
    try:
        # Sync SDK call through the triggerer's comms: run it off the event loop thread.
        states = await asyncio.wait_for(asyncio.to_thread(
            RuntimeTaskInstance.get_task_states,
            dag_id=task_instance.dag_id,
            task_ids=[task_instance.task_id],
            run_ids=[task_instance.run_id],
            map_index=map_index,
        ), timeout=timeout)
    except Exception:  # TimeoutError included
        return False
    # The execution API keys mapped instances as "<task_id>_<map_index>".
    key = task_instance.task_id if map_index < 0 else f"{task_instance.task_id}_{map_index}"
    state = (states or {}).get(task_instance.run_id, {}).get(key)
    return str(getattr(state, "value", state)).lower() == "deferred"


async def should_delete_on_kill(trigger: Any, what: str) -> bool:
    """True when a create-wait trigger's on_kill should delete what this run created: it was asked
    to (``delete_on_kill`` with an ``owner_run_id``) and the kill is a user's, not a hand-over."""
    if not (trigger.delete_on_kill and trigger.owner_run_id):
        return False
    if await task_is_still_deferred(trigger.task_instance):
        # A triggerer hand-over, not a user kill: the wait goes on elsewhere.
        trigger.log.warning("on_kill while the task is still deferred (trigger moved?); %s kept", what)
        return False
    return True
