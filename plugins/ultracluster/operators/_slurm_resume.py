"""Auto-resume for SlurmJobOperator: after a node fault, wait for the fleet, resubmit from the newest
checkpoint (docs/operations.md, "Auto-resume").

The task state store keeps the record (``STATE_KEY_AUTO_RESUME``): one entry per resume, written
before its sbatch and completed with the new job id after it, so a retry after a worker crash
reattaches to the resumed job (found by name like any job of the task) or, if the crash came
between the two writes and no job exists, submits that same resume instead of starting over.
"""

from __future__ import annotations

import asyncio
import json
import posixpath
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow.sdk.exceptions import AirflowException, AirflowFailException

if TYPE_CHECKING:
    from airflow.sdk import Context

# Key in the task state store; renaming it breaks auto-resume for in-flight retries.
STATE_KEY_AUTO_RESUME = "slurm_auto_resume"


def resume_attempts(value: Any) -> int:
    """The ``auto_resume_attempts`` value (rendered templates arrive as text)."""
    try:
        attempts = int(str(value).strip())
    except ValueError:
        raise ValueError(f"auto_resume_attempts must be an integer >= 0, got {value!r}") from None
    if attempts < 0:
        raise ValueError(f"auto_resume_attempts must be an integer >= 0, got {value!r}")
    return attempts


def resume_summary(record: dict[str, Any]) -> dict[str, Any]:
    """What results.json (``parameters."Auto resume"``) and the XCom say about the resumes."""
    history = [
        {key: entry.get(key) for key in ("failed_job_id", "state", "last_step", "from_step", "steps_lost", "job_id")}
        for entry in record.get("resumes", [])
    ]
    return {"resumes": len(history), "steps_lost": sum(e["steps_lost"] or 0 for e in history), "history": history}


