"""parallel_compile and train: one Slurm batch job on the cluster, waited for deferrably.

Idempotency: the job name is derived from dag_id/run_id/task_id (+ map index) and the run id goes
in ``--comment``. Before submitting, the operator looks for the job id kept in the task state store
(only if Slurm reports that id under this task's job name: a rebuilt cluster reuses ids), then for
a live or recently finished job of that name (``squeue --states all``), and reattaches to it; only a
failed earlier job (or none) leads to a new submission. A node fault may instead resume the job
(``_slurm_resume``): the resumed job has the same name, so the same reattach finds it.
"""

from __future__ import annotations

import asyncio
import json
import os
import posixpath
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from ultracluster.clock import iso as _iso
from ultracluster.clock import utc_now
from ultracluster.hooks import DEFAULT_SSH_CONN_ID
from ultracluster.links import SlurmJobLink
from ultracluster.notifications import notify_budget_stop
from ultracluster.operators._slurm_compile import SlurmCompileFactsMixin
from ultracluster.operators._slurm_reattach import STATE_KEY_JOB_ID, SlurmReattachMixin
from ultracluster.operators._slurm_resume import SlurmAutoResumeMixin, resume_attempts, resume_summary
from ultracluster.operators.config import node_count

if TYPE_CHECKING:
    from airflow.sdk import Context

    from ultracluster.hooks.slurm import SlurmHook

DEFAULT_RUN_SCRIPT = "run_dp_bert_large_hf_pretrain_bf16_s128.sh"
# Where the Neuron apt packages (aws-neuronx-tools) put their programs.
NEURON_BIN = "/opt/aws/neuron/bin"
# Key in the task state store; renaming it breaks reattach for in-flight retries.
STATE_KEY_LOG_OFFSET = "slurm_log_offset"


def _env_value(value: Any) -> str:
    """A job variable as a string. Native rendering turns a template's JSON back into a dict or
    list (or None): those go out as JSON, None as empty."""
    if value is None:
        return ""
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True)
    return str(value)


