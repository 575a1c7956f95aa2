"""Reattach for SlurmJobOperator: find this task's job after a retry or a restart, never another's."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from airflow.sdk import Context

    from ultracluster.hooks.slurm import JobStatus

# Key in the task state store; renaming it breaks reattach for in-flight retries.
STATE_KEY_JOB_ID = "slurm_job_id"


def _newest(jobs: Sequence[Any]) -> Any | None:
    def job_number(job: Any) -> int:
        head = str(job.job_id).split("_", 1)[0]
        return int(head) if head.isdigit() else -1

    return max(jobs, key=job_number, default=None)


class SlurmReattachMixin:
    """Needs ``self.hook`` (SlurmHook), ``self.job_dir`` and ``self.log``."""

    def _reattachable(self, status: JobStatus | None) -> bool:
        return status is not None and (not status.terminal or status.succeeded)

    def find_existing_job(self, context: Context, job_name: str) -> str | None:
        """A job of this task to reattach to: stored id first, then by name. None: submit."""
        from ultracluster.parsers import slurm as parse

        store = context.get("task_state_store")
        stored = store.get(STATE_KEY_JOB_ID) if store is not None else None
        if stored:
            stored = str(stored)
            status = self._stored_job_status(stored, job_name, context["ti"].run_id)
            if status is None:
                self.log.warning(
                    "Stored Slurm job %s is not this task's job %s (the cluster was rebuilt and reuses ids); "
                    "ignoring it",
                    stored,
                    job_name,
                )
            elif self._reattachable(status):
                self.log.info("Reattaching to Slurm job %s from the task state store (%s)", stored, status.state)
                return stored
            else:
                self.log.info("Stored Slurm job %s ended %s; submitting a new one", stored, status.state)
        candidates = [
            job
            for job in self.hook.squeue_by_name(job_name)
            if parse.is_active(job.state) or job.state in parse.SUCCESS_STATES
        ]
        if newest := _newest(candidates):
            self.log.info("Reattaching to Slurm job %s (%s) found by name %s", newest.job_id, newest.state, job_name)
            return newest.job_id
        return None

    def _stored_job_status(self, job_id: str, job_name: str, run_id: str) -> JobStatus | None:
        """Status of the stored job id, or None when that id now belongs to another job.

        A stored id outlives the cluster (a cleared setup builds a new one in the same run, and its
        job ids restart at 1): it is this task's job only if Slurm reports this task's name (and run
        id in the comment, where squeue still shows it).
        """
        queued = self.hook.squeue_job(job_id)
        if queued and (queued[0].name != job_name or f"run_id={run_id}" not in (queued[0].comment or "")):
            return None
        status = self.hook.job_status(job_id, self.job_dir, job_name=job_name)
        if status.state != "UNKNOWN" and status.name != job_name:
            return None
        return status