class SlurmAutoResumeMixin:
    """Needs SlurmJobOperator's ``hook``, ``head_node``, ``job_env``, ``auto_resume_attempts`` and friends."""

    # ------------------------------------------------------------------------------ record

    def _resume_record(self, context: Context) -> dict[str, Any]:
        store = context.get("task_state_store")
        record = store.get(STATE_KEY_AUTO_RESUME) if store is not None else None
        return record if isinstance(record, dict) and isinstance(record.get("resumes"), list) else {"resumes": []}

    def _save_resume_record(self, context: Context, record: dict[str, Any]) -> None:
        store = context.get("task_state_store")
        if store is not None:
            store.set(STATE_KEY_AUTO_RESUME, record)

    def _pending_resume(self, context: Context) -> dict[str, Any] | None:
        """The whole record when its last resume was decided but has no job yet, else None."""
        record = self._resume_record(context)
        return record if record["resumes"] and not record["resumes"][-1].get("job_id") else None

    # ---------------------------------------------------------------------------- decision

    def node_fault(self, context: Context, event: dict[str, Any], message: str) -> dict[str, Any]:
        """A job ended in a node fault: resume it if attempts remain, else fail naming them."""
        attempts = resume_attempts(self.auto_resume_attempts)
        record = self._resume_record(context)
        done = len(record["resumes"])
        # No Airflow retry either: it would start a fresh job from step 0, the opposite of what was asked.
        if attempts == 0:
            raise AirflowFailException(f"{message}\n(auto-resume is off: auto_resume_attempts=0)")
        if done >= attempts:
            jobs = ", ".join(str(e.get("failed_job_id")) for e in record["resumes"])
            raise AirflowFailException(
                f"Node fault again after {done} of {attempts} auto-resume attempt(s) (earlier failed jobs: {jobs}); "
                f"giving up. {message}"
            )
        last = event.get("last_progress") or {}
        if record.get("target_step") is None:
            record["target_step"] = last.get("total")  # the step the first job was to end at
        record["resumes"].append({"failed_job_id": str(event.get("job_id")), "state": event.get("state"),
                                  "reason": event.get("reason"), "last_step": last.get("step"), "job_id": None})
        self._save_resume_record(context, record)
        self.log.warning("Slurm job %s ended %s (a node fault): auto-resume %d of %d once the fleet is healthy",
                         event.get("job_id"), event.get("state"), done + 1, attempts)
        trigger = self._fleet_trigger()
        if self.deferrable:
            self.defer(trigger=trigger, method_name="resume_after_fleet",
                       timeout=timedelta(seconds=self.resume_fleet_timeout))
        fleet = asyncio.run(asyncio.wait_for(self._first_event(trigger), self.resume_fleet_timeout))
        return self.resume_after_fleet(context, fleet)

    def _fleet_trigger(self):
        from airflow.sdk import BaseHook

        from ultracluster.triggers.fleet import ComputeFleetTrigger

        head = self.head_node
        return ComputeFleetTrigger(
            cluster_name=head["cluster_name"],
            num_nodes=int(self.num_nodes),
            partition=self.partition or head.get("partition"),
            pcluster_conn_id=self.pcluster_conn_id,
            ssh_conn_id=self.ssh_conn_id,
            ssh_port=int(BaseHook.get_connection(self.ssh_conn_id).port or 22),
            host_key=head.get("host_key"),
            keep_host_key=True,  # the key wait_for_fleet pinned: a cluster with another one is not resumed on
            poke_interval=self.poll_interval,
            region_name=self.region_name or None,
            # The dead node is down while it is replaced (minutes on AWS): that is what is waited for.
            stuck_after_s=self.resume_fleet_timeout,
        )

    def resume_after_fleet(self, context: Context, event: dict[str, Any]) -> dict[str, Any]:
        """The fleet trigger fired: resubmit (or reattach to a resume already submitted)."""
        if event.get("status") != "success":
            raise AirflowException(f"Auto-resume: the fleet did not recover: {event.get('message')}")
        self._validate()
        job_name = self._slurm_job_name(context)
        job_id = self.find_existing_job(context, job_name) or self.submit_resume(context, job_name)
        return self._wait(context, job_id, job_name)

    # ------------------------------------------------------------------------------ resume

    def _newest_checkpoint(self, output_dirs: list[str]) -> tuple[int | None, str | None]:
        """(step, output dir) of the newest complete checkpoint among ``output_dirs``."""
        from ultracluster import remote_commands
        from ultracluster.parsers.progress import newest_checkpoint

        best: tuple[int | None, str | None] = (None, None)
        for directory in dict.fromkeys(output_dirs):
            listing = self.hook.head_node_hook.check(
                remote_commands.list_files(posixpath.join(directory, "checkpoints"), max_depth=1)).stdout
            step = newest_checkpoint(listing)
            if step is not None and (best[0] is None or step > best[0]):
                best = (step, directory)
        return best

    def _last_logged(self, job_id: str):
        """The last ``UC_PROGRESS`` line near the end of a job's log (``parsers.progress.Progress``)."""
        from ultracluster.parsers.progress import parse_progress_line

        lines = self.hook.tail_log(self._log_path(job_id), lines=200).splitlines()
        found = [p for line in lines if (p := parse_progress_line(line.strip())) is not None]
        return found[-1] if found else None

    def submit_resume(self, context: Context, job_name: str) -> str:
        """sbatch the record's pending resume with ``RESUME_DIR`` at the newest checkpoint."""
        from ultracluster.parsers.progress import newest_checkpoint

        record = self._resume_record(context)
        entry = record["resumes"][-1]
        # Every earlier job of this task may hold the newest checkpoint (one that died before its
        # first checkpoint leaves none), and so may the run's own RESUME_DIR.
        dirs = [posixpath.join(self._output_root(), f"output_{e['failed_job_id']}") for e in record["resumes"]]
        if self.job_env.get("RESUME_DIR"):
            dirs.append(self.job_env["RESUME_DIR"])
        from_step, resume_dir = self._newest_checkpoint(dirs)
        # resume_from's checkpoint (RESUME_CKPT) stays in the job's env; the program takes it when newest.
        first = newest_checkpoint(posixpath.basename(self.job_env.get("RESUME_CKPT") or ""))
        if first is not None and (from_step is None or first >= from_step):
            from_step, resume_dir = first, None
        if entry.get("last_step") is None and (logged := self._last_logged(entry["failed_job_id"])):
            # The trigger saw no progress line (it restarted after the job's last one): the log has it.
            entry["last_step"] = logged.step
            if record.get("target_step") is None:
                record["target_step"] = logged.total
        last = entry.get("last_step")
        entry.update(from_step=from_step or 0, resume_dir=resume_dir,
                     steps_lost=None if last is None else max(0, int(last) - (from_step or 0)))
        env = dict(self.job_env)
        if resume_dir:
            env["RESUME_DIR"] = resume_dir
        target = record.get("target_step")
        if target is not None and from_step is not None:
            env["STEPS_THIS_RUN"] = str(max(1, int(target) - from_step))  # end where the first job was to
        env["AUTO_RESUME"] = json.dumps(resume_summary(record), sort_keys=True)
        self._save_resume_record(context, record)
        self.log.warning(
            "Auto-resume %d of %s: job %s ended %s at step %s; resuming from step %d (%s), %s step(s) lost",
            len(record["resumes"]), self.auto_resume_attempts, entry["failed_job_id"], entry["state"],
            last if last is not None else "unknown", from_step or 0,
            f"checkpoint in {resume_dir}" if resume_dir else "no checkpoint: from the start",
            entry["steps_lost"] if entry["steps_lost"] is not None else "unknown")
        job_id = self.hook.sbatch(**self._sbatch_args(job_name, context["ti"].run_id, job_env=env))
        entry["job_id"] = job_id
        self._save_resume_record(context, record)
        self.log.info("Submitted resumed Slurm job %s (%s); log %s", job_id, job_name, self._log_path(job_id))
        return job_id
