"""Auto-resume of a Slurm job after a node fault: the record, and the resubmission from the newest
checkpoint (docs/operations.md, "Auto-resume"). Whether to resume is ``run.jobs``' call. Also the
relaunch of a job that never started because EC2 had no capacity for its nodes (docs/operations.md,
"Capacity faults"): submitted again as it was, not counted as a resume.

The task state store keeps the record (``STATE_KEY_AUTO_RESUME``): one entry per resume, written
before its sbatch and completed with the new job id after it, so a retry after a worker crash
reattaches to the resumed job (found by name like any job of the task) or, if the crash came
between the two writes and no job exists, submits that same resume instead of starting over.
"""
from __future__ import annotations

import json
import posixpath
from collections.abc import Mapping
from typing import Any

from airflow.sdk.exceptions import AirflowFailException

from ultracluster.operators.slurm_job import SlurmJob
from ultracluster.run.contracts import newest_checkpoint
from ultracluster.run.jobs import resume_point, resume_refusal, resume_summary
from ultracluster.run.lost_nodes import LostNodes, capacity_denied

# Key in the task state store; renaming it breaks auto-resume for in-flight retries.
STATE_KEY_AUTO_RESUME = "slurm_auto_resume"


class ResumeRecord:
    """The task's resumes: ``{"resumes": [{"failed_job_id", "state", "reason", "last_step", "job_id",
    "from_step", "resume_dir", "steps_lost"}], "target_step"}`` in the task state store."""

    def __init__(self, store: Any) -> None:
        self.store = store
        data = store.get(STATE_KEY_AUTO_RESUME) if store is not None else None
        self.data = data if isinstance(data, dict) and isinstance(data.get("resumes"), list) else {"resumes": []}

    @property
    def resumes(self) -> list[dict[str, Any]]:
        return self.data["resumes"]

    @property
    def pending(self) -> bool:
        """The last resume was decided but has no job yet (the worker died between its two writes)."""
        return bool(self.resumes) and not self.resumes[-1].get("job_id")

    def save(self) -> None:
        if self.store is not None:
            self.store.set(STATE_KEY_AUTO_RESUME, self.data)

    def reset(self) -> None:
        """A fresh start: no resumes behind it."""
        self.data = {"resumes": []}
        self.save()

    def add(self, event: Mapping[str, Any], drained: Mapping[str, str] | None = None) -> None:
        """Decide a resume of the job ``event`` reports ended in a node fault (``drained``: the nodes
        the health gate drained, ``{node: reason}``)."""
        last = event.get("last_progress") or {}
        if self.data.get("target_step") is None:
            self.data["target_step"] = last.get("total")  # the step the first job was to end at
        entry = {"failed_job_id": str(event.get("job_id")), "state": event.get("state"),
                 "reason": event.get("job_reason"), "last_step": last.get("step"), "job_id": None}
        if drained:
            entry["drained"] = dict(drained)
        self.resumes.append(entry)
        self.save()

    def summary(self) -> dict[str, Any]:
        return resume_summary(self.data)

    @property
    def relaunch_pending(self) -> bool:
        """The last relaunch was decided but has no job yet."""
        relaunches = self.data.get("relaunches") or []
        return bool(relaunches) and not relaunches[-1].get("job_id")

    def add_relaunch(self, failed_job_id: str, capacity_error: str) -> None:
        """Decide to submit again the job EC2 found no capacity for (once per failed job)."""
        relaunches = self.data.setdefault("relaunches", [])
        if not relaunches or relaunches[-1]["failed_job_id"] != str(failed_job_id):
            relaunches.append({"failed_job_id": str(failed_job_id), "capacity_error": capacity_error, "job_id": None})
        self.save()


def submit_relaunch(job: SlurmJob, record: ResumeRecord, run_id: str, attempts: int) -> str:
    """sbatch the pending relaunch: the job as it was (a resume: that same resume, again)."""
    entry = record.data["relaunches"][-1]
    if record.resumes and record.resumes[-1].get("job_id") == entry["failed_job_id"]:
        record.resumes[-1]["job_id"] = None  # that resume never ran
        job_id = submit_resume(job, record, run_id, attempts)
    else:
        job.log.warning("Submitting job %s again (it never started: %s)", entry["failed_job_id"],
                        entry["capacity_error"])
        job_id = job.submit(run_id)
    entry["job_id"] = job_id
    record.save()
    return job_id


