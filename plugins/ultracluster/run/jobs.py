"""What a Slurm job's end means for its task, and the auto-resume record's rules.

The Slurm wait reports how the job ended (an event, ``run.events``); these functions decide what the
task does next: return, resume after a node fault (or after the node health gate failed), fail at
once, or fail and let Airflow retry.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ultracluster.run.events import SUCCESS, deterministic
from ultracluster.run.health import HEALTH_GATE_EXIT_CODE
from ultracluster.run.states import is_node_fault

SUCCEEDED = "succeeded"
REFUSED = "refused"  # the job's own UC_ERROR: its input is wrong, a retry meets the same
NODE_FAULT = "node_fault"  # a node failed under the job: resume from a checkpoint
UNHEALTHY = "unhealthy"  # the node health gate failed before training: drain the nodes, then as NODE_FAULT
FINAL = "final"  # no retry helps (budget, host key)
RETRY = "retry"  # anything else: Airflow's retries may pass


def job_outcome(event: Mapping[str, Any], error_reasons: Sequence[str] = (), *, health_gate: bool = False) -> str:
    """The task's next step after the Slurm wait's event; ``error_reasons``: the job's UC_ERROR lines;
    ``health_gate``: the job ran the node health gate (``run.health``) first."""
    if event.get("status") == SUCCESS:
        return SUCCEEDED
    if deterministic(event):
        return FINAL
    # Only the wrap exits with the gate's code, and only when the gate step failed (not a lost node).
    if (health_gate and event.get("reason") == "job_failed" and event.get("state") == "FAILED"
            and event.get("exit_code") == HEALTH_GATE_EXIT_CODE):
        return UNHEALTHY
    if error_reasons:
        return REFUSED
    if event.get("reason") == "job_failed" and is_node_fault(event.get("state"), event.get("job_reason")):
        return NODE_FAULT
    return RETRY


def resume_refusal(attempts: int, failed_jobs: Sequence[Any]) -> str | None:
    """Why a node fault is not resumed (None: resume), given ``auto_resume_attempts`` and the jobs
    the resumes so far replaced. No Airflow retry either way: it would start a fresh job from step 0."""
    if attempts == 0:
        return "auto-resume is off: auto_resume_attempts=0"
    if len(failed_jobs) >= attempts:
        return (f"Node fault again after {len(failed_jobs)} of {attempts} auto-resume attempt(s) (earlier failed "
                f"jobs: {', '.join(str(j) for j in failed_jobs)}); giving up.")
    return None


def resume_summary(record: Mapping[str, Any]) -> dict[str, Any]:
    """What results.json (``parameters."Auto resume"``) and the XCom say about the resumes."""
    history = [
        {**{key: entry.get(key) for key in ("failed_job_id", "state", "last_step", "from_step", "steps_lost", "job_id")},
         # The nodes the health gate drained before this resume ({node: reason}).
         **({"drained": entry["drained"]} if entry.get("drained") else {})}
        for entry in record.get("resumes", [])
    ]
    summary = {"resumes": len(history), "steps_lost": sum(e["steps_lost"] or 0 for e in history), "history": history,
               "nodes_lost": dict(record.get("nodes_lost") or {})}
    if record.get("relaunches"):  # jobs EC2 found no capacity for, submitted again (not resumes)
        summary["relaunches"] = [{key: entry.get(key) for key in ("failed_job_id", "capacity_error", "job_id")}
                                 for entry in record["relaunches"]]
    return summary


def resume_point(candidates: Sequence[tuple[int | None, str | None]], resume_ckpt_step: int | None,
                 ) -> tuple[int | None, str | None]:
    """(step, output dir) to resume from: the newest of the earlier jobs' checkpoints
    (``candidates``), unless the run's own resume_from checkpoint (``resume_ckpt_step``, dir None:
    the program takes RESUME_CKPT) is as new or newer."""
    best: tuple[int | None, str | None] = (None, None)
    for step, directory in candidates:
        if step is not None and (best[0] is None or step > best[0]):
            best = (step, directory)
    if resume_ckpt_step is not None and (best[0] is None or resume_ckpt_step >= best[0]):
        return resume_ckpt_step, None
    return best
