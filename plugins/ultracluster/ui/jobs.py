"""A Slurm task's job, read from Airflow's metadata DB in the API server (no SSH from the UI).

- the task instance: its state and try;
- the Slurm Job link's XCom (``SLURM_JOB_KEY``, docs/contracts.md): pushed at submission (job id,
  log path, cluster), again with ``state`` when the job ended, so a job that is still running, or
  whose task failed, is shown too;
- the SlurmJobOperator's return value once the task succeeded: Slurm's final state, exit code, paths;
- ``wait_for_fleet``'s return value: the head node's address.
"""
from __future__ import annotations

import re
from typing import Any

# The Slurm Job link's values, pushed by the SlurmJobOperator (docs/contracts.md, "Slurm job page").
SLURM_JOB_KEY = "ultracluster_slurm_job"
HEAD_NODE_TASK = "wait_for_fleet"
RUN_ID_PATTERN = r"^[A-Za-z0-9_.~:+-]{1,250}$"  # Airflow's default allowed_run_id_pattern, bounded
TASK_ID_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,249}$"
_RUN_ID, _TASK_ID = re.compile(RUN_ID_PATTERN), re.compile(TASK_ID_PATTERN)
_WAITING = {"deferred": "submitted; the task's trigger follows it (PENDING or RUNNING in Slurm)",
            "running": "being submitted or followed by the task",
            "up_for_retry": "the task will retry: the job is looked for again, or resubmitted",
            "queued": "the task is queued", "scheduled": "the task is scheduled"}


def valid_ids(run_id: str, task_id: str) -> bool:
    return bool(_RUN_ID.match(run_id or "")) and bool(_TASK_ID.match(task_id or ""))


def _value(row: Any) -> Any:
    from airflow.models.xcom import XComModel

    return XComModel.deserialize_value(row)


def job_facts(session: Any, dag_id: str, run_id: str, task_id: str) -> dict[str, Any] | None:
    """What the job page shows; None when the task instance does not exist."""
    from airflow.models.taskinstance import TaskInstance
    from airflow.models.xcom import XComModel
    from sqlalchemy import select

    ti = session.scalar(select(TaskInstance).where(
        TaskInstance.dag_id == dag_id, TaskInstance.run_id == run_id, TaskInstance.task_id == task_id,
        TaskInstance.map_index == -1))
    if ti is None:
        return None
    xcoms: dict[tuple[str, str], Any] = {}
    query = XComModel.get_many(run_id=run_id, dag_ids=dag_id, task_ids=[task_id, HEAD_NODE_TASK], map_indexes=-1)
    for row in session.scalars(query.where(XComModel.key.in_(["return_value", SLURM_JOB_KEY]))):
        xcoms.setdefault((row.task_id, row.key), _value(row))
    return facts_of(dag_id, run_id, task_id, str(ti.state) if ti.state is not None else None, ti.try_number,
                    submitted=xcoms.get((task_id, SLURM_JOB_KEY)), result=xcoms.get((task_id, "return_value")),
                    head_node=xcoms.get((HEAD_NODE_TASK, "return_value")))


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def facts_of(dag_id: str, run_id: str, task_id: str, task_state: str | None, try_number: Any, *,
             submitted: Any, result: Any, head_node: Any) -> dict[str, Any]:
    """The page's facts from the task's state and XCom values (pure: the unit tests' entry)."""
    submitted, result, head_node = _dict(submitted), _dict(result), _dict(head_node)
    job_id = result.get("job_id") or submitted.get("job_id")
    state, note = result.get("state") or submitted.get("state"), None
    if state is None and job_id:
        # Slurm's own state is read by the task's trigger over SSH; the page never connects anywhere.
        if task_state in _WAITING:
            state = "not ended"
            note = f"Task {task_state}: {_WAITING[task_state]}."
        elif task_state == "failed":
            state = "ended, task failed"
            note = "The task failed: its log has Slurm's final state and the job log's last lines."
        else:
            state = "unknown"
            note = f"Task {task_state}; the job's end was not recorded."
    where, cluster = None, head_node.get("cluster_name") or submitted.get("cluster_name")
    if cluster or head_node.get("address"):
        where = f"{cluster or '?'}" + (f" ({head_node['address']})" if head_node.get("address") else "")
    return {
        "dag_id": dag_id, "run_id": run_id, "task_id": task_id, "task_state": task_state,
        "try_number": try_number, "job_id": job_id, "job_state": state, "job_state_note": note,
        "exit_code": result.get("exit_code"), "log_path": result.get("log_path") or submitted.get("log_path"),
        "output_dir": result.get("output_dir") or submitted.get("output_dir"), "head_node": where,
    }
