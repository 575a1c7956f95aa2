"""parallel_compile and train: one Slurm batch job on the cluster (``slurm_job.SlurmJob``), waited
for deferrably (``triggers.slurm``); after a node fault, resumed (``slurm_resume``)."""

from __future__ import annotations

import posixpath
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from ultracluster.hooks import DEFAULT_SSH_CONN_ID
from ultracluster.hooks.parallelcluster import ParallelClusterHook
from ultracluster.hooks.slurm import SlurmHook
from ultracluster.links import SlurmJobLink
from ultracluster.notifications import notify_budget_stop
from ultracluster.operators.health_gate import describe, drain_unhealthy, gate_job_env
from ultracluster.operators.slurm_job import (
    STATE_KEY_JOB_ID,
    JobSpec,
    SlurmJob,
    env_value,
)
from ultracluster.operators.slurm_resume import ResumeRecord, plan_resubmission, submit_again
from ultracluster.parsers.progress import JobLog, error_reasons
from ultracluster.run.clock import iso
from ultracluster.run.health import GATE_SCRIPT, gate_instance_type
from ultracluster.run.jobs import (
    FINAL,
    NODE_FAULT,
    REFUSED,
    SUCCEEDED,
    UNHEALTHY,
    job_outcome,
)
from ultracluster.run.lost_nodes import (
    DEFAULT_NODE_REPLACEMENTS,
    LostNodes,
    replacements,
)
from ultracluster.run.names import slurm_job_name
from ultracluster.run.plan import node_count, resume_attempts
from ultracluster.sensors.fleet import (
    STATE_KEY_LOST_NODES,
    FleetCheck,
    failure,
    ssh_port,
)
from ultracluster.triggers.fleet import ComputeFleetTrigger
from ultracluster.triggers.slurm import SlurmJobTrigger

if TYPE_CHECKING:
    from airflow.sdk import Context

DEFAULT_RUN_SCRIPT = "run_dp_bert_large_hf_pretrain_bf16_s128.sh"
# Where the Neuron apt packages (aws-neuronx-tools) put their programs.
NEURON_BIN = "/opt/aws/neuron/bin"
# Key in the task state store; renaming it breaks reattach for in-flight retries.
STATE_KEY_LOG_OFFSET = "slurm_log_offset"