def plan_resubmission(record: ResumeRecord, event: Mapping[str, Any], failed: Mapping[str, str],
                      drained: Mapping[str, str] | None, attempts: int, message: str, lost: LostNodes,
                      log: Any) -> None:
    """After a node fault within the lost-node rule: a relaunch when EC2 had no capacity for the job's
    nodes, else a resume as ``auto_resume_attempts`` allows; AirflowFailException when neither."""
    job_id = str(event.get("job_id"))
    if (capacity := None if drained else capacity_denied(failed)) is not None:
        # Its nodes never launched, so the job never ran: not a resume, whatever auto_resume_attempts says.
        record.add_relaunch(job_id, capacity)
        log.warning("Slurm job %s never started: EC2 had no capacity for its node(s) (%s); submitting it again "
                    "once ParallelCluster launches them again (losses/allowed: %s)", job_id, capacity,
                    lost.describe())
        return
    refusal = resume_refusal(attempts, [e.get("failed_job_id") for e in record.resumes])
    if refusal:
        raise AirflowFailException(f"{refusal} {message}" if record.resumes else f"{message}\n({refusal})")
    record.add(event, drained)
    log.warning("Slurm job %s ended %s (%s): auto-resume %d of %d once the fleet is healthy", job_id,
                event.get("state"), f"unhealthy nodes drained: {', '.join(drained)}" if drained else "a node fault",
                len(record.resumes), attempts)


def submit_resume(job: SlurmJob, record: ResumeRecord, run_id: str, attempts: int) -> str:
    """sbatch the record's pending resume with ``RESUME_DIR`` at the newest checkpoint."""
    env = dict(job.spec.env)
    entry = record.resumes[-1]
    # Every earlier job of this task may hold the newest checkpoint (one that died before its first
    # checkpoint leaves none), and so may the run's own RESUME_DIR.
    dirs = [job.output_dir(e["failed_job_id"]) for e in record.resumes]
    if env.get("RESUME_DIR"):
        dirs.append(env["RESUME_DIR"])
    # resume_from's checkpoint (RESUME_CKPT) stays in the job's env; the program takes it when newest.
    first = newest_checkpoint(posixpath.basename(env.get("RESUME_CKPT") or ""))
    from_step, resume_dir = resume_point(job.checkpoints(dirs), first)
    if entry.get("last_step") is None and (logged := job.last_logged(entry["failed_job_id"])):
        # The trigger saw no progress line (it restarted after the job's last one): the log has it.
        entry["last_step"] = logged.step
        if record.data.get("target_step") is None:
            record.data["target_step"] = logged.total
    last = entry.get("last_step")
    entry.update(from_step=from_step or 0, resume_dir=resume_dir,
                 steps_lost=None if last is None else max(0, int(last) - (from_step or 0)))
    if resume_dir:
        env["RESUME_DIR"] = resume_dir
    target = record.data.get("target_step")
    if target is not None and from_step is not None:
        env["STEPS_THIS_RUN"] = str(max(1, int(target) - from_step))  # end where the first job was to
    env["AUTO_RESUME"] = json.dumps(record.summary(), sort_keys=True)
    record.save()
    job.log.warning(
        "Auto-resume %d of %s: job %s ended %s at step %s; resuming from step %d (%s), %s step(s) lost",
        len(record.resumes), attempts, entry["failed_job_id"], entry["state"],
        last if last is not None else "unknown", from_step or 0,
        f"checkpoint in {resume_dir}" if resume_dir else "no checkpoint: from the start",
        entry["steps_lost"] if entry["steps_lost"] is not None else "unknown")
    job_id = job.submit(run_id, env=env)
    entry["job_id"] = job_id
    record.save()
    return job_id


def submit_again(job: SlurmJob, record: ResumeRecord, run_id: str, attempts: int) -> str:
    """The pending relaunch (a job EC2 had no capacity for), else the pending resume."""
    return (submit_relaunch if record.relaunch_pending else submit_resume)(job, record, run_id, attempts)
