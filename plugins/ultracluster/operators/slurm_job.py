"""One Slurm job of one task, as a unit: submit, reattach, status, wait, cancel and what it left.

Idempotency: the job name is derived from dag_id/run_id/task_id (+ map index, ``run.names``) and the
run id goes in ``--comment``. ``find`` reattaches to the id kept in the task state store (only if
Slurm reports that id under this job's name: a rebuilt cluster reuses ids), then to a live or
recently finished job of that name; only a failed earlier job (or none) leads to a new submission.
Resuming after a node fault is ``slurm_resume.py``'s; the same ``find`` reattaches to a resumed job.
"""
from __future__ import annotations

import json
import logging
import os
import posixpath
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ultracluster import remote_commands
from ultracluster.hooks.slurm import JobStatus, SlurmHook
from ultracluster.parsers.job_end import job_end_result
from ultracluster.parsers.progress import JobLog, parse_progress_line
from ultracluster.run.contracts import (
    newest_checkpoint,
    output_dir,
)
from ultracluster.run.events import event
from ultracluster.run.health import GATE_SCRIPT
from ultracluster.run.returns import job_results_path
from ultracluster.run.states import JOB_SUCCESS_STATES, job_is_active

# Key in the task state store; renaming it breaks reattach for in-flight retries.
STATE_KEY_JOB_ID = "slurm_job_id"
_READ_BYTES = 262_144


def env_value(value: Any) -> str:
    """A job variable as a string. Native rendering turns a template's JSON back into a dict or
    list (or None): those go out as JSON, None as empty."""
    if value is None:
        return ""
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True)
    return str(value)


@dataclass
class JobSpec:
    """What ``sbatch`` runs (``remote_commands.sbatch``'s arguments, checked when built)."""

    name: str
    job_dir: str
    run_script: str
    num_nodes: int
    env: dict[str, str]
    launcher: str | None = None
    launcher_dirs: Sequence[str] = ()
    launcher_fallback_env: Mapping[str, str] | None = None
    partition: str | None = None
    time_limit_minutes: int | None = None
    training_files_dir: str | None = None
    health_gate: str | None = None  # the instance type the node health gate checks for (None: no gate)

    @property
    def output_root(self) -> str:
        return self.env.get("OUTPUT_ROOT") or self.job_dir

    def sbatch_args(self, run_id: str, env: Mapping[str, str] | None = None) -> dict[str, Any]:
        # The training venv's bin/ first: neuron_parallel_compile is installed with neuronx-cc there.
        python = self.env.get("TRAINING_PYTHON") or ""
        first = [posixpath.dirname(python)] if posixpath.isabs(python) else []
        args = dict(
            job_dir=self.job_dir, script_path=posixpath.join(self.job_dir, self.run_script), num_nodes=self.num_nodes,
            job_name=self.name, comment=f"ultracluster run_id={run_id}", job_env=self.env if env is None else env,
            launcher=self.launcher, launcher_dirs=list(dict.fromkeys([*first, *self.launcher_dirs])),
            launcher_fallback_env=self.launcher_fallback_env, partition=self.partition,
            time_limit_minutes=self.time_limit_minutes,
            health_check=posixpath.join(self.job_dir, GATE_SCRIPT) if self.health_gate else None)
        remote_commands.sbatch(**args)  # builds and checks the command without running it
        return args


def _newest(jobs: Sequence[Any]) -> Any | None:
    def job_number(job: Any) -> int:
        head = str(job.job_id).split("_", 1)[0]
        return int(head) if head.isdigit() else -1

    return max(jobs, key=job_number, default=None)