class SlurmJobOperator(SlurmAutoResumeMixin, SlurmReattachMixin, SlurmCompileFactsMixin, BaseOperator):
    """Submit ``sbatch --exclusive --nodes N --wrap "srun [launcher] <run script>"`` and wait for it.

    :param head_node: the dict wait_for_fleet returned (address, pinned host key, partition).
    :param job_dir: job directory on shared storage; the training files are copied here.
    :param num_nodes: nodes for the job.
    :param job_env: environment for the run script (training job contract).
    :param extra_job_env: more variables for the job (tuning knobs such as TORCH_NUM_THREADS or
        NEURON_CC_FLAGS); they never override a ``job_env`` key.
    :param launcher: program srun runs the script under (``neuron_parallel_compile``), resolved on
        the node next to ``TRAINING_PYTHON``, then in ``launcher_dirs``, then on PATH. Missing: the
        job fails with ``UC_ERROR`` (no retry)...
    :param launcher_fallback_env: ...unless this is given (the local profile's explicit opt-in): the
        script then runs without the launcher, with these variables (``{"COMPILE_ONLY": "1"}``).
        The mode that ran is logged and returned as ``launch``.
    :param training_files_dir: local directory (include/training) copied into ``job_dir``.
    :param job_name: readable part of the Slurm job name (a hash of dag/run/task ids is appended).
    :param ssh_conn_id: SSH connection of the head node.
    :param deferrable: wait in the triggerer (default) instead of a worker slot.
    :param poll_interval: seconds between Slurm polls.
    :param partition: Slurm partition (queue); defaults to ``head_node["partition"]``.
    :param outage_timeout: seconds the head node may be unreachable while waiting.
    :param time_limit_minutes: Slurm ``--time``; None leaves the partition's limit.
    :param progress_log_interval_s: at most one progress line per this many seconds in the task log.
    :param progress_log_every_steps: instead, one progress line every this many steps (None: by time).
        The first and last steps and loss spikes are always shown; the job's log keeps every line.
    :param budget: ``{"max_usd", "usd_per_hour", "since"}``; a null ``max_usd`` turns it off. The
        trigger cancels the job once its progress projects the run's cost past ``max_usd``, and the
        task fails at once (no retry: a retry would only spend more).
    :param auto_resume_attempts: resumes after node faults (``parsers.slurm.is_node_fault``): the task
        waits for the fleet (the wait_for_fleet trigger), then resubmits from the newest checkpoint.
        0 = off: a node fault fails the task like any other failure.
    :param pcluster_conn_id: ParallelCluster connection of an auto-resume's fleet wait.
    :param region_name: region of that cluster (None: the connection's).
    :param resume_fleet_timeout: seconds an auto-resume waits for the fleet before the task fails.
    """

    template_fields: Sequence[str] = (
        "head_node",
        "job_dir",
        "num_nodes",
        "job_env",
        "extra_job_env",
        "launcher",
        "training_files_dir",
        "job_name",
        "partition",
        "budget",
        "auto_resume_attempts",
        "region_name",
    )
    ui_color = "#d4e6f1"
    operator_extra_links = (SlurmJobLink(),)

    def __init__(
        self,
        *,
        head_node: dict[str, Any] | str,
        job_dir: str,
        num_nodes: int | str,
        job_env: Mapping[str, str] | None = None,
        extra_job_env: Mapping[str, str] | str | None = None,
        launcher: str | None = None,
        training_files_dir: str | None = None,
        job_name: str | None = None,
        ssh_conn_id: str = DEFAULT_SSH_CONN_ID,
        deferrable: bool = True,
        poll_interval: float = 30,
        partition: str | None = None,
        run_script: str = DEFAULT_RUN_SCRIPT,
        launcher_fallback_env: Mapping[str, str] | None = None,
        launcher_dirs: Sequence[str] = (NEURON_BIN,),
        outage_timeout: float = 900,
        time_limit_minutes: int | None = None,
        log_tail_lines: int = 40,
        progress_log_interval_s: float = 30,
        progress_log_every_steps: int | None = None,
        budget: Mapping[str, Any] | None = None,
        auto_resume_attempts: int | str = 0,
        pcluster_conn_id: str = "pcluster_default",
        region_name: str | None = None,
        resume_fleet_timeout: float = 3600,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.auto_resume_attempts = auto_resume_attempts
        self.pcluster_conn_id = pcluster_conn_id
        self.region_name = region_name
        self.resume_fleet_timeout = float(resume_fleet_timeout)
        self.budget = budget
        self.head_node = head_node
        self.job_dir = job_dir
        self.num_nodes = num_nodes
        self.job_env = dict(job_env or {})
        self.extra_job_env = extra_job_env if extra_job_env is not None else {}  # may be a template
        self.launcher = launcher
        self.training_files_dir = training_files_dir
        self.job_name = job_name
        self.ssh_conn_id = ssh_conn_id
        self.deferrable = deferrable
        self.poll_interval = poll_interval
        self.partition = partition
        self.run_script = run_script
        self.launcher_fallback_env = dict(launcher_fallback_env) if launcher_fallback_env is not None else None
        self.launcher_dirs = list(launcher_dirs)
        self.outage_timeout = outage_timeout
        self.time_limit_minutes = time_limit_minutes
        self.log_tail_lines = log_tail_lines
        self.progress_log_interval_s = progress_log_interval_s
        self.progress_log_every_steps = progress_log_every_steps
        self._job_id: str | None = None
        self._hook: SlurmHook | None = None

    # --------------------------------------------------------------------------- helpers

    @property
    def hook(self) -> SlurmHook:
        if self._hook is None:
            from ultracluster.hooks.slurm import SlurmHook

            self._hook = SlurmHook(ssh_conn_id=self.ssh_conn_id, head_node=self.head_node)
        return self._hook

    def _log_path(self, job_id: str) -> str:
        from ultracluster import remote_commands

        return remote_commands.job_file(self.job_dir, job_id, "out")

    def _output_root(self) -> str:
        return self.job_env.get("OUTPUT_ROOT") or self.job_dir

    def _validate(self) -> None:
        """Bad input fails here, before anything is submitted."""
        if not isinstance(self.head_node, Mapping):
            raise ValueError(f"head_node must be the dict wait_for_fleet returns, got {type(self.head_node).__name__}")
        self.num_nodes = node_count(self.num_nodes)
        if resume_attempts(self.auto_resume_attempts) and not self.head_node.get("cluster_name"):
            raise ValueError("auto_resume_attempts needs head_node['cluster_name'] (wait_for_fleet's XCom)")
        if not posixpath.isabs(self.job_dir):
            raise ValueError(f"job_dir must be an absolute path on shared storage, got {self.job_dir!r}")
        if not isinstance(self.extra_job_env, Mapping):
            raise ValueError(f"extra_job_env must be a mapping, got {type(self.extra_job_env).__name__}")
        # The contract's variables win: extra_job_env only adds knobs.
        merged = {**self.extra_job_env, **self.job_env}
        self.job_env = {str(k): _env_value(v) for k, v in merged.items()}
        self.job_env.setdefault("OUTPUT_ROOT", self.job_dir)
        # Building the command validates env names and values without running anything.
        self._sbatch_args("validate", "validate")
        if self.training_files_dir is not None:
            script = os.path.join(self.training_files_dir, self.run_script)
            if not os.path.isfile(script):
                raise ValueError(f"Run script {script} not found (training_files_dir={self.training_files_dir!r})")

    def _slurm_job_name(self, context: Context) -> str:
        from ultracluster import remote_commands

        ti = context["ti"]
        return remote_commands.slurm_job_name(
            ti.dag_id, ti.run_id, ti.task_id, getattr(ti, "map_index", -1), label=self.job_name
        )

    def _sbatch_args(self, job_name: str, run_id: str, job_env: Mapping[str, str] | None = None) -> dict[str, Any]:
        from ultracluster import remote_commands

        args = dict(
            job_dir=self.job_dir,
            script_path=posixpath.join(self.job_dir, self.run_script),
            num_nodes=self.num_nodes,
            job_name=job_name,
            comment=f"ultracluster run_id={run_id}",
            job_env=self.job_env if job_env is None else job_env,
            launcher=self.launcher,
            launcher_dirs=self._launcher_dirs(),
            launcher_fallback_env=self.launcher_fallback_env,
            partition=self.partition or self.head_node.get("partition"),
            time_limit_minutes=self.time_limit_minutes,
        )
        remote_commands.sbatch(**args)
        return args

    # ----------------------------------------------------------------------- reattach/submit

    def copy_training_files(self) -> None:
        """Copy include/training into the job directory (temp name + rename: safe to repeat)."""
        from ultracluster import remote_commands

        head_node_hook = self.hook.head_node_hook
        head_node_hook.check(remote_commands.make_dirs(self.job_dir, self._output_root()))
        if self.training_files_dir is None:
            return
        for entry in sorted(os.listdir(self.training_files_dir)):
            local = os.path.join(self.training_files_dir, entry)
            if not os.path.isfile(local) or entry.startswith("."):
                continue
            mode = 0o755 if entry.endswith((".sh", ".py")) else 0o644
            head_node_hook.put_file(local, posixpath.join(self.job_dir, entry), mode=mode)
        self.log.info("Copied %s to %s", self.training_files_dir, self.job_dir)

    def submit(self, context: Context, job_name: str) -> str:
        self.copy_training_files()
        job_id = self.hook.sbatch(**self._sbatch_args(job_name, context["ti"].run_id))
        self.log.info(
            "Submitted Slurm job %s (%s, %d node(s)); log %s", job_id, job_name, self.num_nodes, self._log_path(job_id)
        )
        return job_id

    # ---------------------------------------------------------------------------- execute

    def execute(self, context: Context) -> dict[str, Any]:
        self._validate()
        job_name = self._slurm_job_name(context)
        job_id = self.find_existing_job(context, job_name)
        if job_id is None and self._pending_resume(context):
            job_id = self.submit_resume(context, job_name)  # the worker died between its two records
        elif job_id is None:
            self._save_resume_record(context, {"resumes": []})  # a fresh start: no resumes behind it
            job_id = self.submit(context, job_name)
        return self._wait(context, job_id, job_name)

    def _wait(self, context: Context, job_id: str, job_name: str) -> dict[str, Any]:
        self._job_id = job_id
        self._persist_job_link(context, job_id, job_name)  # before the deferral: the link shows while it waits
        store = context.get("task_state_store")
        if store is not None:
            store.set(STATE_KEY_JOB_ID, job_id)
        # The streamed offset is only meaningful for the job it was read from.
        saved = (store.get(STATE_KEY_LOG_OFFSET) if store is not None else None) or {}
        log_offset = int(saved.get("offset", 0)) if isinstance(saved, dict) and saved.get("job_id") == job_id else 0
        trigger = self._trigger(job_id, job_name, log_offset)
        if self.deferrable:
            self.defer(trigger=trigger, method_name="execute_complete")
        # Same wait logic without a triggerer: run the trigger's loop in this worker.
        event = asyncio.run(self._first_event(trigger))
        return self.execute_complete(context, event)

    def _trigger(self, job_id: str, job_name: str, log_offset: int):
        from ultracluster.triggers.slurm import SlurmJobTrigger

        return SlurmJobTrigger(
            head_node=dict(self.head_node),
            ssh_conn_id=self.ssh_conn_id,
            job_id=job_id,
            job_dir=self.job_dir,
            job_name=job_name,
            log_path=self._log_path(job_id),
            log_offset=log_offset,
            poll_interval=self.poll_interval,
            outage_timeout=self.outage_timeout,
            progress_log_interval_s=self.progress_log_interval_s,
            progress_log_every_steps=self.progress_log_every_steps,
            budget=self._budget(),
        )

    def _budget(self) -> dict[str, Any] | None:
        if not isinstance(self.budget, Mapping) or self.budget.get("max_usd") in (None, "", "None"):
            return None
        budget = {key: self.budget.get(key) for key in ("max_usd", "usd_per_hour", "since")}
        if any(budget[key] in (None, "", "None") for key in ("usd_per_hour", "since")):
            # A guard that cannot project must not fail the training it guards: say so, run on.
            self.log.warning("Budget guard off: max_cost_usd is set but the rate or the cluster's "
                             "creation time is unknown (%s)", budget)
            return None
        return budget

    @staticmethod
    async def _first_event(trigger) -> dict[str, Any]:
        async for event in trigger.run():
            return event.payload
        raise AirflowException("Slurm job trigger ended without an event")

    def _persist_job_link(self, context: Context, job_id: str, job_name: str, **end: Any) -> None:
        """The Slurm Job link's values (docs/contracts.md, "Slurm job page")."""
        ti = context["ti"]
        head_node = self.head_node if isinstance(self.head_node, Mapping) else {}
        SlurmJobLink.persist(context, dag_id=ti.dag_id, run_id=ti.run_id, task_id=ti.task_id, job_id=job_id,
                             job_name=job_name, log_path=self._log_path(job_id),
                             output_dir=posixpath.join(self._output_root(), f"output_{job_id}"),
                             cluster_name=head_node.get("cluster_name"), **end)

    def execute_complete(self, context: Context, event: dict[str, Any]) -> dict[str, Any]:
        job_id = str(event.get("job_id"))
        self._job_id = job_id
        self._persist_job_link(context, job_id, self._slurm_job_name(context),
                               state=event.get("state") or event.get("status"))
        store = context.get("task_state_store")
        if store is not None and event.get("log_offset") is not None:
            store.set(STATE_KEY_LOG_OFFSET, {"job_id": job_id, "offset": int(event["log_offset"])})
        log_path = self._log_path(job_id)
        if event.get("status") in ("budget", "host_key_mismatch"):  # deterministic: no retry
            notify_budget_stop(context, event)  # mail/Slack when the budget guard cancelled the job
            raise AirflowFailException(str(event.get("message")))
        if event.get("status") != "success":
            from ultracluster.parsers import slurm as parse_slurm
            from ultracluster.parsers.progress import error_reasons

            message = self._failure_message(event, log_path)
            reasons = error_reasons(message)
            if reasons:   # the run script's own checks: deterministic, so no retry (nor resume)
                raise AirflowFailException(f"The job refused its input (UC_ERROR): {'; '.join(reasons)}\n{message}")
            if event.get("status") == "failed" and parse_slurm.is_node_fault(event.get("state"), event.get("reason")):
                return self.node_fault(context, event, message)
            raise AirflowException(message)
        output_dir = posixpath.join(self._output_root(), f"output_{job_id}")
        result = {
            "job_id": job_id,
            "state": event.get("state"),
            "exit_code": event.get("exit_code"),
            "output_dir": output_dir,
            "log_path": log_path,
            "results_path": event.get("results_path") or posixpath.join(output_dir, "results.json"),
            # The task's span, submission to end seen (the scaling report's idle fleet time).
            "started_at": _iso(getattr(context.get("ti"), "start_date", None)),
            "ended_at": utc_now(),
            "auto_resume": resume_summary(self._resume_record(context)),
        }
        if self.launcher:
            result["launch"] = self._launch_mode(job_id)
            result["compile_cache"] = self._compile_cache_stats(result["results_path"])
        self.log.info("Slurm job %s %s; outputs in %s", job_id, result["state"], output_dir)
        return result

    def _launcher_dirs(self) -> list[str]:
        # The training venv's bin/ first: neuron_parallel_compile is installed with neuronx-cc there.
        python = self.job_env.get("TRAINING_PYTHON") or ""
        first = [posixpath.dirname(python)] if posixpath.isabs(python) else []
        return list(dict.fromkeys([*first, *self.launcher_dirs]))

    def _failure_message(self, event: Mapping[str, Any], log_path: str) -> str:
        state = event.get("state") or event.get("status")
        parts = [f"Slurm job {event.get('job_id')} ended {state}"]
        if event.get("exit_code") is not None:
            parts.append(
                f"exit code {event['exit_code']}" + (f" (signal {event['signal']})" if event.get("signal") else "")
            )
        if event.get("reason"):
            parts.append(f"reason {event['reason']}")
        if event.get("message"):
            parts.append(str(event["message"]))
        try:
            tail = self.hook.tail_log(log_path, self.log_tail_lines).rstrip()
        except Exception as err:  # the message must still go out when the head node is gone
            tail = f"(log tail unavailable: {err})"
        return "; ".join(parts) + f"\n--- last {self.log_tail_lines} lines of {log_path} ---\n{tail or '(empty)'}"

    def on_kill(self) -> None:
        """The worker-side wait was killed: cancel the job so it stops using the cluster."""
        if self._job_id is None:
            return
        self.log.info("Task killed: scancel %s", self._job_id)
        try:
            self.hook.scancel(self._job_id)
        except Exception:
            self.log.exception("scancel %s failed", self._job_id)
