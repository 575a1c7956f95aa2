"""Auto-resume of a Slurm job after a node fault: the record, and the resubmission from the newest
checkpoint (docs/operations.md, "Auto-resume"). Whether to resume is ``run.jobs``' call.

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

from ultracluster.operators.slurm_job import SlurmJob
from ultracluster.run.contracts import newest_checkpoint
from ultracluster.run.jobs import resume_point, resume_summary

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