class SlurmJobOperator(BaseOperator):
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
    :param auto_resume_attempts: resumes after node faults (``run.states.is_node_fault``): the task
        waits for the fleet (the wait_for_fleet trigger), then resubmits from the newest checkpoint.
        0 = off: a node fault fails the task like any other failure.
    :param pcluster_conn_id: ParallelCluster connection of an auto-resume's fleet wait.
    :param region_name: region of that cluster (None: the connection's).
    :param resume_fleet_timeout: seconds an auto-resume waits for the fleet before the task fails.
    :param node_replacements: how often a node this task's jobs lose (down after a node fault) may
        be replaced before the task fails naming it (``run.lost_nodes``); the resume's fleet wait
        applies the same rule to nodes that fail to come back. A job whose nodes EC2 had no capacity
        for never ran: it is submitted again within this rule alone, auto-resume or not.
    :param health_gate: the instance type whose devices the node health gate expects (``run.health``;
        None: no gate). The job first runs include/training/node_health.sh on every node; a node that
        fails is drained with the reason, and the job is resubmitted like after a node fault.
    """

    template_fields: Sequence[str] = (
        "head_node", "job_dir", "num_nodes", "job_env", "extra_job_env", "launcher", "training_files_dir",
        "job_name", "partition", "budget", "auto_resume_attempts", "region_name", "node_replacements",
        "health_gate",
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
        node_replacements: int | str = DEFAULT_NODE_REPLACEMENTS,
        health_gate: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
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
        self.budget = budget
        self.auto_resume_attempts = auto_resume_attempts
        self.pcluster_conn_id = pcluster_conn_id
        self.region_name = region_name
        self.resume_fleet_timeout = float(resume_fleet_timeout)
        self.node_replacements = node_replacements
        self.health_gate = health_gate
        self._running: tuple[SlurmJob, str] | None = None  # (job, id) while a worker-side wait runs
        self._hook: SlurmHook | None = None

    @property
    def hook(self) -> SlurmHook:
        if self._hook is None:
            self._hook = SlurmHook(ssh_conn_id=self.ssh_conn_id, head_node=self.head_node)
        return self._hook

    # ------------------------------------------------------------------------------- the job
    def job(self, context: Context) -> SlurmJob:
        """This task's job, its arguments checked: bad input fails here, before anything is submitted."""
        if not isinstance(self.head_node, Mapping):
            raise ValueError(f"head_node must be the dict wait_for_fleet returns, got {type(self.head_node).__name__}")
        if resume_attempts(self.auto_resume_attempts) and not self.head_node.get("cluster_name"):
            raise ValueError("auto_resume_attempts needs head_node['cluster_name'] (wait_for_fleet's XCom)")
        if not posixpath.isabs(self.job_dir):
            raise ValueError(f"job_dir must be an absolute path on shared storage, got {self.job_dir!r}")
        replacements(self.node_replacements)
        if not isinstance(self.extra_job_env, Mapping):
            raise ValueError(f"extra_job_env must be a mapping, got {type(self.extra_job_env).__name__}")
        gate = gate_instance_type(self.health_gate)
        if self.training_files_dir is not None:
            for name in (self.run_script, *([GATE_SCRIPT] if gate else [])):
                script = posixpath.join(self.training_files_dir, name)
                if not posixpath.isfile(script):
                    raise ValueError(f"{script} not found (training_files_dir={self.training_files_dir!r})")
        # The contract's variables win: extra_job_env only adds knobs.
        env = {str(k): env_value(v) for k, v in {**self.extra_job_env, **self.job_env, **gate_job_env(gate)}.items()}
        env.setdefault("OUTPUT_ROOT", self.job_dir)
        ti = context["ti"]
        spec = JobSpec(
            name=slurm_job_name(ti.dag_id, ti.run_id, ti.task_id, getattr(ti, "map_index", -1), label=self.job_name),
            job_dir=self.job_dir, run_script=self.run_script, num_nodes=node_count(self.num_nodes), env=env,
            launcher=self.launcher, launcher_dirs=self.launcher_dirs, launcher_fallback_env=self.launcher_fallback_env,
            partition=self.partition or self.head_node.get("partition"), time_limit_minutes=self.time_limit_minutes,
            training_files_dir=self.training_files_dir, health_gate=gate)
        spec.sbatch_args("validate")  # checks names and values without running anything
        return SlurmJob(self.hook, spec, self.log)

    def execute(self, context: Context) -> dict[str, Any]:
        job = self.job(context)
        store, run_id = context.get("task_state_store"), context["ti"].run_id
        record = ResumeRecord(store)
        job_id = job.find(store.get(STATE_KEY_JOB_ID) if store is not None else None, run_id)
        if job_id is None and (record.pending or record.relaunch_pending):
            job_id = submit_again(job, record, run_id, resume_attempts(self.auto_resume_attempts))
        elif job_id is None:
            record.reset()
            job_id = job.submit(run_id)
        return self._wait(context, job, job_id)

    # ------------------------------------------------------------------------------- the wait
    def _wait(self, context: Context, job: SlurmJob, job_id: str) -> dict[str, Any]:
        self._persist_link(context, job, job_id)  # before the deferral: the link shows while it waits
        store = context.get("task_state_store")
        if store is not None:
            store.set(STATE_KEY_JOB_ID, job_id)
        # The streamed offset is only meaningful for the job it was read from.
        saved = (store.get(STATE_KEY_LOG_OFFSET) if store is not None else None) or {}
        offset = int(saved.get("offset", 0)) if isinstance(saved, dict) and saved.get("job_id") == job_id else 0
        budget = self._budget()
        if self.deferrable:
            self.defer(trigger=SlurmJobTrigger(
                head_node=dict(self.head_node), ssh_conn_id=self.ssh_conn_id, job_id=job_id, job_dir=self.job_dir,
                job_name=job.spec.name, log_path=job.log_path(job_id), log_offset=offset,
                poll_interval=self.poll_interval, outage_timeout=self.outage_timeout,
                progress_log_interval_s=self.progress_log_interval_s,
                progress_log_every_steps=self.progress_log_every_steps, budget=budget,
                task_end=self._task_end(context, job, job_id)),
                method_name="execute_complete")
        job_log = JobLog(self.log, path=job.log_path(job_id), offset=offset, interval_s=self.progress_log_interval_s,
                         every_steps=self.progress_log_every_steps, budget=budget)
        self._running = (job, job_id)
        try:
            event = job.wait(job_id, job_log, interval_s=self.poll_interval)
        finally:
            self._running = None
        return self.execute_complete(context, event)

    def _task_end(self, context: Context, job: SlurmJob, job_id: str) -> dict[str, Any]:
        """The worker's part of the return value (``SlurmJob.task_end``): the trigger ends the task
        when the job completes; any other end resumes ``execute_complete``."""
        # started_at: the task's span, submission to end seen (the scaling report's idle fleet time).
        return job.task_end(job_id, started_at=iso(getattr(context.get("ti"), "start_date", None)),
                            auto_resume=ResumeRecord(context.get("task_state_store")).summary(),
                            link_key=SlurmJobLink.key, link=self._link_values(context, job, job_id))

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

    def _link_values(self, context: Context, job: SlurmJob, job_id: str) -> dict[str, Any]:
        """The Slurm Job link's values (docs/contracts.md, "Slurm job page"), without the end ``state``."""
        ti = context["ti"]
        return {"dag_id": ti.dag_id, "run_id": ti.run_id, "task_id": ti.task_id, "job_id": job_id,
                "job_name": job.spec.name, "log_path": job.log_path(job_id), "output_dir": job.output_dir(job_id),
                "cluster_name": self.head_node.get("cluster_name")}

    def _persist_link(self, context: Context, job: SlurmJob, job_id: str, **end: Any) -> None:
        SlurmJobLink.persist(context, **self._link_values(context, job, job_id), **end)

    def execute_complete(self, context: Context, event: dict[str, Any]) -> dict[str, Any]:
        job = self.job(context)
        job_id = str(event.get("job_id"))
        self._persist_link(context, job, job_id, state=event.get("state") or event.get("reason"))
        store = context.get("task_state_store")
        if store is not None and event.get("log_offset") is not None:
            store.set(STATE_KEY_LOG_OFFSET, {"job_id": job_id, "offset": int(event["log_offset"])})
        gated = job.spec.health_gate is not None
        outcome, message = job_outcome(event, health_gate=gated), ""
        if outcome not in (SUCCEEDED, FINAL):  # the log's tail says more, and holds any UC_ERROR
            message = job.failure_message(event, self.log_tail_lines)
            outcome = job_outcome(event, error_reasons(message), health_gate=gated)
        if outcome == FINAL:
            notify_budget_stop(context, event)  # mail/Slack when the budget guard cancelled the job
            raise AirflowFailException(str(event.get("message")))
        if outcome == REFUSED:  # the run script's own checks: deterministic, so no retry (nor resume)
            raise AirflowFailException(f"The job refused its input (UC_ERROR): "
                                       f"{'; '.join(error_reasons(message))}\n{message}")
        if outcome == UNHEALTHY:  # drained first: the resubmission must not land on the same nodes
            drained = drain_unhealthy(self.hook, job.spec.job_dir, job_id, job.spec.health_gate, self.log, message)
            return self._node_fault(context, job, event, f"The node health gate failed in job {job_id}: "
                                    f"{describe(drained)}; drained.", drained=drained)
        if outcome == NODE_FAULT:
            return self._node_fault(context, job, event, message)
        if outcome != SUCCEEDED:
            raise AirflowException(message)
        # The same return value as SlurmJobTrigger's when it ends the task itself.
        return job.succeeded(event, self._task_end(context, job, job_id))

    # ------------------------------------------------------------------------------ auto-resume
    def _lost(self, context: Context, ledger: dict[str, Any] | None = None) -> LostNodes:
        """The task's lost-node ledger: ``ledger`` (an event's) saved first when given."""
        store = context.get("task_state_store")
        if store is not None and ledger is not None:
            store.set(STATE_KEY_LOST_NODES, ledger)
        stored = ledger if store is None else store.get(STATE_KEY_LOST_NODES)
        return LostNodes.from_dict(stored, replacements(self.node_replacements))

    def _node_fault(self, context: Context, job: SlurmJob, event: dict[str, Any], message: str,
                    drained: Mapping[str, str] | None = None) -> dict[str, Any]:
        """A job ended in a node fault, or the health gate drained nodes (``drained``: ``{node: reason}``):
        count its lost nodes, then resume once the fleet is healthy (ParallelCluster replaces them), or
        fail naming why not."""
        lost = self._lost(context)
        # The gate names the nodes it drained; after any other fault, sinfo says which nodes failed.
        failed = dict(drained) if drained else job.failed_nodes(event)
        if newly := lost.fault(str(event.get("job_id")), failed):
            self.log.warning("Job %s lost node(s) %s (losses/allowed: %s)", event.get("job_id"),
                             "; ".join(f"{n} ({lost.reasons[n]})" for n in newly), lost.describe())
        self._lost(context, lost.to_dict())
        if lost.past:
            raise AirflowFailException(f"{lost.failure()}\n{message}")
        record = ResumeRecord(context.get("task_state_store"))
        record.data["nodes_lost"] = dict(lost.counts)
        plan_resubmission(record, event, failed, drained, resume_attempts(self.auto_resume_attempts), message,
                          lost, self.log)
        return self._await_fleet(context, job, lost)

    def _await_fleet(self, context: Context, job: SlurmJob, lost: LostNodes) -> dict[str, Any]:
        """Wait for the fleet (the lost nodes replaced), then ``resume_after_fleet``."""
        head = self.head_node
        fleet = dict(cluster_name=head["cluster_name"], num_nodes=job.spec.num_nodes, partition=job.spec.partition,
                     ssh_conn_id=self.ssh_conn_id, ssh_port=ssh_port(self.ssh_conn_id),
                     # The dead node is down while it is replaced (minutes on AWS): that is what is waited for.
                     stuck_after_s=self.resume_fleet_timeout, keep_host_key=True)
        if self.deferrable:
            # The key wait_for_fleet pinned: a cluster with another one is not resumed on.
            self.defer(trigger=ComputeFleetTrigger(
                **fleet, pcluster_conn_id=self.pcluster_conn_id, host_key=head.get("host_key"),
                poke_interval=self.poll_interval, region_name=self.region_name or None,
                node_replacements=lost.limit, lost_nodes=lost.to_dict()),
                method_name="resume_after_fleet", timeout=timedelta(seconds=self.resume_fleet_timeout))
        check = FleetCheck(**fleet, pcluster_hook=ParallelClusterHook(self.pcluster_conn_id,
                                                                      region_name=self.region_name or None),
                           pin={"host_key": head.get("host_key")}, lost=lost)
        try:
            check.wait(self.resume_fleet_timeout, self.poll_interval, self.log)
        finally:
            self._lost(context, lost.to_dict())
        return self.resume_after_fleet(context, {"status": "success", "lost_nodes": lost.to_dict()})

    def resume_after_fleet(self, context: Context, event: dict[str, Any]) -> dict[str, Any]:
        """The fleet is healthy again: resubmit (or reattach to a resume already submitted)."""
        lost = self._lost(context, event.get("lost_nodes"))
        if event.get("status") != "success":
            raise failure(str(event.get("reason")), f"Auto-resume: the fleet did not recover: {event.get('message')}")
        job = self.job(context)
        store, run_id = context.get("task_state_store"), context["ti"].run_id
        record = ResumeRecord(store)
        record.data["nodes_lost"] = dict(lost.counts)
        job_id = job.find(store.get(STATE_KEY_JOB_ID) if store is not None else None, run_id) or submit_again(
            job, record, run_id, resume_attempts(self.auto_resume_attempts))
        return self._wait(context, job, job_id)

    def on_kill(self) -> None:
        """The worker-side wait was killed: cancel the job so it stops using the cluster."""
        if self._running is None:
            return
        job, job_id = self._running
        self.log.info("Task killed: scancel %s", job_id)
        try:
            job.cancel(job_id)
        except Exception:
            self.log.exception("scancel %s failed", job_id)