class SlurmJob:
    """The lifecycle of one task's Slurm job on one cluster (``hook``: that cluster's SlurmHook)."""

    def __init__(self, hook: SlurmHook, spec: JobSpec, log: logging.Logger | Any) -> None:
        self.hook = hook
        self.spec = spec
        self.log = log

    # --------------------------------------------------------------------------- files and names
    def log_path(self, job_id: str) -> str:
        return remote_commands.job_file(self.spec.job_dir, job_id, "out")

    def output_dir(self, job_id: str) -> str:
        return output_dir(self.spec.output_root, job_id)

    def copy_training_files(self) -> None:
        """Copy include/training into the job directory (temp name + rename: safe to repeat)."""
        head_node = self.hook.head_node_hook
        head_node.check(remote_commands.make_dirs(self.spec.job_dir, self.spec.output_root))
        source = self.spec.training_files_dir
        if source is None:
            return
        files = [(os.path.join(source, entry), posixpath.join(self.spec.job_dir, entry),
                  0o755 if entry.endswith((".sh", ".py")) else 0o644)
                 for entry in sorted(os.listdir(source))
                 if os.path.isfile(os.path.join(source, entry)) and not entry.startswith(".")]
        head_node.put_files(files)
        self.log.info("Copied %s to %s", source, self.spec.job_dir)

    # ------------------------------------------------------------------------- submit, reattach
    def submit(self, run_id: str, env: Mapping[str, str] | None = None) -> str:
        """sbatch the job (``env``: another environment than the spec's, a resume's)."""
        if env is None:
            self.copy_training_files()
        job_id = self.hook.sbatch(**self.spec.sbatch_args(run_id, env))
        self.log.info("Submitted Slurm job %s (%s, %d node(s)); log %s", job_id, self.spec.name,
                      self.spec.num_nodes, self.log_path(job_id))
        return job_id

    def find(self, stored: str | None, run_id: str) -> str | None:
        """A job of this task to reattach to: ``stored`` (the state store's id) first, then by name."""
        if stored:
            stored = str(stored)
            status = self._stored_status(stored, run_id)
            if status is None:
                self.log.warning("Stored Slurm job %s is not this task's job %s (the cluster was rebuilt and "
                                 "reuses ids); ignoring it", stored, self.spec.name)
            elif not status.terminal or status.succeeded:
                self.log.info("Reattaching to Slurm job %s from the task state store (%s)", stored, status.state)
                return stored
            else:
                self.log.info("Stored Slurm job %s ended %s; submitting a new one", stored, status.state)
        candidates = [job for job in self.hook.squeue_by_name(self.spec.name)
                      if job_is_active(job.state) or job.state in JOB_SUCCESS_STATES]
        if newest := _newest(candidates):
            self.log.info("Reattaching to Slurm job %s (%s) found by name %s", newest.job_id, newest.state,
                          self.spec.name)
            return newest.job_id
        return None

    def _stored_status(self, job_id: str, run_id: str) -> JobStatus | None:
        """Status of the stored job id, or None when that id now belongs to another job: it is this
        task's job only if Slurm reports this task's name (and run id in the comment, where squeue
        still shows it)."""
        queued = self.hook.squeue_job(job_id)
        if queued and (queued[0].name != self.spec.name or f"run_id={run_id}" not in (queued[0].comment or "")):
            return None
        status = self.status(job_id)
        if status.state != "UNKNOWN" and status.name != self.spec.name:
            return None
        return status

    # ----------------------------------------------------------------------- status, wait, cancel
    def status(self, job_id: str) -> JobStatus:
        return self.hook.job_status(job_id, self.spec.job_dir, job_name=self.spec.name)

    def cancel(self, job_id: str) -> None:
        self.hook.scancel(job_id)

    def wait(self, job_id: str, job_log: JobLog, *, interval_s: float) -> dict[str, Any]:
        """A worker-side wait (no triggerer): the trigger's checks, polled. Returns the same event."""
        while True:
            status = self.status(job_id)
            if status.name and status.name != self.spec.name:
                return event("job_renamed", f"Slurm job {job_id} is now {status.name!r}, not {self.spec.name!r}",
                             job_id=job_id, log_offset=job_log.offset)
            while True:
                chunk = self.hook.read_log_chunk(self.log_path(job_id), job_log.offset, _READ_BYTES)
                if not job_log.consume(chunk.size, chunk.data, _READ_BYTES):
                    break
            job_log.flush(final=status.terminal)
            fields = {"job_id": job_id, "log_offset": job_log.offset, "last_progress": job_log.last_progress,
                      "results_path": job_log.results_path}
            if job_log.over_budget and not status.terminal:
                self.cancel(job_id)
                return event("budget_exceeded", f"{job_log.over_budget}; job {job_id} cancelled", **fields)
            if status.terminal:
                return event("complete" if status.succeeded else "job_failed", f"Slurm job {job_id} ended "
                             f"{status.state}", **fields, **status.to_dict())
            time.sleep(interval_s)

    # ------------------------------------------------------------------------- what it left
    def tail(self, job_id: str, lines: int) -> str:
        return self.hook.tail_log(self.log_path(job_id), lines)

    def failure_message(self, event_: Mapping[str, Any], tail_lines: int) -> str:
        """One line of how the job ended, then the tail of its log."""
        state = event_.get("state") or event_.get("reason")
        parts = [f"Slurm job {event_.get('job_id')} ended {state}"]
        if event_.get("exit_code") is not None:
            parts.append(f"exit code {event_['exit_code']}"
                         + (f" (signal {event_['signal']})" if event_.get("signal") else ""))
        if event_.get("job_reason"):
            parts.append(f"reason {event_['job_reason']}")
        if event_.get("message"):
            parts.append(str(event_["message"]))
        path = self.log_path(str(event_.get("job_id")))
        try:
            tail = self.tail(str(event_.get("job_id")), tail_lines).rstrip()
        except Exception as err:  # the message must still go out when the head node is gone
            tail = f"(log tail unavailable: {err})"
        return "; ".join(parts) + f"\n--- last {tail_lines} lines of {path} ---\n{tail or '(empty)'}"

    def task_end(self, job_id: str, **worker: Any) -> dict[str, Any]:
        """What the return value of a completed job needs beside the wait's event (``SlurmJobTrigger``'s
        ``task_end``); ``worker``: ``started_at``, ``auto_resume``, ``link_key``, ``link``."""
        return {"output_dir": self.output_dir(job_id), "job_name": self.spec.name, "health_gate": self.spec.health_gate,
                "launcher": bool(self.spec.launcher), **worker}

    def succeeded(self, event_: Mapping[str, Any], end: Mapping[str, Any]) -> dict[str, Any]:
        """The task's return value after the wait's ``complete`` event (``end``: ``task_end``'s), read and
        built as ``SlurmJobTrigger`` does when it ends the task itself."""
        job_id = str(event_.get("job_id"))
        results_path = job_results_path(event_, end["output_dir"])
        files = self.hook.job_end_files(self.spec.job_dir, job_id, results_path, health_gate=bool(end["health_gate"]),
                                        launcher=bool(end["launcher"]))
        return job_end_result(event_, end, files, log_path=self.log_path(job_id), results_path=results_path,
                              log=self.log)

    def checkpoints(self, output_dirs: Sequence[str]) -> list[tuple[int | None, str]]:
        """(step, dir) of the newest complete checkpoint in each of ``output_dirs``."""
        found = []
        for directory in dict.fromkeys(output_dirs):
            listing = self.hook.head_node_hook.check(
                remote_commands.list_files(posixpath.join(directory, "checkpoints"), max_depth=1)).stdout
            found.append((newest_checkpoint(listing), directory))
        return found

    def failed_nodes(self, event_: Mapping[str, Any]) -> dict[str, str]:
        """The nodes of an ended job that are down, drained or failing, or already powered down with a
        failure reason (ParallelCluster replaced them fast): node -> "state: reason"."""
        if not event_.get("nodes"):
            self.log.warning("Slurm reported no node list for job %s: its lost nodes are not counted",
                             event_.get("job_id"))
            return {}
        return {node.name: f"{node.state}: {node.reason or 'no reason given'}"
                for node in self.hook.sinfo(nodes=str(event_["nodes"]))
                if node.is_unusable or node.failure_reported}

    def last_logged(self, job_id: str):
        """The last ``UC_PROGRESS`` line near the end of a job's log (``parsers.progress.Progress``)."""
        lines = self.tail(job_id, 200).splitlines()
        found = [p for line in lines if (p := parse_progress_line(line.strip())) is not None]
        return found[-1] if found else None

